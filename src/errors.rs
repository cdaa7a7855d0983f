//! How an error reads to a person: its message and each cause below it,
//! once, `: `-separated, on one line. The command line, the logs and the
//! operator's condition and Event messages all print errors through
//! [`chain`].
//!
//! Our own errors never format their source into their message (checked by
//! tests/install/error_sources.rs), but some dependencies' errors do (kube's
//! `Error::InferConfig` is "Failed to infer configuration: {0}" over the
//! same cause), so a cause whose text its parent already said is skipped,
//! and a parent ending in the text of an API error it wraps says only its
//! own part.
//! kube's `Error::Api` prints the API server's `Status` twice, once as
//! Rust `Debug`; it is printed here as the Status message and HTTP code.

use std::error::Error;

/// The longest condition or Event message the operator and sidecar write.
/// Kubernetes allows 32 KiB in a condition message and 1 KiB in an Event's
/// note (events.k8s.io/v1 `note`, "must be no longer than 1kB"); a person
/// reading `kubectl describe` wants the cause, not a dump.
pub(crate) const MESSAGE_MAX_CHARS: usize = 600;

/// The error and its causes, each said once, on one line.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    causes(error).join(": ")
}

/// The error's message, then each cause below it not already said.
pub fn causes(error: &(dyn Error + 'static)) -> Vec<String> {
    let mut said: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(level) = next {
        if let Some(status) = api_status(level) {
            said.push(status);
            break;
        }
        let mut text = level.to_string();
        // A parent that ends with the text of an API error it wraps (kube's
        // watcher errors) says only its own part: the API error follows,
        // printed as the Status message and code instead of `Debug`.
        if let Some(cause) = level.source().filter(|cause| api_status(*cause).is_some())
            && let Some(own) = text.strip_suffix(&cause.to_string())
        {
            text = own.trim_end().trim_end_matches(':').to_string();
        }
        if !text.is_empty() && !said.last().is_some_and(|parent| parent.contains(&text)) {
            said.push(text);
        }
        next = level.source();
    }
    said
}

/// [`chain`] cut to [`MESSAGE_MAX_CHARS`], for a condition or Event message.
pub fn message(error: &(dyn Error + 'static)) -> String {
    bounded(&chain(error))
}

/// `text` cut to [`MESSAGE_MAX_CHARS`] characters, ending in `…` when cut.
pub(crate) fn bounded(text: &str) -> String {
    match text.char_indices().nth(MESSAGE_MAX_CHARS - 1) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// The API server's answer in a kube `Error::Api` (also behind the `Arc`
/// a store keeps its cause in): its message and HTTP code, which is what
/// `kubectl` prints.
#[cfg(feature = "kubernetes")]
fn api_status(level: &(dyn Error + 'static)) -> Option<String> {
    let kube_error = level.downcast_ref::<kube::Error>().or_else(|| {
        level
            .downcast_ref::<std::sync::Arc<dyn Error + Send + Sync>>()
            .and_then(|cause| (&**cause as &(dyn Error + 'static)).downcast_ref::<kube::Error>())
    });
    match kube_error? {
        kube::Error::Api(status) => Some(match (status.message.is_empty(), status.reason.is_empty()) {
            (false, _) => format!("{} (HTTP {})", status.message, status.code),
            (true, false) => format!("{} (HTTP {})", status.reason, status.code),
            (true, true) => format!("HTTP {}", status.code),
        }),
        _ => None,
    }
}

#[cfg(not(feature = "kubernetes"))]
fn api_status(_: &(dyn Error + 'static)) -> Option<String> {
    None
}

#[cfg(all(test, feature = "kubernetes"))]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot list DistributedLeases")]
    struct List(#[source] kube::Error);

    /// A dependency's error that formats its cause and also returns it as
    /// its source (written by hand: ours may not, tests/install/error_sources.rs).
    #[derive(Debug)]
    struct Repeats(std::io::Error);

    impl std::fmt::Display for Repeats {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "outer: {}", self.0)
        }
    }

    impl Error for Repeats {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    fn forbidden() -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code: 403,
            reason: "Forbidden".into(),
            message: "secrets \"s\" is forbidden: no".into(),
            ..Default::default()
        }))
    }

    #[test]
    fn an_api_error_is_its_message_and_code_without_debug() {
        let text = chain(&List(forbidden()));
        assert_eq!(
            text,
            "cannot list DistributedLeases: secrets \"s\" is forbidden: no (HTTP 403)"
        );
    }

    /// kube's watcher errors format their `Error::Api` into their own
    /// text: the Status is said once, as its message and code, never as
    /// Rust `Debug`. Planted: without the suffix cut the dump is back.
    #[test]
    fn a_watch_error_over_an_api_error_says_its_part_then_the_status() {
        let text = chain(&kube::runtime::watcher::Error::InitialListFailed(forbidden()));
        assert_eq!(
            text,
            "failed to perform initial object list: secrets \"s\" is forbidden: no (HTTP 403)"
        );
    }

    #[test]
    fn a_store_cause_behind_an_arc_is_read_too() {
        let error = crate::lease::StoreError::invalid("reading Secret a/b").caused_by(forbidden());
        assert_eq!(
            chain(&error),
            "invalid: reading Secret a/b: secrets \"s\" is forbidden: no (HTTP 403)"
        );
    }

    #[test]
    fn a_cause_its_parent_already_said_is_skipped() {
        let error = Repeats(std::io::Error::other("disk gone"));
        assert_eq!(chain(&error), "outer: disk gone");
    }

    #[test]
    fn messages_are_bounded() {
        let long = "é".repeat(MESSAGE_MAX_CHARS * 2);
        let cut = bounded(&long);
        assert_eq!(cut.chars().count(), MESSAGE_MAX_CHARS);
        assert!(cut.ends_with('…'));
        assert_eq!(bounded("short"), "short");
    }
}
