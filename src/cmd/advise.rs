//! `leasehold advise`: measures round trips against a store for a while and
//! suggests D/R/P that keep the elector's margins, with its reasoning.
//!
//! The rules (each printed with the numbers that drove it):
//! * P: a renewal should occupy at most 5 % of a period (P ≥ 20 × p99), and
//!   P ≥ 250 ms keeps a follower's polling to at most 4 reads a second.
//! * R − P is the budget for renewals that fail or crawl: at least two more
//!   periods (two retries after a miss), and at least 4 × the slowest
//!   renewal seen, so that p99 stays under a quarter of the budget (the
//!   share the sidecar warns at, [`AT_RISK_SHARE`]).
//! * D − R, the safety gap, absorbs process pauses and clock-rate drift
//!   between the leader and the store: at least R / 2 (drift up to 50 %) and
//!   at least 1 s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::lease::budget::{AT_RISK_SHARE, Latencies};
use crate::lease::timing::DEFAULT_JITTER;
use crate::lease::{Identity, LeaseStore, Timing, TimingError};
use crate::runtime::{StoreFlags, StoreKind, store_url};
use crate::sidecar::config::store_kind;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The store to measure.
    #[arg(long, env = "LEASEHOLD_STORE", value_parser = store_kind())]
    pub store: StoreKind,
    /// PostgreSQL or Redis URL, credentials included.
    #[arg(long, env = "LEASEHOLD_STORE_URL", hide_env_values = true)]
    pub store_url: Option<String>,
    /// A file holding the store URL, instead of --store-url.
    #[arg(long, env = "LEASEHOLD_STORE_URL_FILE", conflicts_with = "store_url")]
    pub store_url_file: Option<std::path::PathBuf>,
    /// Spanner: projects/<p>/instances/<i>/databases/<d>.
    #[arg(long, env = "LEASEHOLD_DATABASE")]
    pub database: Option<String>,
    /// The lease table (Spanner, PostgreSQL).
    #[arg(long, env = "LEASEHOLD_TABLE")]
    pub table: Option<String>,
    /// Create the lease table when it is missing.
    #[arg(long, env = "LEASEHOLD_CREATE_TABLE")]
    pub create_table: bool,
    /// How long to measure.
    #[arg(long = "for", env = "LEASEHOLD_ADVISE_FOR", default_value = "20s", value_parser = crate::lease::timing::parse_duration_flag)]
    pub measure_for: Duration,
    /// Pause between one renew-and-observe round and the next.
    #[arg(long, env = "LEASEHOLD_ADVISE_INTERVAL", default_value = "100ms", value_parser = crate::lease::timing::parse_duration_flag)]
    pub interval: Duration,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(transparent)]
    Config(#[from] crate::runtime::SelectError),
    #[error("cannot measure the store")]
    Store(#[from] crate::lease::StoreError),
    #[error("no advice")]
    Timing(#[from] TimingError),
}

/// Rounds up to a whole number of `step`s.
fn ceil_to(d: Duration, step: Duration) -> Duration {
    let steps = d.as_nanos().div_ceil(step.as_nanos());
    step * u32::try_from(steps).unwrap_or(u32::MAX)
}

/// D/R/P from measured renewal latencies, and why.
pub(crate) fn suggest(renewals: &Latencies) -> Result<(Timing, Vec<String>), TimingError> {
    const STEP: Duration = Duration::from_millis(50);
    let (p99, max) = (renewals.quantile(0.99), renewals.max());
    let p = ceil_to((p99 * 20).max(Duration::from_millis(250)), STEP);
    let budget = (p * 2).max(max.div_f64(AT_RISK_SHARE));
    let r = ceil_to(p + budget, STEP);
    let gap = (r / 2).max(Duration::from_secs(1));
    let d = ceil_to(r + gap, STEP);
    let timing = Timing::new(d, r, p, DEFAULT_JITTER)?;
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    let reasons = vec![
        format!(
            "P = {p:?}: at least 20 × renew p99 ({}) so a renewal takes at most 5 % of a period, and at least 250 ms",
            ms(p99)
        ),
        format!(
            "R = {r:?}: P plus a budget of {budget:?} for slow or failed renewals: two more periods, and 4 × the \
             slowest renewal seen ({}), so p99 uses under a quarter of R − P",
            ms(max)
        ),
        format!(
            "D = {d:?}: R plus a safety gap of {gap:?} (R / 2, at least 1 s) for process pauses and clock-rate drift; \
             on CockroachDB keep D − R well above the cluster's --max-offset (500 ms by default)"
        ),
        format!(
            "cost: a leader makes {:.0} renewals a minute, each follower {:.0} reads a minute",
            60.0 / p.as_secs_f64(),
            60.0 / p.as_secs_f64()
        ),
    ];
    Ok((timing, reasons))
}

pub(crate) async fn run(args: Args) -> Result<(), Error> {
    let url = store_url(args.store_url.as_deref(), args.store_url_file.as_deref())?;
    let choice = StoreFlags {
        kind: Some(args.store),
        database: args.database.as_deref(),
        table: args.table.as_deref(),
        url,
        namespace: None,
    }
    .choose()?;
    let store: Arc<dyn LeaseStore> = choice.connect(false).await?;
    if args.create_table {
        store.ensure_schema().await?;
    }
    let lock = format!("leasehold-advise/{:08x}", rand::random::<u32>());
    let holder = Identity::new(None, None, "advise").to_string();
    // A lease far longer than the measurement, so no renewal finds it expired.
    let lease = args.measure_for + Duration::from_secs(60);
    let grant = store.acquire(&lock, &holder, lease).await?;
    let (mut renewals, mut observes) = (Vec::new(), Vec::new());
    let started = Instant::now();
    while started.elapsed() < args.measure_for {
        let sent = Instant::now();
        store.renew(&lock, &holder, grant.token, lease).await?;
        renewals.push(sent.elapsed());
        let sent = Instant::now();
        store.observe(&lock).await?;
        observes.push(sent.elapsed());
        tokio::time::sleep(args.interval).await;
    }
    store.release(&lock, &holder, grant.token).await?;
    let (renewals, observes) = (Latencies::new(renewals), Latencies::new(observes));
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
    println!(
        "measured {} renewals and {} observes of lock {lock} on the {} store over {:?}",
        renewals.len(),
        observes.len(),
        store.kind(),
        args.measure_for
    );
    for (what, latencies) in [("renew", &renewals), ("observe", &observes)] {
        println!(
            "  {what:<8} p50 {:>9}  p99 {:>9}  max {:>9}",
            ms(latencies.quantile(0.5)),
            ms(latencies.quantile(0.99)),
            ms(latencies.max())
        );
    }
    let (timing, reasons) = suggest(&renewals)?;
    println!(
        "suggested: --lease-duration {:?} --renew-deadline {:?} --retry-period {:?}",
        timing.lease_duration, timing.renew_deadline, timing.retry_period
    );
    for reason in reasons {
        println!("  {reason}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn a_fast_store_gets_the_floors() {
        let (t, reasons) = suggest(&Latencies::new(vec![ms(1); 100])).unwrap();
        assert_eq!(t.retry_period, ms(250));
        assert_eq!(t.renew_deadline, ms(750), "P + 2P");
        assert_eq!(t.lease_duration, ms(1750), "R + 1 s");
        assert_eq!(reasons.len(), 4);
    }

    #[test]
    fn a_slow_store_stretches_every_margin() {
        // p99 40 ms, one 900 ms outlier.
        let mut samples = vec![ms(40); 199];
        samples.push(ms(900));
        let (t, _) = suggest(&Latencies::new(samples)).unwrap();
        assert_eq!(t.retry_period, ms(800), "20 × p99");
        assert_eq!(t.renew_deadline, ms(800 + 3600), "P + 4 × max");
        assert_eq!(t.lease_duration, ms(4400 + 2200), "R + R / 2");
        assert!(
            t.renew_deadline - t.retry_period >= ms(40) * 4,
            "p99 ≤ a quarter of R − P"
        );
    }
}
