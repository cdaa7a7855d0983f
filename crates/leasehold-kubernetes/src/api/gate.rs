//! The readiness probe the injection gives the sidecar of a readiness-gated
//! pod (`publishing.readinessGate`): the sidecar serves it, the injection
//! patch declares it, and the resource's validation refuses timings it
//! would keep failing. With the resource, so that each of them has it
//! whichever roles are built in.

/// The sidecar's readiness probe on readiness-gated pods (on the metrics
/// port): 200 only while this candidate leads with more than
/// [`GATE_PROBE_HOLD`] left before its deadline. A native sidecar's
/// readiness counts towards its pod's `Ready` (kubelet
/// `pkg/kubelet/status/generate.go`, restartable init containers are
/// checked with the app containers), so the kubelet turns a stalled or
/// lapsed leader's pod unready without the sidecar's help.
pub const GATE_PROBE_PATH: &str = "/gate";
pub const GATE_PROBE_PERIOD_SECONDS: i32 = 1;
pub const GATE_PROBE_TIMEOUT_SECONDS: i32 = 1;
/// One failure turns the container unready: the probe must not keep a
/// lapsed claim Ready for several periods.
pub const GATE_PROBE_FAILURE_THRESHOLD: i32 = 1;
/// How long the kubelet may keep the container ready after the last
/// success: the next probe starts within a period and fails within its
/// timeout (a frozen process accepts the connection but never answers).
pub const GATE_PROBE_HOLD: std::time::Duration =
    std::time::Duration::from_secs((GATE_PROBE_PERIOD_SECONDS + GATE_PROBE_TIMEOUT_SECONDS) as u64);
