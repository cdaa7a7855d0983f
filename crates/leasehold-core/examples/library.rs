//! Using leasehold's elector as a library, without the sidecar: two
//! candidates in one process on the memory store; the leader does fenced
//! work until it steps down.
//!
//! cargo run -p leasehold-core --example library

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::lease::{Elector, Identity, LeaderContext, Timing};
use leasehold_core::store::memory::MemoryStore;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryStore::default());
    let timing = Timing::parse("2s", "1500ms", "300ms", 0.1)?;
    let shutdown = CancellationToken::new();

    let candidates: Vec<_> = ["alpha", "beta"]
        .into_iter()
        .map(|name| {
            let identity = Identity::new(None, None, name);
            Elector::new("example-lock", identity, timing).spawn_with_work(
                store.clone(),
                shutdown.clone(),
                move |ctx: LeaderContext| async move {
                    // Leader work: act only while still leading, and pass the
                    // fencing token to whatever you write to.
                    while ctx.still_leading() {
                        println!("{name} works as leader, term {}, token {}", ctx.term, ctx.token);
                        tokio::select! {
                            _ = ctx.cancelled.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                        }
                    }
                    println!("{name} stopped working");
                },
            )
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(2)).await;
    // The leader steps down and releases; the other takes over.
    for candidate in &candidates {
        if candidate.state().leader {
            candidate.set_campaigning(false);
        } else {
            candidate.nudge();
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    shutdown.cancel();
    for candidate in candidates {
        candidate.join().await;
    }
    Ok(())
}
