//! The renewal budget R − P: how the latencies of renewals are summed up,
//! and the share of the budget their p99 may use before the timing is at
//! risk. The sidecar's meter (`sidecar::budget`) warns at that share and
//! `leasehold advise` suggests timings that stay below it.

use std::time::Duration;

/// Renewal p99 above this share of R − P puts the timing at risk.
pub const AT_RISK_SHARE: f64 = 0.25;

/// Latencies of one kind of call, sorted.
#[derive(Debug, Clone, PartialEq)]
pub struct Latencies(Vec<Duration>);

impl Latencies {
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        Latencies(samples)
    }

    /// The `q` quantile (nearest rank), zero without samples.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1]
    }

    pub fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let l = Latencies::new((1..=100).rev().map(ms).collect());
        assert_eq!(l.quantile(0.5), ms(50));
        assert_eq!(l.quantile(0.99), ms(99));
        assert_eq!(l.max(), ms(100));
        assert_eq!(Latencies::new(vec![]).quantile(0.99), Duration::ZERO);
    }
}
