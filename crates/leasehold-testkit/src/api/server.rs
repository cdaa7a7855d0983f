//! A stateful in-memory model of the Kubernetes API server, for wire-level
//! tests of long-running clients: it answers from state instead of a
//! script, and records every request.
//!
//! What it models, and the API server behaviour each part relies on:
//! * Objects by collection (`/api/v1/namespaces/prod/pods`, any group), with
//!   a global, increasing `resourceVersion`; GET, list, POST, PATCH, and PUT
//!   guarded by the body's `resourceVersion`.
//! * PATCH with `metadata.resourceVersion` in the body is a precondition: a
//!   different current version answers 409 Conflict with the API server's
//!   "the object has been modified" message (the generic registry's Update,
//!   `staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go`,
//!   `OptimisticLockErrorMsg`; the patch handler keeps the body's
//!   resourceVersion as the precondition, kubernetes/kubernetes#63104).
//! * `application/merge-patch+json` is RFC 7386; in
//!   `application/strategic-merge-patch+json` lists named `conditions` merge
//!   by their `type` (`PodStatus.Conditions` is `patchStrategy=merge,
//!   patchMergeKey=type` in `staging/src/k8s.io/api/core/v1/types.go`; the
//!   OpenAPI-generated `k8s_openapi::api::core::v1::PodStatus::merge_from`
//!   merges them as a map keyed by `type` too), other lists are replaced.
//! * A PATCH of `…/status` changes only `status`; a PATCH of the object
//!   itself leaves `status` alone (the pod strategies' `PrepareForUpdate`,
//!   `pkg/registry/core/pod/strategy.go`). A patch that changes nothing
//!   keeps the resourceVersion and sends no watch event (GuaranteedUpdate
//!   skips writing an unchanged object).
//! * Watches (`watch=true&resourceVersion=N`) replay every change after N
//!   and then stream live ones; with a label or field selector an object
//!   that starts matching arrives as ADDED, one that stops matching as
//!   DELETED (`convertToWatchEvent` in
//!   `staging/src/k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go`).
//! * [`ApiServer::set_down`]: every call fails as a refused connection and
//!   open watches end, as when the API server is unreachable;
//!   [`ApiServer::fail_when`]: chosen requests answer 500.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

use super::ApiRequest;
use super::status as status_json;

type Body = BoxBody<Bytes, Infallible>;

/// Whether a request is allowed: (method, path, is a watch).
pub(crate) type Authorizer = fn(&str, &str, bool) -> bool;

/// One request as the server received it.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub method: String,
    /// Path and query, as sent.
    pub uri: String,
    pub content_type: String,
    pub body: Value,
    /// The status answered (0 when the server was down).
    pub status: u16,
}

impl Recorded {
    pub fn path(&self) -> &str {
        self.uri.split('?').next().unwrap_or_default()
    }
}

struct Change {
    rv: u64,
    collection: String,
    previous: Option<Value>,
    current: Option<Value>,
}

struct Watch {
    collection: String,
    labels: String,
    fields: String,
    events: mpsc::UnboundedSender<Value>,
}

type Observer = Box<dyn FnMut(&Snapshot<'_>) + Send>;
type Failing = Box<dyn Fn(&str, &str) -> bool + Send>;

/// The state an observer sees after each change.
pub struct Snapshot<'a> {
    pub objects: &'a BTreeMap<String, BTreeMap<String, Value>>,
    pub down: bool,
}

impl Snapshot<'_> {
    pub fn collection(&self, collection: &str) -> impl Iterator<Item = &Value> {
        self.objects.get(collection).into_iter().flat_map(|c| c.values())
    }
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    rv: u64,
    history: Vec<Change>,
    watches: Vec<Watch>,
    down: bool,
    requests: Vec<Recorded>,
    forbidden: Vec<String>,
    observers: Vec<Observer>,
    failing: Option<Failing>,
}

/// The model; cheap to clone, clones share the state.
#[derive(Clone)]
pub struct ApiServer {
    state: Arc<Mutex<State>>,
    authorize: Option<Authorizer>,
    request_seen: Arc<Notify>,
}

impl ApiServer {
    /// A server that checks every request with `authorize` (an RBAC Role):
    /// a denied request answers 403 and is listed by [`ApiServer::forbidden`].
    pub fn new(authorize: Option<Authorizer>) -> Self {
        ApiServer {
            state: Arc::default(),
            authorize,
            request_seen: Arc::default(),
        }
    }

    /// A client talking to this server, defaulting to `namespace`.
    pub fn client(&self, namespace: &str) -> kube::Client {
        let server = self.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let server = server.clone();
            async move { server.serve(request).await }
        });
        kube::Client::new(service, namespace)
    }

    /// Serves this model over plain HTTP on a free loopback port, for clients
    /// in other processes (a kubeconfig with `server: http://ADDR` and no
    /// credentials). Answers as [`ApiServer::client`]'s requests are answered;
    /// the listener runs on the calling tokio runtime.
    pub async fn serve_http(&self) -> std::net::SocketAddr {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("a loopback port for the API server model");
        let addr = listener.local_addr().expect("the listener's address");
        let server = self.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let server = server.clone();
                let service = hyper_util::service::TowerToHyperService::new(tower::service_fn(move |request| {
                    forward(server.clone(), request)
                }));
                tokio::spawn(async move {
                    // A client closing its connection (a watch it dropped) ends it; nothing to report.
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        addr
    }

    /// Stores `object` in `collection` as a client create would.
    pub fn insert(&self, collection: &str, mut object: Value) {
        let mut state = self.lock();
        let name = object["metadata"]["name"].as_str().expect("metadata.name").to_string();
        state.rv += 1;
        object["metadata"]["resourceVersion"] = json!(state.rv.to_string());
        let previous = state
            .objects
            .entry(collection.to_string())
            .or_default()
            .insert(name, object.clone());
        state.record_change(collection, previous, Some(object));
    }

    /// Removes `name` from `collection` as a completed delete would.
    pub fn delete(&self, collection: &str, name: &str) {
        let mut state = self.lock();
        let previous = state.objects.get_mut(collection).and_then(|c| c.remove(name));
        if previous.is_some() {
            state.rv += 1;
            state.record_change(collection, previous, None);
        }
    }

    pub fn get(&self, collection: &str, name: &str) -> Option<Value> {
        self.lock().objects.get(collection).and_then(|c| c.get(name)).cloned()
    }

    /// Every call fails while down; going down ends every open watch.
    pub fn set_down(&self, down: bool) {
        let mut state = self.lock();
        state.down = down;
        if down {
            state.watches.clear();
        }
        state.notify_observers();
    }

    /// Requests for which `fails(method, path)` holds answer 500, as an
    /// API server that is up but cannot serve them; `None` heals.
    pub fn fail_when(&self, fails: Option<fn(&str, &str) -> bool>) {
        self.lock().failing = fails.map(|f| Box::new(f) as Failing);
    }

    /// Called after every change (and every up/down switch).
    pub fn observe(&self, observer: impl FnMut(&Snapshot<'_>) + Send + 'static) {
        let mut state = self.lock();
        state.observers.push(Box::new(observer));
        state.notify_observers();
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// Waits until `count` requests have arrived in total.
    pub async fn wait_for_requests(&self, count: usize) -> Vec<Recorded> {
        loop {
            let seen = self.request_seen.notified();
            let requests = self.requests();
            if requests.len() >= count {
                return requests;
            }
            seen.await;
        }
    }

    /// Requests the authorizer refused, as "METHOD uri".
    pub fn forbidden(&self) -> Vec<String> {
        self.lock().forbidden.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn serve(&self, request: Request<kube::client::Body>) -> Result<Response<Body>, std::io::Error> {
        let request = ApiRequest::read(request).await;
        let (method, path) = (request.method.as_str(), request.path.as_str());
        let watch = request.is_watch();
        let content_type = request.content_type.clone().unwrap_or_default();
        let mut recorded = Recorded {
            method: method.to_string(),
            uri: request.uri.clone(),
            content_type: content_type.clone(),
            body: request.body.clone(),
            status: 0,
        };
        let answer = {
            let mut state = self.lock();
            if state.down {
                state.requests.push(recorded);
                drop(state);
                self.request_seen.notify_waiters();
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "the API server is down",
                ));
            }
            let answer = if self.authorize.is_some_and(|allowed| !allowed(method, path, watch)) {
                state.forbidden.push(format!("{method} {}", request.uri));
                Answer::Json(StatusCode::FORBIDDEN, status_json(403, "Forbidden", "not in the Role"))
            } else if state.failing.as_ref().is_some_and(|fails| fails(method, path)) {
                Answer::Json(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    status_json(500, "InternalError", "injected failure"),
                )
            } else {
                state.handle(method, path, &request.query, &content_type, request.body.clone(), watch)
            };
            recorded.status = answer.status().as_u16();
            state.requests.push(recorded);
            answer
        };
        self.request_seen.notify_waiters();
        Ok(answer.into_response())
    }
}

enum Answer {
    Json(StatusCode, Value),
    Stream(mpsc::UnboundedReceiver<Value>),
}

impl Answer {
    fn status(&self) -> StatusCode {
        match self {
            Answer::Json(status, _) => *status,
            Answer::Stream(_) => StatusCode::OK,
        }
    }

    fn into_response(self) -> Response<Body> {
        match self {
            Answer::Json(status, value) => {
                let bytes = Bytes::from(serde_json::to_vec(&value).unwrap());
                let mut response = Response::new(Full::new(bytes).boxed());
                *response.status_mut() = status;
                response
            }
            Answer::Stream(events) => {
                let lines = futures::stream::unfold(events, |mut events| async move {
                    let event = events.recv().await?;
                    let mut line = serde_json::to_vec(&event).unwrap();
                    line.push(b'\n');
                    Some((Ok::<_, Infallible>(Frame::data(Bytes::from(line))), events))
                });
                Response::new(BodyExt::boxed(StreamBody::new(lines)))
            }
        }
    }
}

/// Where a path points: the collection, and the object and subresource if any.
fn route(path: &str) -> Option<(String, Option<String>, Option<String>)> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let at = segments.iter().position(|s| *s == "namespaces")?;
    let resource = at + 2;
    if segments.len() <= resource {
        return None;
    }
    let collection = format!("/{}", segments[..=resource].join("/"));
    Some((
        collection,
        segments.get(resource + 1).map(|s| s.to_string()),
        segments.get(resource + 2).map(|s| s.to_string()),
    ))
}

impl State {
    fn handle(
        &mut self,
        method: &str,
        path: &str,
        query: &BTreeMap<String, String>,
        content_type: &str,
        body: Value,
        watch: bool,
    ) -> Answer {
        let Some((collection, name, subresource)) = route(path) else {
            return Answer::Json(StatusCode::NOT_FOUND, status_json(404, "NotFound", path));
        };
        let labels = query.get("labelSelector").cloned().unwrap_or_default();
        let fields = query.get("fieldSelector").cloned().unwrap_or_default();
        match (method, name) {
            ("GET", None) if watch => {
                let since: u64 = query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
                let (tx, rx) = mpsc::unbounded_channel();
                for change in self
                    .history
                    .iter()
                    .filter(|c| c.rv > since && c.collection == collection)
                {
                    if let Some(event) = watch_event(change, &labels, &fields) {
                        let _ = tx.send(event);
                    }
                }
                self.watches.push(Watch {
                    collection,
                    labels,
                    fields,
                    events: tx,
                });
                Answer::Stream(rx)
            }
            ("GET", None) => {
                let items: Vec<Value> = self
                    .objects
                    .get(&collection)
                    .into_iter()
                    .flat_map(|c| c.values())
                    .filter(|o| matches(o, &labels, &fields))
                    .cloned()
                    .collect();
                Answer::Json(
                    StatusCode::OK,
                    json!({"kind": "List", "apiVersion": "v1",
                           "metadata": {"resourceVersion": self.rv.to_string()}, "items": items}),
                )
            }
            ("GET", Some(name)) => match self.objects.get(&collection).and_then(|c| c.get(&name)) {
                Some(object) => Answer::Json(StatusCode::OK, object.clone()),
                None => Answer::Json(StatusCode::NOT_FOUND, status_json(404, "NotFound", &name)),
            },
            ("POST", None) => {
                let mut object = body;
                let name = match object["metadata"]["name"].as_str() {
                    Some(name) => name.to_string(),
                    None => format!(
                        "{}{}",
                        object["metadata"]["generateName"].as_str().unwrap_or("object-"),
                        self.rv + 1
                    ),
                };
                if self.objects.get(&collection).is_some_and(|c| c.contains_key(&name)) {
                    return Answer::Json(StatusCode::CONFLICT, status_json(409, "AlreadyExists", &name));
                }
                object["metadata"]["name"] = json!(name);
                self.rv += 1;
                object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                self.objects
                    .entry(collection.clone())
                    .or_default()
                    .insert(name, object.clone());
                self.record_change(&collection, None, Some(object.clone()));
                Answer::Json(StatusCode::CREATED, object)
            }
            ("PATCH", Some(name)) => self.patch(&collection, &name, subresource.as_deref(), content_type, body),
            ("PUT", Some(name)) if subresource.is_none() => self.replace(&collection, &name, body),
            _ => Answer::Json(
                StatusCode::METHOD_NOT_ALLOWED,
                status_json(405, "MethodNotAllowed", method),
            ),
        }
    }

    /// An update (PUT): the body's `metadata.resourceVersion` is required
    /// and must be the current one (a Lease's strategy allows no
    /// unconditional update), else 422 or 409 as the API server answers.
    fn replace(&mut self, collection: &str, name: &str, body: Value) -> Answer {
        let Some(current) = self.objects.get(collection).and_then(|c| c.get(name)).cloned() else {
            return Answer::Json(StatusCode::NOT_FOUND, status_json(404, "NotFound", name));
        };
        match body["metadata"]["resourceVersion"].as_str() {
            None => {
                let message = "metadata.resourceVersion: Invalid value: 0: must be specified for an update";
                return Answer::Json(StatusCode::UNPROCESSABLE_ENTITY, status_json(422, "Invalid", message));
            }
            Some(wanted) if Some(wanted) != current["metadata"]["resourceVersion"].as_str() => return conflict(name),
            Some(_) => {}
        }
        self.commit(collection, name, current, body)
    }

    /// Stores `updated` over `current` at the next resourceVersion.
    fn commit(&mut self, collection: &str, name: &str, current: Value, mut updated: Value) -> Answer {
        self.rv += 1;
        updated["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.objects
            .entry(collection.to_string())
            .or_default()
            .insert(name.to_string(), updated.clone());
        self.record_change(collection, Some(current), Some(updated.clone()));
        Answer::Json(StatusCode::OK, updated)
    }

    fn patch(
        &mut self,
        collection: &str,
        name: &str,
        subresource: Option<&str>,
        content_type: &str,
        patch: Value,
    ) -> Answer {
        let Some(current) = self.objects.get(collection).and_then(|c| c.get(name)).cloned() else {
            return Answer::Json(StatusCode::NOT_FOUND, status_json(404, "NotFound", name));
        };
        let strategic = match content_type {
            "application/merge-patch+json" => false,
            "application/strategic-merge-patch+json" => true,
            other => {
                return Answer::Json(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    status_json(415, "UnsupportedMediaType", other),
                );
            }
        };
        if let Some(wanted) = patch["metadata"]["resourceVersion"].as_str()
            && Some(wanted) != current["metadata"]["resourceVersion"].as_str()
        {
            return conflict(name);
        }
        let mut patched = current.clone();
        merge(&mut patched, &patch, strategic);
        // Only the status through /status; never the status otherwise.
        let mut updated = current.clone();
        match subresource {
            Some("status") => updated["status"] = patched["status"].take(),
            Some(other) => return Answer::Json(StatusCode::NOT_FOUND, status_json(404, "NotFound", other)),
            None => {
                let status = current.get("status").cloned();
                updated = patched;
                match status {
                    Some(status) => updated["status"] = status,
                    None => {
                        if let Some(o) = updated.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
        }
        updated["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        if updated == current {
            return Answer::Json(StatusCode::OK, current);
        }
        self.commit(collection, name, current, updated)
    }

    fn record_change(&mut self, collection: &str, previous: Option<Value>, current: Option<Value>) {
        let change = Change {
            rv: self.rv,
            collection: collection.to_string(),
            previous,
            current,
        };
        self.watches.retain(|w| {
            if w.collection != change.collection {
                return true;
            }
            match watch_event(&change, &w.labels, &w.fields) {
                Some(event) => w.events.send(event).is_ok(),
                None => !w.events.is_closed(),
            }
        });
        self.history.push(change);
        self.notify_observers();
    }

    fn notify_observers(&mut self) {
        let mut observers = std::mem::take(&mut self.observers);
        let snapshot = Snapshot {
            objects: &self.objects,
            down: self.down,
        };
        for observer in &mut observers {
            observer(&snapshot);
        }
        self.observers = observers;
    }
}

/// The event a watcher with these selectors gets for `change`, if any.
/// The API server's answer to a write whose resourceVersion precondition failed.
fn conflict(name: &str) -> Answer {
    let message = format!(
        "Operation cannot be fulfilled on {name}: the object has been modified; \
         please apply your changes to the latest version and try again"
    );
    Answer::Json(StatusCode::CONFLICT, status_json(409, "Conflict", &message))
}

fn watch_event(change: &Change, labels: &str, fields: &str) -> Option<Value> {
    let now = change.current.as_ref().filter(|o| matches(o, labels, fields));
    let before = change.previous.as_ref().filter(|o| matches(o, labels, fields));
    match (now, before) {
        (Some(object), None) => Some(json!({"type": "ADDED", "object": object})),
        (Some(object), Some(_)) => Some(json!({"type": "MODIFIED", "object": object})),
        (None, Some(old)) => {
            let mut old = old.clone();
            old["metadata"]["resourceVersion"] = json!(change.rv.to_string());
            Some(json!({"type": "DELETED", "object": old}))
        }
        (None, None) => None,
    }
}

/// Equality-based label selectors (`a=b,c!=d,e,!f`) and field selectors on
/// `metadata.name` / `metadata.namespace`.
fn matches(object: &Value, labels: &str, fields: &str) -> bool {
    let label = |key: &str| object["metadata"]["labels"][key].as_str().map(str::to_string);
    let field = |key: &str| {
        let mut value = object;
        for part in key.split('.') {
            value = &value[part];
        }
        value.as_str().map(str::to_string)
    };
    requirement_holds(labels, label) && requirement_holds(fields, field)
}

fn requirement_holds(selector: &str, value_of: impl Fn(&str) -> Option<String>) -> bool {
    selector.split(',').filter(|r| !r.is_empty()).all(|requirement| {
        if let Some((key, value)) = requirement.split_once("!=") {
            value_of(key).as_deref() != Some(value)
        } else if let Some((key, value)) = requirement.split_once('=') {
            value_of(key).as_deref() == Some(value.trim_start_matches('='))
        } else if let Some(key) = requirement.strip_prefix('!') {
            value_of(key).is_none()
        } else {
            value_of(requirement).is_some()
        }
    })
}

/// RFC 7386 merge; `strategic` merges lists named `conditions` by `type`.
fn merge(target: &mut Value, patch: &Value, strategic: bool) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let object = target.as_object_mut().unwrap();
    for (key, value) in patch {
        if value.is_null() {
            object.remove(key);
        } else if strategic && key == "conditions" && value.is_array() {
            let list = object.entry(key.clone()).or_insert_with(|| json!([]));
            for condition in value.as_array().unwrap() {
                let existing = list
                    .as_array_mut()
                    .and_then(|l| l.iter_mut().find(|c| c["type"] == condition["type"]));
                match existing {
                    Some(existing) => merge(existing, condition, strategic),
                    None => list.as_array_mut().unwrap().push(condition.clone()),
                }
            }
        } else {
            merge(object.entry(key.clone()).or_insert(Value::Null), value, strategic);
        }
    }
}

/// Pod helpers for the sidecar's tests.
/// A request from the HTTP listener, as [`ApiServer::serve`] takes it.
async fn forward<B>(server: ApiServer, request: Request<B>) -> Result<Response<Body>, std::io::Error>
where
    B: http_body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (parts, body) = request.into_parts();
    let bytes = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    server
        .serve(Request::from_parts(parts, kube::client::Body::from(bytes)))
        .await
}

pub mod pods {
    use super::*;

    pub fn collection(namespace: &str) -> String {
        format!("/api/v1/namespaces/{namespace}/pods")
    }

    /// A pod with `labels`, optionally listing the leader condition as a readiness gate.
    pub fn pod(name: &str, namespace: &str, labels: Value, gate: Option<&str>) -> Value {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "app"}]}, "status": {"phase": "Running"}});
        if let Some(gate) = gate {
            pod["spec"]["readinessGates"] = json!([{"conditionType": gate}]);
        }
        pod
    }

    pub fn label<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
        pod["metadata"]["labels"][key].as_str()
    }

    pub fn condition<'a>(pod: &'a Value, type_: &str) -> Option<&'a str> {
        pod["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_)?["status"]
            .as_str()
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, WatchEvent, WatchParams};

    use super::*;

    /// A client in another process reaches the model over HTTP: reads, and
    /// watches whose events stream as they happen.
    #[tokio::test]
    async fn serves_reads_and_streaming_watches_over_http() {
        let server = ApiServer::new(None);
        server.insert(&pods::collection("prod"), pods::pod("a", "prod", json!({}), None));
        let addr = server.serve_http().await;
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let api: Api<Pod> = Api::namespaced(client, "prod");
        let pod = api.get("a").await.unwrap();
        let version = pod.metadata.resource_version.unwrap();
        let mut events = api.watch(&WatchParams::default(), &version).await.unwrap().boxed();
        server.insert(&pods::collection("prod"), pods::pod("b", "prod", json!({}), None));
        // Not a timed assertion: a watch whose events never stream would hang.
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), events.next()).await;
        match event.expect("the event streams") {
            Some(Ok(WatchEvent::Added(pod))) => assert_eq!(pod.metadata.name.as_deref(), Some("b")),
            other => panic!("expected b added, got {other:?}"),
        }
    }
}
