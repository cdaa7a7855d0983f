//! D, R, P and jitter, validated so that the safety gap exists.

use std::time::Duration;

use serde::{Deserialize, Serialize};

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

/// A lease duration that cannot be stored or was stored out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseDurationError {
    #[error("{field} ({value}) must be between {MIN_RETRY_PERIOD:?} and {MAX_LEASE_DURATION:?}")]
    OutOfRange { field: &'static str, value: String },
    #[error("{field} ({value:?}) must be a whole number of milliseconds: the store keeps milliseconds")]
    SubMillisecond { field: &'static str, value: Duration },
}

/// The lease duration in the store's unit (INT64 milliseconds). Every
/// write of a lease duration goes through here, so nothing is truncated or
/// wraps on its way into a row.
pub fn lease_to_millis(field: &'static str, lease: Duration) -> Result<i64, LeaseDurationError> {
    if !(MIN_RETRY_PERIOD..=MAX_LEASE_DURATION).contains(&lease) {
        return Err(LeaseDurationError::OutOfRange {
            field,
            value: format!("{lease:?}"),
        });
    }
    if !lease.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(LeaseDurationError::SubMillisecond { field, value: lease });
    }
    // In range, so at most 3.6e6: fits.
    Ok(lease.as_millis() as i64)
}

/// A stored lease duration back from milliseconds. A row whose duration is
/// out of range is refused, never clamped: a lease read as 0 ms would look
/// expired and let a second leader in.
pub fn lease_from_millis(field: &'static str, millis: i64) -> Result<Duration, LeaseDurationError> {
    let lease = u64::try_from(millis).ok().map(Duration::from_millis);
    match lease {
        Some(lease) if (MIN_RETRY_PERIOD..=MAX_LEASE_DURATION).contains(&lease) => Ok(lease),
        _ => Err(LeaseDurationError::OutOfRange {
            field,
            value: format!("{millis}ms"),
        }),
    }
}

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

/// D by default: client-go's 15 s.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// R by default: client-go's 10 s.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// P by default: client-go's 2 s.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// Jitter by default: P grows by up to 20 %, still far below R.
pub const DEFAULT_JITTER: f64 = 0.2;

impl Default for Timing {
    /// [`DEFAULT_LEASE_DURATION`], [`DEFAULT_RENEW_DEADLINE`],
    /// [`DEFAULT_RETRY_PERIOD`] and [`DEFAULT_JITTER`].
    fn default() -> Self {
        Timing {
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
            jitter: DEFAULT_JITTER,
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

    /// `self` (the defaults) with the values given; each value not given
    /// follows the next longer one in the defaults' ratio (15:10:2 for
    /// [`Timing::default`]): R from D, P from R. So `D = 5s` alone gives
    /// R = 3.333s and P = 666ms; R alone keeps the default D and scales P.
    /// Derived values are truncated to whole milliseconds. Validated.
    pub fn with_given(
        self,
        lease_duration: Option<Duration>,
        renew_deadline: Option<Duration>,
        retry_period: Option<Duration>,
    ) -> Result<Self, TimingError> {
        let lease_duration = lease_duration.unwrap_or(self.lease_duration);
        let renew_deadline =
            renew_deadline.unwrap_or_else(|| in_ratio(lease_duration, self.renew_deadline, self.lease_duration));
        let retry_period =
            retry_period.unwrap_or_else(|| in_ratio(renew_deadline, self.retry_period, self.renew_deadline));
        Timing::new(lease_duration, renew_deadline, retry_period, self.jitter)
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

/// `value · numerator / denominator`, truncated to whole milliseconds.
fn in_ratio(value: Duration, numerator: Duration, denominator: Duration) -> Duration {
    let millis = value.as_nanos() * numerator.as_nanos() / denominator.as_nanos().max(1) / 1_000_000;
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

/// Parses a human duration ("10s", "250ms", "1m 30s"), naming `field` on error.
pub fn parse_duration(field: &'static str, text: &str) -> Result<Duration, TimingError> {
    parse_duration_flag(text).map_err(|e| TimingError::Parse {
        field,
        message: format!("invalid duration {text:?}: {e}"),
    })
}

/// The same parser as clap's `value_parser` for duration flags: clap names
/// the flag and the value in its error.
pub fn parse_duration_flag(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text.trim())
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

    fn given(d: Option<&str>, r: Option<&str>, p: Option<&str>) -> Result<Timing, TimingError> {
        let parse = |text: Option<&str>| text.map(|t| parse_duration_flag(t).unwrap());
        Timing::default().with_given(parse(d), parse(r), parse(p))
    }

    #[test]
    fn nothing_given_is_the_defaults() {
        assert_eq!(given(None, None, None).unwrap(), Timing::default());
        assert_eq!(
            (DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD),
            (Duration::from_secs(15), Duration::from_secs(10), Duration::from_secs(2))
        );
    }

    #[test]
    fn a_lease_duration_alone_brings_r_and_p_in_the_default_ratio() {
        let t = given(Some("5s"), None, None).unwrap();
        assert_eq!(t.renew_deadline, Duration::from_millis(3333));
        assert_eq!(t.retry_period, Duration::from_millis(666));
        assert_eq!(t.jitter, DEFAULT_JITTER);
        let t = given(Some("30s"), None, None).unwrap();
        assert_eq!(
            (t.renew_deadline, t.retry_period),
            (Duration::from_secs(20), Duration::from_secs(4))
        );
    }

    #[test]
    fn a_renew_deadline_without_retry_period_brings_p_in_the_ratio_and_keeps_d() {
        let t = given(None, Some("5s"), None).unwrap();
        assert_eq!(t.lease_duration, DEFAULT_LEASE_DURATION);
        assert_eq!(t.retry_period, Duration::from_secs(1));
        let t = given(Some("4s"), Some("3s"), None).unwrap();
        assert_eq!(t.retry_period, Duration::from_millis(600));
    }

    #[test]
    fn given_values_are_kept_and_still_validated() {
        let t = given(Some("6s"), Some("4s"), Some("1s")).unwrap();
        assert_eq!(
            (t.lease_duration, t.renew_deadline, t.retry_period),
            (Duration::from_secs(6), Duration::from_secs(4), Duration::from_secs(1))
        );
        assert_eq!(
            given(Some("5s"), Some("6s"), None).unwrap_err(),
            TimingError::RenewNotBelowLease {
                renew: Duration::from_secs(6),
                lease: Duration::from_secs(5)
            }
        );
        assert_eq!(
            given(None, Some("20s"), None).unwrap_err(),
            TimingError::RenewNotBelowLease {
                renew: Duration::from_secs(20),
                lease: DEFAULT_LEASE_DURATION
            }
        );
    }

    #[test]
    fn other_defaults_give_their_own_ratio() {
        let demo = Timing::new(
            Duration::from_secs(3),
            Duration::from_secs(2),
            Duration::from_millis(500),
            DEFAULT_JITTER,
        )
        .unwrap();
        let t = demo.with_given(Some(Duration::from_millis(600)), None, None).unwrap();
        assert_eq!(
            (t.renew_deadline, t.retry_period),
            (Duration::from_millis(400), Duration::from_millis(100))
        );
    }

    #[test]
    fn the_flag_parser_rejects_what_the_field_parser_rejects() {
        assert_eq!(parse_duration_flag(" 1500ms "), Ok(Duration::from_millis(1500)));
        assert!(parse_duration_flag("ten").is_err());
        assert!(parse_duration_flag("-1s").is_err());
    }

    #[test]
    fn lease_durations_round_trip_through_milliseconds_or_are_refused() {
        for lease in [MIN_RETRY_PERIOD, Duration::from_millis(1500), MAX_LEASE_DURATION] {
            let ms = lease_to_millis("leaseDuration", lease).unwrap();
            assert_eq!(lease_from_millis("lease_ms", ms).unwrap(), lease);
        }
        let refused = [
            (Duration::ZERO, "leaseDuration (0ns) must be between 10ms and 3600s"),
            (
                MAX_LEASE_DURATION + Duration::from_millis(1),
                "leaseDuration (3600.001s) must be between",
            ),
            (
                Duration::from_secs(31_557_600 * 1_000_000_000),
                "leaseDuration (31557600000000000s) must be between",
            ),
            (
                Duration::from_micros(1_500_500),
                "leaseDuration (1.5005s) must be a whole number of milliseconds",
            ),
        ];
        for (lease, expected) in refused {
            let err = lease_to_millis("leaseDuration", lease).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{lease:?}: got {err:?}");
        }
        for stored in [0, -1, i64::MIN, i64::MAX, 3_600_001] {
            let err = lease_from_millis("lease_ms", stored).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("lease_ms ({stored}ms) must be between")),
                "{err}"
            );
        }
    }
}
