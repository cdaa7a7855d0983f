//! The token file: the `/leader` document (holder, term, token and, while
//! leading, `validUntil`) as JSON on a shared volume, replaced atomically
//! (write a temporary file, then rename), so a reader never sees half a
//! file. Rewritten on every change and every renewal, so `validUntil` moves
//! forward while the sidecar works and stays put when it stalls.
//!
//! A partitioned sidecar writes its `/partitions` document instead (the held
//! partitions with their tokens, `validUntil`), by the same rules; it is
//! rewritten with no partitions when the session's deadline passes.

use std::path::{Path, PathBuf};

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::warn;

use crate::http::{LeaderView, PartitionsSetup, PartitionsView};
use leasehold_core::lease::{Assigned, LeaderState};

/// Writes `view` to `path` atomically.
pub async fn write(path: &Path, view: &impl serde::Serialize) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(view).map_err(std::io::Error::other)?;
    let temporary = path.with_extension("tmp");
    tokio::fs::write(&temporary, json).await?;
    tokio::fs::rename(&temporary, path).await
}

/// Rewrites the file on every change of leader, holder, term or token, and
/// on every renewal.
pub(crate) async fn follow(path: PathBuf, mut state: watch::Receiver<LeaderState>) {
    let mut last = None;
    loop {
        let view = LeaderView::of(&state.borrow_and_update(), Instant::now());
        let key = view.key();
        if last.as_ref() != Some(&key) {
            if let Err(e) = write(&path, &view).await {
                warn!(path = %path.display(), error = %e, "cannot write the token file");
            }
            last = Some(key);
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

/// Partitioned: rewrites the file on every change of the held partitions,
/// their tokens, the members or the session, on every renewal, and when
/// the session's deadline passes (whether or not anything publishes then).
pub(crate) async fn follow_partitions(path: PathBuf, mut assigned: watch::Receiver<Assigned>, setup: PartitionsSetup) {
    let mut last = None;
    loop {
        let (view, deadline) = {
            let current = assigned.borrow_and_update();
            (PartitionsView::of(&current, &setup, Instant::now()), current.deadline)
        };
        let key = view.key();
        if last.as_ref() != Some(&key) {
            if let Err(e) = write(&path, &view).await {
                warn!(path = %path.display(), error = %e, "cannot write the token file");
            }
            last = Some(key);
        }
        let deadline = deadline.filter(|d| *d > Instant::now() && view.holds);
        tokio::select! {
            changed = assigned.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_file_is_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("leasehold-token-{:x}", rand::random::<u64>()));
        tokio::fs::create_dir_all(&dir).await.unwrap();
        let path = dir.join("token.json");
        let now = Instant::now();
        let state = LeaderState {
            leader: true,
            holder: Some("a#1".into()),
            term: 3,
            token: Some(leasehold_core::lease::FencingToken(42)),
            deadline: Some(now + std::time::Duration::from_secs(10)),
            renewed: Some(now),
            ..Default::default()
        };
        write(&path, &LeaderView::of(&state, Instant::now())).await.unwrap();
        let read: serde_json::Value = serde_json::from_slice(&tokio::fs::read(&path).await.unwrap()).unwrap();
        assert_eq!(read["holder"], "a#1");
        assert_eq!(read["term"], 3);
        assert_eq!(read["token"], "42");
        let valid_until = humantime::parse_rfc3339(read["validUntil"].as_str().expect("validUntil")).unwrap();
        assert!(valid_until > std::time::SystemTime::now(), "{read}");
        assert!(
            !path.with_extension("tmp").exists(),
            "the temporary file was renamed away"
        );
        tokio::fs::remove_dir_all(&dir).await.unwrap();
    }

    /// A reader polling while the sidecar rewrites the file many times
    /// (a long and a short document in turn) always reads a whole one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_never_sees_half_a_file() {
        let dir = std::env::temp_dir().join(format!("leasehold-token-{:x}", rand::random::<u64>()));
        tokio::fs::create_dir_all(&dir).await.unwrap();
        let path = dir.join("token.json");
        let view = |holder: String| {
            let state = LeaderState {
                holder: Some(holder),
                ..Default::default()
            };
            LeaderView::of(&state, Instant::now())
        };
        let (long, short) = (view("x".repeat(256 * 1024)), view("a#1".into()));
        write(&path, &short).await.unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, done) = (path.clone(), done.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let bytes = std::fs::read(&path).unwrap();
                    let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&bytes);
                    assert!(
                        parsed.is_ok(),
                        "read {} bytes that are not a whole document",
                        bytes.len()
                    );
                    reads += 1;
                }
                reads
            })
        };
        for round in 0..200 {
            write(&path, if round % 2 == 0 { &long } else { &short }).await.unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let reads = reader.join().expect("every read parsed");
        assert!(reads > 0);
        tokio::fs::remove_dir_all(&dir).await.unwrap();
    }

    /// Partitioned: the file lists the held partitions with their tokens,
    /// follows changes, and is rewritten with none once the session's
    /// deadline passes, though nothing publishes then (a stalled session).
    #[tokio::test]
    async fn the_partitioned_file_lists_the_held_partitions_and_empties_at_the_deadline() {
        let dir = std::env::temp_dir().join(format!("leasehold-token-{:x}", rand::random::<u64>()));
        tokio::fs::create_dir_all(&dir).await.unwrap();
        let path = dir.join("partitions.json");
        let setup = PartitionsSetup {
            count: 4,
            identity: "pod-0#1".into(),
            renew_deadline: std::time::Duration::from_secs(10),
        };
        let read = || async {
            let bytes = tokio::fs::read(&path).await.unwrap_or_default();
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default()
        };
        let until = |check: fn(&serde_json::Value) -> bool| async move {
            for _ in 0..200 {
                let current = read().await;
                if check(&current) {
                    return current;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            panic!("the file never became what was expected: {}", read().await)
        };
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        let (tx, rx) = watch::channel(Assigned {
            session: "pod-0#1~00".into(),
            partitions: [(1, leasehold_core::lease::FencingToken(11))].into(),
            deadline: Some(deadline),
            members: 2,
        });
        let _writer = tokio::spawn(follow_partitions(path.clone(), rx, setup));
        let first = until(|v| v["holds"] == true).await;
        assert_eq!(first["partitions"], serde_json::json!([{"index": 1, "token": "11"}]));
        tx.send_modify(|a| {
            a.partitions.insert(3, leasehold_core::lease::FencingToken(12));
        });
        until(|v| v["partitions"].as_array().is_some_and(|p| p.len() == 2)).await;
        // The deadline comes close and passes; nothing is sent on the channel.
        tx.send_modify(|a| a.deadline = Some(Instant::now() + std::time::Duration::from_millis(300)));
        let emptied = until(|v| v["holds"] == false).await;
        assert_eq!(emptied["partitions"], serde_json::json!([]), "{emptied}");
        tokio::fs::remove_dir_all(&dir).await.unwrap();
    }
}
