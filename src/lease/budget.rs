//! The renewal budget R − P: how the latencies of renewals are summed up,
//! and the share of the budget their p99 may use before the timing is at
//! risk. The sidecar's meter (`sidecar::budget`) warns at that share and
//! `leasehold advise` suggests timings that stay below it.

use std::time::Duration;

/// Renewal p99 above this share of R − P puts the timing at risk.
pub const AT_RISK_SHARE: f64 = 0.25;

/// Latencies of one kind of call, sorted.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(not(feature = "sidecar"), allow(dead_code))]
pub(crate) struct Latencies(Vec<Duration>);

impl Latencies {
    #[cfg_attr(not(feature = "sidecar"), allow(dead_code))]
    pub(crate) fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        Latencies(samples)
    }

    /// The `q` quantile (nearest rank), zero without samples.
    #[cfg_attr(not(feature = "sidecar"), allow(dead_code))]
    pub(crate) fn quantile(&self, q: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1]
    }

    #[cfg_attr(not(feature = "cli"), allow(dead_code))]
    pub(crate) fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }

    #[cfg_attr(not(feature = "cli"), allow(dead_code))]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
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
