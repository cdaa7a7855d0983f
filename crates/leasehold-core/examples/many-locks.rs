//! Many locks through one session per process, on the memory store: three
//! workers try batches of keys, work on the ones they got (with each key's
//! fencing token) and leave the busy ones; one waits for a key with `lock`.
//! Every worker's store cost is one session renewal per P, however many
//! keys it holds.
//!
//! cargo run -p leasehold-core --example many-locks

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::lease::{Identity, Session, SessionStore, Timing};
use leasehold_core::store::memory::MemoryStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryStore::default());
    let timing = Timing::parse("2s", "1500ms", "300ms", 0.1)?;
    let keys: Vec<String> = (0..12).map(|i| format!("tenant-{i:02}")).collect();

    let mut workers = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        let sessions: Arc<dyn SessionStore> = store.clone();
        workers.push((
            name,
            Session::open(sessions, Identity::new(None, None, name), timing).await?,
        ));
    }

    // Each worker tries a batch without waiting (overlapping windows of the
    // keys): together they take every key exactly once.
    let mut owner = BTreeMap::new();
    for ((name, session), window) in workers.iter().zip([0..6, 3..12, 0..12]) {
        let got = session.try_lock_many(&keys[window]).await?;
        println!("{name} took {} keys, {} busy", got.taken.len(), got.busy.len());
        for lock in got.taken {
            // Pass the token to whatever the key guards: it rejects lower ones.
            println!("  {name} works on {} with token {}", lock.name, lock.token);
            owner.insert(lock.name, *name);
        }
    }
    assert_eq!(owner.len(), keys.len(), "every key has exactly one owner");

    // Watch alpha's held set; gamma waits for one of alpha's keys.
    let (alpha, gamma) = (&workers[0].1, &workers[2].1);
    let mut held = alpha.held();
    let wanted = held
        .borrow()
        .locks
        .keys()
        .next()
        .cloned()
        .ok_or("alpha holds nothing")?;
    let before = alpha.token(&wanted).ok_or("alpha's key has a token")?;
    let waiting = async {
        let lock = gamma.lock(&wanted).await?;
        println!("gamma waited for {} and got token {}", lock.name, lock.token);
        Ok::<_, leasehold_core::lease::StoreError>(lock)
    };
    let releasing = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let freed = alpha.release(&[&wanted]).await?;
        println!("alpha released {freed:?}");
        Ok::<_, leasehold_core::lease::StoreError>(())
    };
    let (lock, released) = tokio::join!(waiting, releasing);
    released?;
    let lock = lock?;
    assert!(lock.token > before, "a new holder gets a higher token");
    held.changed().await?;
    println!("alpha now holds {} keys", held.borrow_and_update().locks.len());

    // Renewals keep everything held; the store sees one write per P per worker.
    let writes = store.calls().writes;
    tokio::time::sleep(timing.retry_period * 5).await;
    println!(
        "{} store writes in 5 periods for 3 workers holding {} keys",
        store.calls().writes - writes,
        keys.len()
    );

    for (name, session) in workers {
        session.close().await?;
        println!("{name} closed its session: its keys are free");
    }
    Ok(())
}
