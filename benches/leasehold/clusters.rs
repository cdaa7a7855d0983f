//! Failover across clusters (issue 37), without a cluster: two "clusters"
//! of two `leasehold sidecar --cluster-name <name>` processes each (west-0,
//! west-1, east-0, east-1) on one lock of one store (the emulator, a private
//! PostgreSQL or Redis server), each through a proxy of its own, at the
//! default D/R/P 15/10/2 s. Every candidate's `/leader` is polled every
//! 20 ms. Per repetition, with whichever cluster leads:
//!
//! - **killed**: kill -9 both of the leading cluster's candidates → time
//!   until a candidate of the other cluster says 200 (bound D + P); the two
//!   killed are started again (new identities) and follow;
//! - **cut off**: every proxy of the leading cluster closes its connections
//!   and refuses new ones → time until its leader stops claiming (bound R
//!   from its last successful renewal, which precedes the cut) and until a
//!   candidate of the other cluster leads (bound D + P); then the proxies
//!   forward again and the cut cluster follows.
//!
//! Safety is asserted at every poll, not timings: at most one candidate in
//! all clusters says 200, and a new term comes with a higher term number
//! and a higher token than every term before it.

use std::time::{Duration, Instant};

use leasehold::testing::ProxyMode;

use super::partitions::Place;
use super::sessions::Backend;
use super::support::*;
use super::{default_timing_flags, millis, summary};

const CLUSTERS: [&str; 2] = ["west", "east"];
const PER_CLUSTER: usize = 2;
const LOCK: &str = "bench-clusters";

/// The default timing the part runs at (`default_timing_flags`).
const D: Duration = Duration::from_secs(15);
const R: Duration = Duration::from_secs(10);
const P: Duration = Duration::from_secs(2);
/// How long a step may take before the repetition is given up.
const GIVE_UP: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);

/// The four candidates; candidate `i` is in cluster `i / PER_CLUSTER`.
struct TwoClusters {
    place: Place,
    sidecars: Vec<Sidecar>,
    /// Every sidecar started so far, for fresh names on restart.
    started: usize,
    /// The last term seen claimed and its token.
    last: Option<(u64, i64)>,
}

impl TwoClusters {
    fn start(backend: Backend) -> TwoClusters {
        let mut two = TwoClusters {
            place: Place::new(backend),
            sidecars: Vec::new(),
            started: 0,
            last: None,
        };
        for i in 0..CLUSTERS.len() * PER_CLUSTER {
            let sidecar = two.launch(i);
            two.sidecars.push(sidecar);
        }
        two
    }

    /// Candidate `i` of its cluster, a new identity each time.
    fn launch(&mut self, i: usize) -> Sidecar {
        let cluster = CLUSTERS[i / PER_CLUSTER];
        let name = format!("{cluster}-{}-{}", i % PER_CLUSTER, self.started);
        self.started += 1;
        let mut extra = default_timing_flags().to_vec();
        extra.extend(["--cluster-name", cluster, "--create-table"].map(String::from));
        self.place.launch(&name, LOCK, &extra)
    }

    /// One look at every candidate's `/leader`: the one claiming, if any.
    /// Panics on two claimants at once and on a new term that does not
    /// come with a higher term and token.
    fn poll(&mut self) -> Option<usize> {
        let claims: Vec<(usize, u64, i64)> = self
            .sidecars
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match get(s.http, "/leader") {
                Ok((200, view)) => Some((
                    i,
                    view["term"].as_u64().unwrap_or_default(),
                    token_of(&view).parse().unwrap_or_default(),
                )),
                _ => None,
            })
            .collect();
        let names = |c: &[(usize, u64, i64)]| {
            c.iter()
                .map(|(i, _, _)| self.sidecars[*i].name.clone())
                .collect::<Vec<_>>()
        };
        assert!(claims.len() <= 1, "two candidates claim at once: {:?}", names(&claims));
        let &(leader, term, token) = claims.first()?;
        if let Some((last_term, last_token)) = self.last
            && term != last_term
        {
            assert!(
                term > last_term && token > last_token,
                "term {term} (token {token}) of {} after term {last_term} (token {last_token})",
                self.sidecars[leader].name
            );
        }
        self.last = Some((term, token));
        Some(leader)
    }

    /// Polls until `done` says the step is over (given the claimant at
    /// that poll); the time it took, or `None` after [`GIVE_UP`].
    fn until(&mut self, mut done: impl FnMut(Option<usize>) -> bool) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < GIVE_UP {
            let leader = self.poll();
            if done(leader) {
                return Some(started.elapsed());
            }
            std::thread::sleep(POLL);
        }
        None
    }

    /// The candidate leading, once one does and the others have had two
    /// polls to follow it.
    fn settled_leader(&mut self) -> Option<usize> {
        let mut leader = None;
        self.until(|l| {
            leader = l;
            l.is_some()
        })?;
        let settle = Instant::now();
        self.until(|_| settle.elapsed() >= P * 2)?;
        leader
    }

    fn members(cluster: usize) -> std::ops::Range<usize> {
        cluster * PER_CLUSTER..(cluster + 1) * PER_CLUSTER
    }
}

/// The samples of one store.
#[derive(Default)]
struct Samples {
    killed: Vec<Duration>,
    stopped: Vec<Duration>,
    cut_off: Vec<Duration>,
}

/// Kill -9 of the leading cluster's candidates: until the other leads.
fn killed(two: &mut TwoClusters, rep: u64) -> Option<Duration> {
    let leader = two.settled_leader()?;
    let leading = leader / PER_CLUSTER;
    for i in TwoClusters::members(leading) {
        two.sidecars[i].signal("KILL");
    }
    let took = two.until(|l| l.is_some_and(|l| l / PER_CLUSTER != leading));
    for i in TwoClusters::members(leading) {
        let _ = two.sidecars[i].child.wait();
        let fresh = two.launch(i);
        two.sidecars[i] = fresh;
    }
    println!(
        "killed rep {rep}: {} led; the other cluster led {}",
        CLUSTERS[leading],
        took.map_or("never (given up)".into(), |t| format!("{:.0} ms later", millis(t)))
    );
    took
}

/// The leading cluster cut off from the store: until its leader stops
/// claiming, and until the other cluster leads.
fn cut_off(two: &mut TwoClusters, rep: u64) -> Option<(Duration, Duration)> {
    let leader = two.settled_leader()?;
    let leading = leader / PER_CLUSTER;
    for i in TwoClusters::members(leading) {
        two.sidecars[i].proxy.set(ProxyMode::Cut);
    }
    let cut = Instant::now();
    let mut stopped = None;
    let other_led = two.until(|l| {
        if stopped.is_none() && l != Some(leader) {
            stopped = Some(cut.elapsed());
        }
        l.is_some_and(|l| l / PER_CLUSTER != leading)
    });
    for i in TwoClusters::members(leading) {
        two.sidecars[i].proxy.set(ProxyMode::Forward);
    }
    let show = |t: Option<Duration>| t.map_or("never (given up)".into(), |t| format!("{:.0} ms", millis(t)));
    println!(
        "cut off rep {rep}: {} led; its leader stopped claiming after {}, the other cluster led after {}",
        CLUSTERS[leading],
        show(stopped),
        show(other_led)
    );
    Some((stopped?, other_led?))
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `reps` repetitions of each scenario on `backend`; summary lines.
pub fn failover_across_clusters(backend: Backend, reps: u64) -> Vec<String> {
    println!("load average at the start: {}", load());
    let mut two = TwoClusters::start(backend);
    let mut samples = Samples::default();
    for rep in 0..reps {
        samples.killed.extend(killed(&mut two, rep));
    }
    for rep in 0..reps {
        if let Some((stopped, other)) = cut_off(&mut two, rep) {
            samples.stopped.push(stopped);
            samples.cut_off.push(other);
        }
    }
    println!("load average at the end: {}", load());
    let raw = |s: &[Duration]| {
        s.iter()
            .map(|d| format!("{:.0}", millis(*d)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut lines = Vec::new();
    for (what, bound, bound_name, s) in [
        ("killed → the other cluster leads", D + P, "D + P", &mut samples.killed),
        ("cut off → its leader stops claiming", R, "R", &mut samples.stopped),
        (
            "cut off → the other cluster leads",
            D + P,
            "D + P",
            &mut samples.cut_off,
        ),
    ] {
        println!("{what} raw (ms): {}", raw(s));
        if s.is_empty() {
            lines.push(format!("{what}: no repetition completed"));
            continue;
        }
        let within = s.iter().filter(|d| **d <= bound).count();
        lines.push(format!(
            "{what}: {}; {bound_name} = {:.0} ms, within it {within} of {}",
            summary(s),
            millis(bound),
            s.len()
        ));
    }
    lines
}
