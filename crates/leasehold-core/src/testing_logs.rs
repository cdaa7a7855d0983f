//! Log events as a log pipeline reads them: the binary's JSON lines
//! (`--log-format json`, fields flattened into each line), captured from
//! the code under test, so a test can require plain values in its fields
//! (issue 57): `"pod":"web-0"`, never `"pod":"Some(\"web-0\")"`.

use std::future::Future;
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// The JSON lines written, shared with the subscriber.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Lines {
    type Writer = Lines;

    fn make_writer(&'a self) -> Lines {
        self.clone()
    }
}

/// Runs `work` with every event of this thread (a current-thread runtime:
/// its spawned tasks too) formatted as the binary's JSON logs, and returns
/// its output with the events.
pub async fn json_events<T>(work: impl Future<Output = T>) -> (T, Vec<Value>) {
    let lines = Lines::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(lines.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    let output = work.await;
    drop(guard);
    let written = lines.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let events = String::from_utf8_lossy(&written)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON log line"))
        .collect();
    (output, events)
}

/// `message: field=value` for every field of `events` that holds the Debug
/// form of an `Option` or a string (`Some(…)`, `None`, or text in quotes),
/// which a log pipeline cannot match on.
pub fn debug_forms(events: &[Value]) -> Vec<String> {
    let mut found = Vec::new();
    for event in events {
        let Some(fields) = event.as_object() else { continue };
        let message = fields.get("message").and_then(Value::as_str).unwrap_or_default();
        for (name, value) in fields {
            let Some(text) = value.as_str() else { continue };
            let quoted = text.len() >= 2 && text.starts_with('"') && text.ends_with('"');
            if text.starts_with("Some(") || text == "None" || quoted {
                found.push(format!("{message}: {name}={text}"));
            }
        }
    }
    found
}

/// The first event whose message is `message`.
pub fn event<'a>(events: &'a [Value], message: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["message"] == message)
        .unwrap_or_else(|| panic!("no event {message:?} among {events:#?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check catches what it exists for: Debug forms of an `Option`
    /// and of a string, and passes plain values.
    #[tokio::test]
    async fn the_check_finds_debug_forms_and_passes_values() {
        let pod = Some("web-0".to_string());
        let ((), events) = json_events(async {
            tracing::info!(pod = ?pod, "debug form");
            tracing::info!(pod = ?"web-0", "quoted");
            tracing::info!(pod = pod.as_deref(), term = 3, "values");
        })
        .await;
        assert_eq!(
            debug_forms(&events),
            [r#"debug form: pod=Some("web-0")"#, r#"quoted: pod="web-0""#]
        );
        assert_eq!(event(&events, "values")["pod"], "web-0");
    }
}
