//! The candidate's own clock: monotonic time on tokio's clock, so tests can
//! pause and advance it, and the jitter that spreads renewals.
//!
//! The local clock only ever measures *durations since a send*; it never
//! judges whether a lease expired. That is the store's clock's job.

use std::time::Duration;

use rand::{RngExt, SeedableRng, rngs::StdRng};
pub use tokio::time::Instant;

/// Monotonic now on tokio's (pausable) clock.
pub fn now() -> Instant {
    Instant::now()
}

/// A source of jitter; seeded in simulations so schedules replay exactly.
#[derive(Debug)]
pub struct Jitter {
    rng: StdRng,
    fraction: f64,
}

impl Jitter {
    pub fn new(fraction: f64, seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_rng(&mut rand::rng()),
        };
        Jitter { rng, fraction }
    }

    pub fn set_fraction(&mut self, fraction: f64) {
        self.fraction = fraction;
    }

    /// `base` plus a random share of `base * fraction`.
    pub fn apply(&mut self, base: Duration) -> Duration {
        if self.fraction <= 0.0 {
            return base;
        }
        base + base.mul_f64(self.rng.random_range(0.0..self.fraction))
    }

    /// A seed for another random source (backoff), drawn from this one so a
    /// simulation stays replayable.
    pub fn seed(&mut self) -> u64 {
        self.rng.random()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_fraction_and_replays_from_a_seed() {
        let mut a = Jitter::new(0.5, Some(7));
        let mut b = Jitter::new(0.5, Some(7));
        for _ in 0..100 {
            let x = a.apply(Duration::from_secs(2));
            assert!(x >= Duration::from_secs(2) && x < Duration::from_secs(3), "{x:?}");
            assert_eq!(x, b.apply(Duration::from_secs(2)));
        }
    }

    #[test]
    fn zero_fraction_means_no_jitter() {
        assert_eq!(
            Jitter::new(0.0, None).apply(Duration::from_secs(1)),
            Duration::from_secs(1)
        );
    }
}
