//! Mock Kubernetes API servers for every wire-level test, in the style of
//! kube-rs controller-rs's `fixtures.rs`: a `kube::Client` whose requests
//! the test sees, checks and answers.
//!
//! * [`mock_client`] gives a client and its [`ApiServerVerifier`]: a test
//!   takes each request in the order its scenario expects
//!   ([`ApiServerVerifier::expect`]), asserts on it and answers it
//!   ([`Call::respond`]); or it answers every request from state of its own
//!   ([`ApiServerVerifier::serve`]).
//! * [`ApiServer`] is a stateful in-memory model of the API server
//!   (objects, resourceVersions, patches, watches), for long-running
//!   clients such as the sidecar's publisher and pod watch.

mod server;

use std::collections::BTreeMap;
use std::ops::Deref;

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tower_test::mock::{self, Handle, SendResponse};

pub use server::{ApiServer, pods};
pub use server::{Recorded, Snapshot};

/// A request as the API server received it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiRequest {
    pub method: String,
    /// Path and query, as sent.
    pub uri: String,
    pub path: String,
    /// The query's parameters, percent-decoded.
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// The body as JSON; `Null` when there is none.
    pub body: Value,
}

impl ApiRequest {
    /// Reads the whole request. A body that is not JSON fails the test: the
    /// clients under test send JSON only (server-side apply included).
    pub async fn read(request: Request<Body>) -> ApiRequest {
        let method = request.method().to_string();
        let uri = request.uri().to_string();
        let path = request.uri().path().to_string();
        let query = parse_query(request.uri().query().unwrap_or_default());
        let content_type = request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.to_str().expect("content type is text").to_string());
        let bytes = request.into_body().collect_bytes().await.expect("request body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("request body is JSON")
        };
        ApiRequest {
            method,
            uri,
            path,
            query,
            content_type,
            body,
        }
    }

    /// The query as sent, still percent-encoded.
    pub fn raw_query(&self) -> &str {
        self.uri.split_once('?').map_or("", |(_, query)| query)
    }

    /// A watch (`watch=true`), as opposed to a get or a list.
    pub fn is_watch(&self) -> bool {
        self.query.get("watch").is_some_and(|w| w == "true" || w == "1")
    }
}

/// A request waiting for its answer; derefs to the [`ApiRequest`].
pub struct Call {
    request: ApiRequest,
    reply: SendResponse<Response<Body>>,
}

impl Deref for Call {
    type Target = ApiRequest;

    fn deref(&self) -> &ApiRequest {
        &self.request
    }
}

impl Call {
    /// Answers with `status` and `body` as JSON.
    pub fn respond(self, status: u16, body: &Value) {
        self.reply.send_response(json_response(status, body));
    }
}

fn json_response(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(body).expect("JSON")))
        .expect("a response")
}

/// A client (defaulting to `namespace`) whose every request goes to the
/// returned verifier.
pub fn mock_client(namespace: &str) -> (kube::Client, ApiServerVerifier) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, namespace), ApiServerVerifier(handle))
}

/// The server side of a [`mock_client`].
pub struct ApiServerVerifier(Handle<Request<Body>, Response<Body>>);

impl ApiServerVerifier {
    /// The next request; `None` once every clone of the client is dropped.
    pub async fn next(&mut self) -> Option<Call> {
        let (request, reply) = self.0.next_request().await?;
        Some(Call {
            request: ApiRequest::read(request).await,
            reply,
        })
    }

    /// The next request, which the scenario expects: fails the test with
    /// `missing` when the client is dropped without making it.
    pub async fn expect(&mut self, missing: &str) -> Call {
        self.next().await.unwrap_or_else(|| panic!("{missing}"))
    }

    /// Answers every request with `answer(request)` (status and JSON body)
    /// until every clone of the client is dropped; a request it answers
    /// `None` is held open unanswered, as a watch that sees no change.
    pub fn serve(
        mut self,
        mut answer: impl FnMut(&ApiRequest) -> Option<(u16, Value)> + Send + 'static,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(call) = self.next().await {
                match answer(&call.request) {
                    Some((status, body)) => call.respond(status, &body),
                    None => held.push(call),
                }
            }
        })
    }
}

/// A `Status` failure as the API server sends it.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(byte) => {
                        out.push(byte);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
