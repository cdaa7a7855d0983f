//! D, R, P and jitter, validated so that the safety gap exists.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::record::{LeaseDurationError, lease_to_millis};

/// The shortest retry period P (and so the lower end of R and D). A renewal
/// costs a store round trip (a Spanner commit alone takes milliseconds) and
/// the error backoff never waits less than 10 ms, so a shorter P buys no
/// faster failover, only load and scheduling noise larger than the period.
pub const MIN_RETRY_PERIOD: Duration = Duration::from_millis(10);

/// The longest lease duration D. A crashed leader keeps the lock for up to
/// D, and an hour without failover is a manual lock, not leader election.
/// It also keeps every instant computed from D, R and P (deadlines, expiry
/// on the store's i64-nanosecond clock, INT64 milliseconds in the row) many
/// orders of magnitude inside what the types hold, so no arithmetic on them
/// can overflow; R < D and P < R inherit the bound.
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(3600);

/// The elector's timing.
///
/// * `lease_duration` (D): how long the store considers a lease valid after
///   its last renewal.
/// * `renew_deadline` (R): how long the leader keeps claiming without a
///   successful renewal, measured from when that renewal was sent. D − R is
///   the safety gap that absorbs clock-rate drift and pauses.
/// * `retry_period` (P): how often the leader renews and followers poll.
/// * `jitter`: fraction of P added at random, to spread load: each wait is
///   P × (1 + u) with u uniform in [0, jitter), so P × (1 + jitter) must
///   stay below R.
///
/// Bounds: [`MIN_RETRY_PERIOD`] ≤ P < R < D ≤ [`MAX_LEASE_DURATION`], D a
/// whole number of milliseconds (the store keeps milliseconds), jitter in
/// [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timing {
    #[serde(with = "humantime_serde")]
    pub lease_duration: Duration,
    #[serde(with = "humantime_serde")]
    pub renew_deadline: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_period: Duration,
    pub jitter: f64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TimingError {
    #[error("{field} must be greater than zero")]
    Zero { field: &'static str },
    #[error(
        "renewDeadline ({renew:?}) must be shorter than leaseDuration ({lease:?}): the difference is the safety gap"
    )]
    RenewNotBelowLease { renew: Duration, lease: Duration },
    #[error(
        "retryPeriod ({retry:?}) must be shorter than renewDeadline ({renew:?}), or the leader cannot renew in time"
    )]
    RetryNotBelowRenew { retry: Duration, renew: Duration },
    #[error("jitter ({0}) must be between 0 and 1")]
    Jitter(f64),
    #[error("retryPeriod ({retry:?}) with jitter {jitter} can exceed renewDeadline ({renew:?})")]
    JitteredRetryTooLong {
        retry: Duration,
        jitter: f64,
        renew: Duration,
    },
    #[error("{field}: {message}")]
    Parse { field: &'static str, message: String },
    #[error("retryPeriod ({0:?}) must be at least {MIN_RETRY_PERIOD:?}")]
    RetryTooShort(Duration),
    /// D out of range or not storable; the message names leaseDuration.
    #[error(transparent)]
    Lease(#[from] LeaseDurationError),
}

impl Default for Timing {
    /// client-go's defaults: 15s / 10s / 2s.
    fn default() -> Self {
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            jitter: 0.2,
        }
    }
}

impl Timing {
    /// Builds and validates a timing.
    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
        jitter: f64,
    ) -> Result<Self, TimingError> {
        let timing = Timing {
            lease_duration,
            renew_deadline,
            retry_period,
            jitter,
        };
        timing.validate()?;
        Ok(timing)
    }

    /// Parses human durations ("10s", "1500ms") naming the field on error.
    pub fn parse(
        lease_duration: &str,
        renew_deadline: &str,
        retry_period: &str,
        jitter: f64,
    ) -> Result<Self, TimingError> {
        Timing::new(
            parse_duration("leaseDuration", lease_duration)?,
            parse_duration("renewDeadline", renew_deadline)?,
            parse_duration("retryPeriod", retry_period)?,
            jitter,
        )
    }

    /// D > R > P ≥ [`MIN_RETRY_PERIOD`], D within [`MAX_LEASE_DURATION`] and
    /// storable, and a jittered P still below R.
    pub fn validate(&self) -> Result<(), TimingError> {
        for (field, value) in [
            ("leaseDuration", self.lease_duration),
            ("renewDeadline", self.renew_deadline),
            ("retryPeriod", self.retry_period),
        ] {
            if value.is_zero() {
                return Err(TimingError::Zero { field });
            }
        }
        lease_to_millis("leaseDuration", self.lease_duration)?;
        if self.renew_deadline >= self.lease_duration {
            return Err(TimingError::RenewNotBelowLease {
                renew: self.renew_deadline,
                lease: self.lease_duration,
            });
        }
        if self.retry_period >= self.renew_deadline {
            return Err(TimingError::RetryNotBelowRenew {
                retry: self.retry_period,
                renew: self.renew_deadline,
            });
        }
        if self.retry_period < MIN_RETRY_PERIOD {
            return Err(TimingError::RetryTooShort(self.retry_period));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(TimingError::Jitter(self.jitter));
        }
        if self.retry_period.mul_f64(1.0 + self.jitter) >= self.renew_deadline {
            return Err(TimingError::JitteredRetryTooLong {
                retry: self.retry_period,
                jitter: self.jitter,
                renew: self.renew_deadline,
            });
        }
        Ok(())
    }

    /// The safety gap D − R.
    pub fn safety_gap(&self) -> Duration {
        self.lease_duration - self.renew_deadline
    }
}

/// Parses a human duration ("10s", "250ms", "1m 30s"), naming `field` on error.
pub fn parse_duration(field: &'static str, text: &str) -> Result<Duration, TimingError> {
    humantime::parse_duration(text.trim()).map_err(|e| TimingError::Parse {
        field,
        message: format!("invalid duration {text:?}: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Timing::default().validate().unwrap();
        assert_eq!(Timing::default().safety_gap(), Duration::from_secs(5));
    }

    #[test]
    fn each_bad_value_names_its_field() {
        let cases = [
            (("0s", "10s", "2s", 0.0), "leaseDuration must be greater than zero"),
            (("15s", "0s", "2s", 0.0), "renewDeadline must be greater than zero"),
            (("15s", "10s", "0s", 0.0), "retryPeriod must be greater than zero"),
            (
                ("10s", "10s", "2s", 0.0),
                "renewDeadline (10s) must be shorter than leaseDuration (10s)",
            ),
            (
                ("15s", "10s", "10s", 0.0),
                "retryPeriod (10s) must be shorter than renewDeadline (10s)",
            ),
            (("15s", "10s", "2s", 1.5), "jitter (1.5) must be between 0 and 1"),
            (
                ("15s", "10s", "9s", 0.5),
                "retryPeriod (9s) with jitter 0.5 can exceed renewDeadline (10s)",
            ),
            (("ten", "10s", "2s", 0.0), "leaseDuration: invalid duration \"ten\""),
            (("15s", "-1s", "2s", 0.0), "renewDeadline: invalid duration \"-1s\""),
            (
                ("1000000000y", "10s", "2s", 0.0),
                "leaseDuration (31557600000000000s) must be between 10ms and 3600s",
            ),
            (
                ("2h", "10s", "2s", 0.0),
                "leaseDuration (7200s) must be between 10ms and 3600s",
            ),
            (
                ("1500500us", "1s", "200ms", 0.0),
                "leaseDuration (1.5005s) must be a whole number of milliseconds",
            ),
            (("3s", "2s", "5ms", 0.0), "retryPeriod (5ms) must be at least 10ms"),
            (("15s", "10s", "2s", f64::NAN), "jitter (NaN) must be between 0 and 1"),
        ];
        for ((d, r, p, j), expected) in cases {
            let err = Timing::parse(d, r, p, j).unwrap_err().to_string();
            assert!(
                err.starts_with(expected),
                "{d}/{r}/{p}/{j}: got {err:?}, want {expected:?}"
            );
        }
    }

    #[test]
    fn parses_human_durations() {
        let t = Timing::parse("1500ms", "1s", "200ms", 0.1).unwrap();
        assert_eq!(t.lease_duration, Duration::from_millis(1500));
        assert_eq!(t.retry_period, Duration::from_millis(200));
    }
}
