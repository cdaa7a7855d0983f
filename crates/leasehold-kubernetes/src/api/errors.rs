//! How errors read in the Kubernetes layer and above: the core's chain
//! ([`leasehold_core::errors`]) with kube's `Error::Api` said as the API server's
//! Status message and HTTP code, which is what `kubectl` prints (its
//! `Display` prints the Status as Rust `Debug`), and the bounds of the
//! messages written into conditions and Events.

use std::error::Error;

/// The longest condition or Event message the operator and sidecar write.
/// Kubernetes allows 32 KiB in a condition message and 1 KiB in an Event's
/// note (events.k8s.io/v1 `note`, "must be no longer than 1kB"); a person
/// reading `kubectl describe` wants the cause, not a dump.
pub const MESSAGE_MAX_CHARS: usize = 600;

/// The error and its causes, each said once, on one line.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    causes(error).join(": ")
}

/// The error's message, then each cause below it not already said.
pub fn causes(error: &(dyn Error + 'static)) -> Vec<String> {
    leasehold_core::errors::causes_rendering(error, api_status)
}

/// [`chain`] cut to [`MESSAGE_MAX_CHARS`], for a condition or Event message.
pub fn message(error: &(dyn Error + 'static)) -> String {
    bounded(&chain(error))
}

/// `text` cut to [`MESSAGE_MAX_CHARS`] characters, ending in `…` when cut.
pub fn bounded(text: &str) -> String {
    match text.char_indices().nth(MESSAGE_MAX_CHARS - 1) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// A kube error as a store error's cause: said here, once, so that the
/// core, which knows no kube, prints it as this layer does.
#[derive(Debug)]
pub struct KubeCause(String);

impl KubeCause {
    pub fn of(error: &(dyn Error + 'static)) -> KubeCause {
        KubeCause(chain(error))
    }
}

impl std::fmt::Display for KubeCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for KubeCause {}

/// The API server's answer in a kube `Error::Api`: its message and code.
fn api_status(level: &(dyn Error + 'static)) -> Option<String> {
    match level.downcast_ref::<kube::Error>()? {
        kube::Error::Api(status) => Some(match (status.message.is_empty(), status.reason.is_empty()) {
            (false, _) => format!("{} (HTTP {})", status.message, status.code),
            (true, false) => format!("{} (HTTP {})", status.reason, status.code),
            (true, true) => format!("HTTP {}", status.code),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot list DistributedLeases")]
    struct List(#[source] kube::Error);

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

    /// A store error over a kube error reads the same through the core's
    /// chain, which knows no kube (the elector's, the store's own logs).
    #[test]
    fn a_store_error_over_a_kube_cause_reads_well_in_the_core() {
        let error =
            leasehold_core::lease::StoreError::invalid("reading Secret a/b").caused_by(KubeCause::of(&forbidden()));
        let expected = "invalid: reading Secret a/b: secrets \"s\" is forbidden: no (HTTP 403)";
        assert_eq!(leasehold_core::errors::chain(&error), expected);
        assert_eq!(chain(&error), expected);
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
