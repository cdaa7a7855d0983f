//! The watchdog: a small process between the runner and the command that
//! stops the command by the lease deadline even when the runner cannot.
//!
//! Why a separate process: a runner that is stopped (SIGSTOP, a frozen
//! cgroup, a debugger) or stalled runs none of its threads, so it cannot
//! signal its command however its timers are set; `PR_SET_PDEATHSIG` fires on
//! death, not on a stop. The runner therefore re-executes itself as
//! `leasehold __watchdog`, which starts the command in a process group of its
//! own and receives every new leader deadline on a pipe (fd 3). The watchdog
//! starts the stop sequence (SIGTERM to the group, SIGKILL after the grace
//! period) at whichever comes first: the deadline, a `stop` from the runner,
//! or the end of the pipe (the runner died). So the command is gone by
//! `deadline + grace`, before the lease can expire, whatever the runner does.
//!
//! The deadline crosses the process boundary as an absolute `CLOCK_MONOTONIC`
//! reading (the clock behind `Instant` on Linux, shared by all processes),
//! never as "time left", which a delayed reader would stretch.

use std::os::fd::{FromRawFd, OwnedFd};
use std::time::Duration;

use futures::future::BoxFuture;
use rustix::io::{FdFlags, fcntl_setfd};
use rustix::process::{Pid, Signal, getpid, getppid, kill_process_group, set_parent_process_death_signal};
use rustix::time::{ClockId, clock_gettime};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tracing::{debug, info, warn};

/// The pipe from the runner, as the watchdog sees it.
pub(crate) const HEARTBEAT_FD: i32 = 3;

/// What the runner tells the watchdog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heartbeat {
    /// The leader's new deadline: stop the command by then unless a later one arrives.
    Deadline(Instant),
    /// Stop the command now, starting with this signal.
    Stop(i32),
}

impl Heartbeat {
    /// One line of the pipe protocol.
    pub(crate) fn encode(&self) -> String {
        match self {
            Heartbeat::Deadline(at) => format!("deadline {}\n", to_monotonic_nanos(*at)),
            Heartbeat::Stop(signal) => format!("stop {signal}\n"),
        }
    }

    /// Parses one line; anything unreadable is `None`, which the watchdog
    /// treats as a stop (fail safe).
    pub(crate) fn decode(line: &str) -> Option<Heartbeat> {
        match line.trim().split_once(' ')? {
            ("deadline", nanos) => Some(Heartbeat::Deadline(from_monotonic_nanos(nanos.parse().ok()?))),
            ("stop", signal) => Some(Heartbeat::Stop(signal.parse().ok()?)),
            _ => None,
        }
    }
}

fn monotonic_nanos() -> i128 {
    let now = clock_gettime(ClockId::Monotonic);
    i128::from(now.tv_sec) * 1_000_000_000 + i128::from(now.tv_nsec)
}

/// `at` as a `CLOCK_MONOTONIC` reading. The raw clock is read before
/// `Instant::now()`, so the result errs early, never late.
fn to_monotonic_nanos(at: Instant) -> i128 {
    let raw = monotonic_nanos();
    let now = Instant::now();
    let ahead = at.saturating_duration_since(now).as_nanos() as i128;
    let behind = now.saturating_duration_since(at).as_nanos() as i128;
    raw + ahead - behind
}

/// The inverse; `Instant::now()` is read before the raw clock, so again the
/// result errs early.
fn from_monotonic_nanos(nanos: i128) -> Instant {
    let now = Instant::now();
    let offset = nanos - monotonic_nanos();
    let magnitude = Duration::from_nanos(offset.unsigned_abs().min(u64::MAX as u128) as u64);
    if offset >= 0 {
        now + magnitude
    } else {
        now.checked_sub(magnitude).unwrap_or(now)
    }
}

/// The command's process group, as the supervisor drives it.
pub(crate) trait ProcessGroup: Send {
    /// Sends `signal` to every process in the group.
    fn signal(&mut self, signal: i32);
    /// Resolves with the command's exit code (128 + signal when killed);
    /// cancel safe.
    fn exited(&mut self) -> BoxFuture<'_, i32>;
}

/// Runs the command's stop rules until it exits; returns its exit code.
///
/// The stop sequence starts at the deadline, on `Stop`, or when the runner
/// is gone (the channel closed), and SIGKILL follows `grace` after the
/// earlier of that moment and the deadline: never later than `deadline + grace`.
pub(crate) async fn supervise(
    mut group: impl ProcessGroup,
    mut heartbeats: mpsc::UnboundedReceiver<Heartbeat>,
    mut deadline: Instant,
    grace: Duration,
) -> i32 {
    // When SIGKILL is due, once the stop sequence has begun.
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    loop {
        let stopping = kill_at.is_some();
        let stop_with = tokio::select! {
            code = group.exited() => return code,
            heartbeat = heartbeats.recv(), if !stopping => match heartbeat {
                Some(Heartbeat::Deadline(at)) => {
                    deadline = deadline.max(at);
                    continue;
                }
                Some(Heartbeat::Stop(signal)) => {
                    debug!(signal, "the runner stops the command");
                    signal
                }
                None => {
                    warn!("the runner is gone; stopping the command");
                    Signal::TERM.as_raw()
                }
            },
            _ = sleep_until(deadline), if !stopping => {
                warn!("the lease deadline passed without a renewal reaching the watchdog; stopping the command");
                Signal::TERM.as_raw()
            }
            _ = sleep_until(kill_at.unwrap_or(deadline)), if stopping && !killed => {
                warn!(?grace, "the command outlived its grace period; SIGKILL");
                group.signal(Signal::KILL.as_raw());
                killed = true;
                continue;
            }
        };
        group.signal(stop_with);
        kill_at = Some(Instant::now().min(deadline) + grace);
    }
}

/// The command's real process group.
struct OsGroup {
    child: tokio::process::Child,
    pgid: Pid,
}

/// kill(2) to the whole group; the heartbeat protocol carries raw signal numbers.
fn signal_group(pgid: Pid, signal: i32) -> std::io::Result<()> {
    let signal = Signal::from_named_raw(signal)
        .ok_or_else(|| std::io::Error::other(format!("{signal} is not a signal this system names")))?;
    Ok(kill_process_group(pgid, signal)?)
}

impl ProcessGroup for OsGroup {
    fn signal(&mut self, signal: i32) {
        if let Err(e) = signal_group(self.pgid, signal) {
            debug!(signal, error = %e, "signalling the command's group");
        }
    }

    fn exited(&mut self) -> BoxFuture<'_, i32> {
        Box::pin(async move {
            match self.child.wait().await {
                Ok(status) => exit_code(status),
                Err(e) => {
                    warn!(error = %e, "cannot wait for the command");
                    1
                }
            }
        })
    }
}

/// A shell's convention: the exit code, or 128 + the signal that ended it.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}

/// `leasehold __watchdog`: started by the runner, never by hand.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Time between SIGTERM and SIGKILL.
    #[arg(long, env = "LEASEHOLD_GRACE_PERIOD", value_parser = crate::lease::timing::parse_duration_flag)]
    pub grace_period: Duration,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    pub command: Vec<String>,
}

/// The watchdog process: returns the command's exit code (126/127 when it
/// cannot start, as a shell does).
pub(crate) async fn run(args: Args) -> std::io::Result<i32> {
    // Signals to our process group are the runner's to act on: listening
    // keeps them from killing us, and a handled signal (unlike an ignored
    // one) is back to its default in the command.
    use tokio::signal::unix::{SignalKind, signal};
    for kind in [SignalKind::terminate(), SignalKind::interrupt(), SignalKind::hangup()] {
        let mut stream = signal(kind)?;
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                debug!(
                    signal = kind.as_raw_value(),
                    "signal to the watchdog; the runner decides"
                );
            }
        });
    }
    // SAFETY: the runner put the pipe's read end at HEARTBEAT_FD for us alone.
    let fd = unsafe { OwnedFd::from_raw_fd(HEARTBEAT_FD) };
    // The command must not inherit it.
    fcntl_setfd(&fd, FdFlags::CLOEXEC)?;
    let mut lines = BufReader::new(tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?).lines();
    let deadline = match lines.next_line().await?.as_deref().and_then(Heartbeat::decode) {
        Some(Heartbeat::Deadline(at)) if at > Instant::now() => at,
        first => {
            warn!(?first, "no future deadline from the runner; not starting the command");
            return Ok(1);
        }
    };
    let mut command = tokio::process::Command::new(&args.command[0]);
    command.args(&args.command[1..]).process_group(0);
    let watchdog = getpid();
    // SAFETY: only async-signal-safe calls between fork and exec (rustix's
    // are raw system calls, without allocation or locks).
    unsafe {
        command.pre_exec(move || {
            // If the watchdog itself is killed, its command dies with it
            // (the group's other members are the watchdog's job while it lives).
            set_parent_process_death_signal(Some(Signal::KILL))?;
            if getppid() != Some(watchdog) {
                return Err(std::io::Error::other("the watchdog died while starting the command"));
            }
            Ok(())
        });
    }
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            warn!(command = %args.command[0], error = %e, "cannot start the command");
            return Ok(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    // A group id of 0 would signal our own group: a child without an id has
    // already been reaped, so there is nothing to supervise.
    let Some(pgid) = child.id().and_then(|id| Pid::from_raw(id as i32)) else {
        return Ok(1);
    };
    info!(pid = pgid.as_raw_nonzero().get(), command = %args.command[0], "started the command in its own process group");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let heartbeat = match lines.next_line().await {
                Ok(Some(line)) => Heartbeat::decode(&line).unwrap_or_else(|| {
                    warn!(%line, "unreadable message from the runner; stopping the command");
                    Heartbeat::Stop(Signal::TERM.as_raw())
                }),
                // The runner is gone: dropping the sender says so.
                Ok(None) | Err(_) => return,
            };
            if tx.send(heartbeat).is_err() {
                return;
            }
        }
    });
    let code = supervise(OsGroup { child, pgid }, rx, deadline, args.grace_period).await;
    // Whatever the command left behind in its group goes with it.
    if let Err(e) = kill_process_group(pgid, Signal::KILL) {
        debug!(error = %e, "killing what is left of the command's group");
    }
    info!(code, "the command ended");
    Ok(code)
}
