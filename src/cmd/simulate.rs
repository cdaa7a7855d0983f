//! `leasehold simulate`: its flags and the loop over seeds.

use std::time::Duration;

use crate::sim::{
    Mutant, Summary, hunt, simulate, simulate_kubernetes, simulate_rollouts, simulate_sessions, simulate_two_clusters,
};

/// `leasehold simulate`: run many seeds, print failures with their seed.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Number of seeds to run.
    #[arg(long, env = "LEASEHOLD_SIM_SEEDS", default_value_t = 1000)]
    pub seeds: u64,
    /// First seed.
    #[arg(long, env = "LEASEHOLD_SIM_FIRST_SEED", default_value_t = 0)]
    pub first_seed: u64,
    /// Simulated seconds per schedule.
    #[arg(long, env = "LEASEHOLD_SIM_SECONDS", default_value_t = 60)]
    pub seconds: u64,
    /// Print every event of each schedule (use with a single seed to replay).
    #[arg(long, env = "LEASEHOLD_SIM_VERBOSE")]
    pub verbose: bool,
    /// Run the sessions-and-lock-sets schedule instead of the elector's.
    #[arg(long, env = "LEASEHOLD_SIM_SESSIONS", conflicts_with = "rollouts")]
    pub sessions: bool,
    /// Run the rolling-update schedule (versions and `Newest`/`Oldest`)
    /// instead of the elector's.
    #[arg(long, env = "LEASEHOLD_SIM_ROLLOUTS")]
    pub rollouts: bool,
    /// Run the elector's schedule on the Kubernetes store's semantics
    /// (observed-change expiry, resourceVersion check-and-set, watches).
    #[arg(long, env = "LEASEHOLD_SIM_KUBERNETES", conflicts_with_all = ["sessions", "rollouts"])]
    pub kubernetes: bool,
    /// Run the elector's schedule with candidates in two clusters sharing
    /// the store, each cluster's operator releasing on pod deletion and
    /// repairing its pods' leader labels.
    #[arg(long, env = "LEASEHOLD_SIM_TWO_CLUSTERS", conflicts_with_all = ["sessions", "rollouts", "kubernetes"])]
    pub two_clusters: bool,
    /// Run a deliberately broken elector or store instead, stopping at the
    /// first seed that catches it; `list` names them.
    #[arg(long, env = "LEASEHOLD_SIM_MUTANT")]
    pub mutant: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let length = Duration::from_secs(args.seconds);
    let seeds = args.first_seed..args.first_seed + args.seeds;
    if let Some(name) = &args.mutant {
        if name == "list" {
            for mutant in Mutant::ALL {
                println!("{:<38} {}", mutant.name(), mutant.describe());
            }
            return Ok(());
        }
        let mutant: Mutant = name.parse()?;
        return match hunt(mutant, seeds, length) {
            Some(violation) => {
                println!("{violation}");
                println!("mutant {} caught by seed {}", mutant.name(), violation.seed);
                Ok(())
            }
            None => anyhow::bail!("mutant {} survived {} seeds", mutant.name(), args.seeds),
        };
    }
    let mut totals = Summary::default();
    let mut failed = Vec::new();
    for seed in seeds {
        let outcome = if args.sessions {
            simulate_sessions(seed, length)
        } else if args.rollouts {
            simulate_rollouts(seed, length)
        } else if args.kubernetes {
            simulate_kubernetes(seed, length)
        } else if args.two_clusters {
            simulate_two_clusters(seed, length)
        } else {
            simulate(seed, length)
        };
        match outcome {
            Ok(report) => {
                if args.verbose {
                    println!("{report}");
                }
                totals.add(&report);
            }
            Err(violation) => {
                if args.verbose {
                    // The whole log; the violation's own text ends with its last lines.
                    for e in violation.earlier_events() {
                        println!("  {e}");
                    }
                }
                println!("{violation}");
                failed.push(seed);
            }
        }
    }
    println!("{} seeds, {} failed; {totals}", args.seeds, failed.len());
    if !failed.is_empty() {
        anyhow::bail!("safety violated for seeds {failed:?}; replay one with --first-seed N --seeds 1 --verbose");
    }
    Ok(())
}
