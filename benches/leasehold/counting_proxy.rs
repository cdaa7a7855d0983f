//! An HTTP proxy in front of the API server that counts the Lease requests
//! of one client. Each candidate of the election comparison (a leasehold
//! sidecar process or a kube-scheduler) reaches the cluster through a proxy
//! of its own, over plain HTTP on loopback, and the proxy forwards every
//! request with the harness's credentials (`kube::Client::send`). Requests
//! for `coordination.k8s.io` Leases are counted by their RBAC verb, a watch
//! once, when it is opened; the rest pass uncounted (a kube-scheduler's
//! informers). The API server's own metrics cannot tell clients apart
//! (`apiserver_request_total` has no client label), hence the proxy.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use kube::Client;
use tokio_util::task::AbortOnDropHandle;

/// Lease requests by verb (`get`, `list`, `watch`, `create`, `update`, …).
pub type Counts = BTreeMap<&'static str, u64>;

pub struct CountingProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    counts: Arc<Mutex<Counts>>,
    _serving: AbortOnDropHandle<()>,
}

impl CountingProxy {
    pub async fn start(client: Client) -> CountingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let counts = Arc::new(Mutex::new(Counts::new()));
        let counted = counts.clone();
        let app =
            axum::Router::new().fallback(move |request: Request| forward(client.clone(), counted.clone(), request));
        let serving = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        CountingProxy {
            url,
            counts,
            _serving: AbortOnDropHandle::new(serving),
        }
    }

    /// The Lease requests counted since the last call; counting starts over.
    pub fn take(&self) -> Counts {
        std::mem::take(&mut *self.counts.lock().unwrap())
    }

    /// Writes a kubeconfig that reaches the cluster through this proxy, its
    /// default namespace `namespace`.
    pub fn write_kubeconfig(&self, path: &Path, namespace: &str) {
        let text = format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: proxy, cluster: {{server: \"{}\"}}}}]\n\
             users: [{{name: proxy, user: {{}}}}]\n\
             contexts: [{{name: proxy, context: {{cluster: proxy, user: proxy, namespace: {namespace}}}}}]\n\
             current-context: proxy\n",
            self.url
        );
        std::fs::write(path, text).expect("writing the proxy's kubeconfig");
    }
}

async fn forward(client: Client, counts: Arc<Mutex<Counts>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let watch = parts
        .uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    if let Some(request) = leasehold::rbac::request_attributes(parts.method.as_str(), parts.uri.path(), watch)
        && request.api_group == "coordination.k8s.io"
        && request.resource == "leases"
    {
        *counts.lock().unwrap().entry(request.verb).or_default() += 1;
    }
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return (http::StatusCode::BAD_REQUEST, "unreadable request body").into_response();
    };
    let mut out = http::Request::builder().method(parts.method).uri(parts.uri);
    for (name, value) in &parts.headers {
        if name != http::header::HOST {
            out = out.header(name, value);
        }
    }
    let out = out
        .body(kube::client::Body::from(body.to_vec()))
        .expect("the same request");
    match client.send(out).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => (http::StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
