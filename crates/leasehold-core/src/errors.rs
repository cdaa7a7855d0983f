//! How an error reads to a person: its message and each cause below it,
//! once, `: `-separated, on one line. Every error is printed through
//! [`causes_rendering`]: here with no layer's help; the Kubernetes layer
//! (`api::errors`) lends it how an API server's answer reads.
//!
//! Our own errors never format their source into their message (checked by
//! tests/install/error_sources.rs), but some dependencies' errors do (kube's
//! `Error::InferConfig` is "Failed to infer configuration: {0}" over the
//! same cause), so a cause whose text its parent already said is skipped,
//! and a parent ending in the text of a cause a layer renders says only its
//! own part.

use std::error::Error;

/// How a layer above says one level of a chain better than its `Display`
/// (kube's `Error::Api` prints the API server's Status as Rust `Debug`);
/// `None`: as it displays. A rendered level ends the chain.
pub type Render = fn(&(dyn Error + 'static)) -> Option<String>;

/// The error and its causes, each said once, on one line.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    causes_rendering(error, |_| None).join(": ")
}

/// The error's message, then each cause below it not already said, each
/// level as `render` says it where it does.
pub fn causes_rendering(error: &(dyn Error + 'static), render: Render) -> Vec<String> {
    let mut said: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(level) = next {
        if let Some(rendered) = render(level) {
            said.push(rendered);
            break;
        }
        let mut text = level.to_string();
        // A parent that ends with the text of a cause rendered below (kube's
        // watcher errors over an API error) says only its own part.
        if let Some(cause) = level.source().filter(|cause| render(*cause).is_some())
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_cause_its_parent_already_said_is_skipped() {
        let error = Repeats(std::io::Error::other("disk gone"));
        assert_eq!(chain(&error), "outer: disk gone");
    }

    #[test]
    fn a_store_error_says_each_cause_once() {
        let error = crate::lease::StoreError::invalid("reading the row").caused_by(std::io::Error::other("disk gone"));
        assert_eq!(chain(&error), "invalid: reading the row: disk gone");
    }
}
