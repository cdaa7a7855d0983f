//! `leasehold demo`: several candidates in one process on an embedded store
//! (or the Spanner emulator), a timeline of who leads, a crash failover and a
//! graceful handover, each timed, then a summary.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::timing::{DEFAULT_JITTER, parse_duration_flag};
use crate::lease::{Change, Elector, ElectorHandle, Identity, LeaderState, LeaseStore, Timing};
use crate::runtime::{StoreFlags, StoreKind};
use crate::sidecar::config::store_kind;
use crate::store::StoreUrl;
use crate::store::spanner::{DEFAULT_CALL_TIMEOUT, Endpoints, SpannerConfig, SpannerStore, create_emulator_database};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Number of candidates.
    #[arg(long, env = "LEASEHOLD_DEMO_CANDIDATES", default_value_t = 3, value_parser = clap::value_parser!(u16).range(2..=50))]
    pub candidates: u16,
    /// Store to elect on: memory (in this process), spanner (the Cloud
    /// Spanner emulator at SPANNER_EMULATOR_HOST), postgres or redis (at
    /// --store-url), kubernetes (Leases in the KUBECONFIG's namespace).
    #[arg(long, env = "LEASEHOLD_DEMO_STORE", value_parser = store_kind(), default_value = StoreKind::Memory.flag())]
    pub store: StoreKind,
    /// The PostgreSQL or Redis URL for --store postgres|redis; the demo
    /// creates the lease table when missing and uses a fresh lock.
    #[arg(long, env = "LEASEHOLD_DEMO_STORE_URL", hide_env_values = true)]
    pub store_url: Option<String>,
    /// Lease duration D [default: 3s].
    #[arg(long, env = "LEASEHOLD_DEMO_LEASE_DURATION", value_parser = parse_duration_flag)]
    pub lease_duration: Option<Duration>,
    /// Renew deadline R (< D) [default: D·2/3, so 2s].
    #[arg(long, env = "LEASEHOLD_DEMO_RENEW_DEADLINE", value_parser = parse_duration_flag)]
    pub renew_deadline: Option<Duration>,
    /// Retry period P (< R) [default: R/4, so 500ms].
    #[arg(long, env = "LEASEHOLD_DEMO_RETRY_PERIOD", value_parser = parse_duration_flag)]
    pub retry_period: Option<Duration>,
    /// How long each leader leads before the demo disturbs it.
    #[arg(long, env = "LEASEHOLD_DEMO_HOLD", default_value = "3s", value_parser = parse_duration_flag)]
    pub hold: Duration,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(transparent)]
    Timing(#[from] crate::lease::TimingError),
    #[error("store")]
    Store(#[from] crate::lease::StoreError),
    #[error(transparent)]
    Select(#[from] crate::runtime::SelectError),
    #[error("{0}")]
    Setup(String),
    #[error("no new leader within {0:?}; is the store reachable?")]
    NoLeader(Duration),
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

struct Candidate {
    name: String,
    handle: ElectorHandle,
    shutdown: CancellationToken,
}

/// Prints the timeline as transitions happen.
struct Timeline {
    start: Instant,
}

impl Timeline {
    fn line(&self, text: impl std::fmt::Display) {
        println!("[{:>7.3}s] {text}", self.start.elapsed().as_secs_f64());
    }

    fn follow(&self, name: String, mut transitions: broadcast::Receiver<LeaderState>) {
        let start = self.start;
        tokio::spawn(async move {
            let timeline = Timeline { start };
            while let Ok(state) = transitions.recv().await {
                let token = state.token.map(|t| t.to_string()).unwrap_or_default();
                match &state.change {
                    Change::Acquired => timeline.line(format!("{name} LEADS      term {} token {token}", state.term)),
                    Change::SteppingDown => {
                        timeline.line(format!("{name} stops claiming (term {}), releasing", state.term))
                    }
                    Change::Released => timeline.line(format!("{name} released   term {}", state.term)),
                    Change::ReleaseFailed(e) => timeline.line(format!("{name} release failed: {e}")),
                    Change::Lost(why) => timeline.line(format!("{name} lost       term {}: {why}", state.term)),
                    Change::DeadlineMissed => {
                        timeline.line(format!("{name} missed its renew deadline (term {})", state.term))
                    }
                    _ => {}
                }
            }
        });
    }
}

pub(crate) async fn run(args: Args) -> Result<()> {
    let timing = demo_timing().with_given(args.lease_duration, args.renew_deadline, args.retry_period)?;
    let store = connect(args.store, args.store_url.as_deref()).await?;
    store.ensure_schema().await?;
    let lock = format!("demo-{:08x}", rand::random::<u32>());
    let timeline = Timeline { start: Instant::now() };
    println!(
        "leasehold demo: {} candidates on the {} store, lock {lock}, D={:?} R={:?} P={:?}",
        args.candidates,
        store.kind(),
        timing.lease_duration,
        timing.renew_deadline,
        timing.retry_period
    );
    let start = |i: u16| {
        let name = format!("candidate-{i}");
        let shutdown = CancellationToken::new();
        let identity = Identity::new(None, Some("demo".into()), &name);
        let elector = Elector::new(&lock, identity, timing);
        timeline.follow(name.clone(), elector.transitions());
        let handle = elector.spawn(store.clone(), shutdown.clone());
        Candidate { name, handle, shutdown }
    };
    let mut candidates: Vec<Candidate> = (1..=args.candidates).map(start).collect();
    let wait = timing.lease_duration * 3;

    let first = wait_for_leader(&candidates, None, wait).await?;
    let first_state = candidates[first].handle.state();
    tokio::time::sleep(args.hold).await;

    // Crash: the leader dies without releasing, like kill -9.
    let crashed = candidates.remove(first);
    crashed.handle.abort();
    let crashed_at = Instant::now();
    timeline.line(format!(
        "{} CRASHES (kill -9, no release); the others wait for the lease to expire",
        crashed.name
    ));
    let second = wait_for_leader(&candidates, Some(&first_state), wait).await?;
    let failover = crashed_at.elapsed();
    timeline.line(format!(
        "failover took {} (the lease expires D = {:?} after its last renewal)",
        millis(failover),
        timing.lease_duration
    ));
    let second_state = candidates[second].handle.state();
    tokio::time::sleep(args.hold).await;

    // Graceful: the leader stops claiming, releases, and tells the others.
    let leaving = candidates.remove(second);
    let handover_from = Instant::now();
    timeline.line(format!("{} SHUTS DOWN gracefully (SIGTERM)", leaving.name));
    leaving.shutdown.cancel();
    leaving.handle.join().await;
    for c in &candidates {
        // What the pod-label watch does in a cluster: look now, not at the next poll.
        c.handle.nudge();
    }
    let third = wait_for_leader(&candidates, Some(&second_state), wait).await?;
    let handover = handover_from.elapsed();
    timeline.line(format!(
        "handover took {} (release, then followers nudged)",
        millis(handover)
    ));
    let third_state = candidates[third].handle.state();
    timeline.line("demo done; shutting the remaining candidates down");

    for c in &candidates {
        c.shutdown.cancel();
    }
    for c in candidates {
        c.handle.join().await;
    }
    println!();
    println!(
        "summary ({} store, D={:?} R={:?} P={:?})",
        store.kind(),
        timing.lease_duration,
        timing.renew_deadline,
        timing.retry_period
    );
    for (what, state) in [
        ("first leader", &first_state),
        ("after crash", &second_state),
        ("after handover", &third_state),
    ] {
        println!(
            "  {what:<15} {:<28} term {:<3} token {}",
            state.holder.as_deref().unwrap_or("-"),
            state.term,
            state.token.map(|t| t.to_string()).unwrap_or_default()
        );
    }
    println!("  crash failover    {}", millis(failover));
    println!("  graceful handover {}", millis(handover));
    let increasing = first_state.token < second_state.token && second_state.token < third_state.token;
    println!("  tokens strictly increased: {}", if increasing { "yes" } else { "NO" });
    Ok(())
}

/// The demo's own defaults, shorter than [`Timing::default`] so that a
/// failover shows within seconds; flags not given follow them in their ratio.
fn demo_timing() -> Timing {
    Timing {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(500),
        jitter: DEFAULT_JITTER,
    }
}

fn millis(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Waits until one candidate leads with a term newer than `after`.
async fn wait_for_leader(candidates: &[Candidate], after: Option<&LeaderState>, within: Duration) -> Result<usize> {
    let min_term = after.map_or(1, |s| s.term + 1);
    let waits = candidates.iter().map(|c| {
        let mut rx = c.handle.subscribe();
        Box::pin(async move { rx.wait_for(|s| s.leader && s.term >= min_term).await.is_ok() })
    });
    let any = futures::future::select_all(waits);
    match tokio::time::timeout(within, any).await {
        Ok((true, index, _)) => Ok(index),
        _ => Err(Error::NoLeader(within)),
    }
}

async fn connect(store: StoreKind, url: Option<&str>) -> Result<Arc<dyn LeaseStore>> {
    let url = url.map(StoreUrl::new);
    match (store, url) {
        (StoreKind::Postgres | StoreKind::Redis, None) => {
            Err(Error::Setup("--store postgres|redis needs --store-url".into()))
        }
        (StoreKind::Spanner, None) => {
            if std::env::var("SPANNER_EMULATOR_HOST").map_or(true, |h| h.is_empty()) {
                return Err(Error::Setup(
                    "--store spanner elects on the Cloud Spanner emulator: set SPANNER_EMULATOR_HOST=host:port".into(),
                ));
            }
            let endpoints = Endpoints::from_env();
            let database = create_emulator_database(&endpoints, "leasehold-demo", "demo", "demo").await?;
            let config = SpannerConfig {
                database,
                table: crate::api::DEFAULT_TABLE.into(),
            };
            Ok(Arc::new(
                SpannerStore::connect_to(config, endpoints, DEFAULT_CALL_TIMEOUT).await?,
            ))
        }
        (kind, url) => Ok(StoreFlags {
            kind: Some(kind),
            url,
            ..StoreFlags::default()
        }
        .choose()?
        .connect(false)
        .await?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn timing(argv: &[&str]) -> Result<Timing> {
        let cli = Cli::try_parse_from(std::iter::once("demo").chain(argv.iter().copied())).unwrap();
        Ok(demo_timing().with_given(cli.args.lease_duration, cli.args.renew_deadline, cli.args.retry_period)?)
    }

    #[test]
    fn the_demo_defaults_hold_and_a_lease_duration_alone_scales_them() {
        assert_eq!(timing(&[]).unwrap(), demo_timing());
        let t = timing(&["--lease-duration", "600ms"]).unwrap();
        assert_eq!(
            (t.renew_deadline, t.retry_period),
            (Duration::from_millis(400), Duration::from_millis(100))
        );
    }

    #[test]
    fn a_bad_duration_is_rejected_by_clap_naming_the_flag() {
        let err = Cli::try_parse_from(["demo", "--retry-period", "10x"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("invalid value '10x' for '--retry-period"), "{err}");
    }
}
