//! Work partitioning through the library, on the memory store: three
//! workers share 12 partitions (4 each), a fourth joins and the others hand
//! over one partition each after draining it, then one leaves and its
//! partitions are picked up. Each worker works only on the partitions its
//! `Assigned` lists, passing each partition's fencing token along.
//!
//! cargo run -p leasehold-core --example partitions

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::lease::{Assigned, Identity, Partitioner, Session, SessionStore, Timing};
use leasehold_core::store::memory::MemoryStore;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const PARTITIONS: u32 = 12;

struct Worker {
    name: &'static str,
    assigned: watch::Receiver<Assigned>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), leasehold_core::lease::StoreError>>,
}

async fn join(store: &Arc<MemoryStore>, name: &'static str) -> Result<Worker, Box<dyn std::error::Error>> {
    let timing = Timing::parse("2s", "1500ms", "300ms", 0.1)?;
    let sessions: Arc<dyn SessionStore> = store.clone();
    let session = Session::open(sessions.clone(), Identity::new(None, None, name), timing).await?;
    let partitioner = Partitioner::new(session, "orders", PARTITIONS, Duration::from_millis(200));
    let assigned = partitioner.assigned();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(partitioner.run(shutdown.clone()));
    Ok(Worker {
        name,
        assigned,
        shutdown,
        task,
    })
}

/// Waits until every partition has exactly one worker and the shares are
/// `expected` (in worker order); prints them.
async fn settled(workers: &[&Worker], expected: &[usize]) -> Result<(), Box<dyn std::error::Error>> {
    let shares = || -> Vec<usize> { workers.iter().map(|w| w.assigned.borrow().partitions.len()).collect() };
    tokio::time::timeout(Duration::from_secs(10), async {
        while shares() != expected {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .map_err(|_| format!("shares {:?}, not {expected:?}, after 10 s", shares()))?;
    let mut owner = BTreeMap::new();
    for w in workers {
        let assigned = w.assigned.borrow().clone();
        let list: Vec<String> = assigned
            .partitions
            .iter()
            .map(|(i, token)| format!("{i} (token {token})"))
            .collect();
        println!("  {} works on {}", w.name, list.join(", "));
        for i in assigned.partitions.keys() {
            if let Some(other) = owner.insert(*i, w.name) {
                return Err(format!("partition {i} held by {other} and {}", w.name).into());
            }
        }
    }
    if owner.len() != PARTITIONS as usize {
        return Err(format!("{} of {PARTITIONS} partitions held", owner.len()).into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryStore::default());
    let (a, b, c) = (
        join(&store, "alpha").await?,
        join(&store, "beta").await?,
        join(&store, "gamma").await?,
    );
    println!("three workers:");
    settled(&[&a, &b, &c], &[4, 4, 4]).await?;

    let d = join(&store, "delta").await?;
    println!("delta joined; each of the others drains and hands over one:");
    settled(&[&a, &b, &c, &d], &[3, 3, 3, 3]).await?;

    // Leaving stops claiming, drains and closes the session: the others pick
    // its partitions up at their next poll, without waiting for the lease.
    b.shutdown.cancel();
    b.task.await??;
    println!("beta left:");
    settled(&[&a, &c, &d], &[4, 4, 4]).await?;

    for w in [a, c, d] {
        w.shutdown.cancel();
        w.task.await??;
    }
    Ok(())
}
