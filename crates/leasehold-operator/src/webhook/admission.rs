//! Admission: looks up the lease a pod names and answers with the patch.

use std::future::Future;
use std::sync::Arc;

use super::Result;
use super::certs::base64_encode;
use super::patch::*;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Json, Router, routing::post};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use leasehold_kubernetes::api::client::read_object;
use leasehold_kubernetes::api::contract::{LEASE_ANNOTATION, RUN_ANNOTATION};
use serde_json::json;
use tracing::{info, warn};

/// Looks up the lease a pod names, in the pod's namespace.
pub(crate) trait LeaseLookup: Send + Sync + 'static {
    /// `Ok(None)`: no such lease.
    fn lookup(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<LeaseInjection>, String>> + Send;
}

/// Reads `DistributedLease`s from the API server.
#[derive(Clone)]
pub(crate) struct KubeLeaseLookup(pub kube::Client);

impl LeaseLookup for KubeLeaseLookup {
    async fn lookup(&self, namespace: &str, name: &str) -> Result<Option<LeaseInjection>, String> {
        let api: Api<leasehold_kubernetes::api::DistributedLease> = Api::namespaced(self.0.clone(), namespace);
        let lease = api
            .get_opt(name)
            .await
            .map_err(|e| leasehold_kubernetes::api::errors::message(&e))?;
        Ok(lease.as_ref().map(LeaseInjection::of))
    }
}

/// Answers one admission request. Denies only a pod whose
/// `leasehold.dev/run` container cannot be wrapped; on any other doubt it
/// admits, with a warning the user sees in `kubectl`.
pub(crate) async fn admit<L: LeaseLookup>(
    lookup: &L,
    config: &InjectionConfig,
    request: AdmissionRequest<Pod>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(&request);
    let Some(pod) = request.object.as_ref() else {
        return response;
    };
    let Some(lease_name) = pod.metadata.annotations.as_ref().and_then(|a| a.get(LEASE_ANNOTATION)) else {
        return response;
    };
    let namespace = request
        .namespace
        .clone()
        .or_else(|| pod.metadata.namespace.clone())
        .unwrap_or_default();
    let mut warnings = Vec::new();
    let lease = match lookup.lookup(&namespace, lease_name).await {
        Ok(Some(lease)) => Some(lease),
        Ok(None) => {
            warnings.push(format!(
                "DistributedLease {namespace}/{lease_name} not found: sidecar injected without a readiness gate; \
                 the sidecar waits until the DistributedLease exists"
            ));
            None
        }
        Err(e) => {
            warnings.push(format!(
                "DistributedLease {namespace}/{lease_name} could not be read ({e}): injected without a readiness gate"
            ));
            None
        }
    };
    let pod_name = pod.metadata.name.as_ref().or(pod.metadata.generate_name.as_ref());
    let runs = has_annotation(pod, RUN_ANNOTATION);
    let patch = match injection_patch(pod, lease, config) {
        Ok(patch) => patch,
        // Admitted unwrapped, a container asking to run only while leading
        // would run on every replica: the one case worth blocking the pod.
        Err(reason) if reason.is_user_error() && runs => {
            warn!(namespace, lease = %lease_name, pod = pod_name.map(String::as_str), %reason, "denied: cannot wrap with leasehold run");
            return response.deny(format!(
                "leasehold cannot wrap the command with `leasehold run`: {reason}"
            ));
        }
        Err(reason) if reason.is_user_error() => {
            warn!(namespace, lease = %lease_name, pod = pod_name.map(String::as_str), %reason, "sidecar not injected");
            let mut response = response;
            response.warnings = Some(vec![format!("leasehold sidecar not injected: {reason}")]);
            return response;
        }
        Err(_) => return response,
    };
    let mut response = match response.with_patch(patch) {
        Ok(patched) => patched,
        Err(e) => {
            warn!(error = %e, "could not serialize the injection patch; admitting unchanged");
            return AdmissionResponse::from(&request);
        }
    };
    info!(namespace, lease = %lease_name, pod = pod_name.map(String::as_str), "injected the leasehold sidecar");
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    response
}

/// The webhook's HTTP routes (served over TLS by [`serve`]).
pub(crate) fn router<L: LeaseLookup>(lookup: Arc<L>, config: Arc<InjectionConfig>) -> Router {
    Router::new().route(
        "/mutate",
        post(move |body: Bytes| {
            let (lookup, config) = (lookup.clone(), config.clone());
            async move {
                let review = match parse_review(&body) {
                    Ok(review) => review,
                    // kube-apiserver takes any non-2xx answer as a failed
                    // call and applies the hook's failurePolicy (apiserver's
                    // admission/plugin/webhook/mutating/dispatcher.go,
                    // callAttrMutatingHook: ErrCallingWebhook).
                    Err(e) => {
                        warn!(error = %e, "an admission request that is not an AdmissionReview");
                        return (StatusCode::BAD_REQUEST, e).into_response();
                    }
                };
                let request: Result<AdmissionRequest<Pod>, _> = review.try_into();
                let response = match request {
                    Ok(request) => admit(lookup.as_ref(), &config, request).await,
                    Err(e) => AdmissionResponse::invalid(format!("not an AdmissionReview request: {e}")),
                };
                Json(review_json(response)).into_response()
            }
        }),
    )
}

/// The request body as an `AdmissionReview`, read as kube-client reads
/// objects: axum's `Json` extractor would compile the pod's deserializer
/// again, over `serde_path_to_error`, a tenth of the crate's monomorphised
/// functions.
fn parse_review(body: &[u8]) -> Result<AdmissionReview<Pod>, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("the AdmissionReview is not UTF-8: {e}"))?;
    read_object(text).map_err(|e| format!("not an AdmissionReview of a pod: {e}"))
}

/// The review as the API server reads it. kube-core serializes the patch
/// bytes as a JSON array of numbers (kube-rs issue #1781); the admission API
/// documents a base64 string, which is what Go's `[]byte` encoding produces.
fn review_json(response: AdmissionResponse) -> serde_json::Value {
    let mut review = serde_json::to_value(response.into_review()).unwrap_or_default();
    if let Some(patch) = review.pointer_mut("/response/patch") {
        let bytes: Vec<u8> = serde_json::from_value(patch.take()).unwrap_or_default();
        *patch = json!(base64_encode(&bytes));
    }
    review
}
