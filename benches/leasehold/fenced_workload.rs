//! The `fenced-workload` part (issue 56, the long run): the end-to-end
//! suite's fenced workload (tests/e2e/fenced_workload.rs) run until the
//! lease store has begun LEASEHOLD_BENCH_FENCED_TERMS new terms (default
//! 120) and every fenced resource has accepted LEASEHOLD_BENCH_FENCED_WRITES
//! writes (default 10,000), or for LEASEHOLD_BENCH_FENCED_MINUTES (default
//! 60). It needs a disposable cluster (docs/e2e.md: it pauses the API
//! server), so it runs only when named. The faults come from
//! LEASEHOLD_E2E_FAULT_SEED when set (printed either way). The run must
//! prove the fences as the short one does (no stale write accepted by a
//! fence, stale writes accepted by the control, every fault kind): the
//! harness fails otherwise, and prints the checker's figures.

use std::time::Duration;

use crate::cluster::scenario;
use crate::env_or;
use crate::fenced_workload::{Length, NAMESPACE, run};

pub fn fenced_workload() -> Vec<String> {
    let length = Length {
        terms: env_or("LEASEHOLD_BENCH_FENCED_TERMS", 120) as usize,
        writes: env_or("LEASEHOLD_BENCH_FENCED_WRITES", 10_000) as usize,
        at_most: Duration::from_secs(60 * env_or("LEASEHOLD_BENCH_FENCED_MINUTES", 60)),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let outcome = runtime.block_on(scenario(NAMESPACE, |s| async move { run(&s, &length).await }));
    outcome.proves_the_fences();
    outcome.summary().lines().map(String::from).collect()
}
