//! Whole processes: `leasehold run` candidates on one Cloud Spanner emulator,
//! each running a shell command that appends `start`/`tick`/`term`/`exit`
//! lines with its token, pid and a timestamp to one shared file. Appends
//! are ordered by the kernel, so the file's order is the ground truth: the
//! lines of one command must all come before the first line of the next
//! (never two alive at once), and tokens must increase.
//!
//! Timing: D = 2 s, R = 1.5 s, P = 300 ms (tests/support), grace = (D − R)/2
//! = 250 ms. Bounds add a stated margin for starting the watchdog and the
//! shell.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::support::{D, P, R, lease_database};
use leasehold::lease::{LeaseRecord, LeaseStore};
use leasehold::store::spanner::{SpannerConfig, SpannerStore};
use leasehold::testing::Emulator;

const GRACE: Duration = Duration::from_millis(250);
/// Starting `leasehold __watchdog` and the shell, and writing the first line.
const START_MARGIN: Duration = Duration::from_millis(400);

/// The command: `cmd.sh LOG TICKS CODE` writes `start`, then a `tick` every
/// 50 ms (TICKS of them, forever with 0), then `exit` and exits CODE;
/// SIGTERM writes `term` and exits 143. The SIGTERM goes to the whole
/// process group, so the time comes from bash itself (`EPOCHREALTIME`, in
/// microseconds), never from a child process the signal could kill first.
const SCRIPT: &str = r#"#!/bin/bash
log="$1"
line() { echo "$1 $LEASEHOLD_TOKEN $$ ${EPOCHREALTIME/./}000 $LEASEHOLD_TERM $LEASEHOLD_HOLDER" >> "$log"; }
line start
trap 'line term; exit 143' TERM
n=0
while [ "$2" = 0 ] || [ "$n" -lt "$2" ]; do line tick; sleep 0.05; n=$((n + 1)); done
line exit
exit "$3"
"#;

struct Setup {
    emulator: Emulator,
    config: SpannerConfig,
    dir: PathBuf,
    log: PathBuf,
    runtime: tokio::runtime::Runtime,
    store: SpannerStore,
}

impl Setup {
    /// The lease row now, as the store sees it.
    fn record(&self) -> LeaseRecord {
        self.runtime
            .block_on(self.store.observe("run"))
            .unwrap()
            .record
            .expect("a lease row")
    }
}

fn setup() -> Setup {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let emulator = Emulator::start_or_connect();
    let (config, store) = runtime.block_on(lease_database(&emulator));
    let dir = std::env::temp_dir().join(format!("leasehold-run-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("cmd.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    let log = dir.join("log");
    std::fs::write(&log, "").unwrap();
    Setup {
        emulator,
        config,
        dir,
        log,
        runtime,
        store,
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        // The runners were killed first; their watchdogs stop the commands,
        // which write a last line.
        std::thread::sleep(GRACE + Duration::from_millis(200));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Runner {
    child: Child,
}

impl Runner {
    fn start(setup: &Setup, name: &str, ticks: u32, code: i32) -> Runner {
        let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["run", "--lock", "run", "--database", &setup.config.database])
            .args([
                "--table",
                &setup.config.table,
                "--pod-name",
                name,
                "--kubernetes",
                "false",
            ])
            .env("LEASEHOLD_LEASE_DURATION", "2s")
            .env("LEASEHOLD_RENEW_DEADLINE", "1500ms")
            .env("LEASEHOLD_RETRY_PERIOD", "300ms")
            .env("SPANNER_EMULATOR_HOST", &setup.emulator.host)
            .env("SPANNER_EMULATOR_REST", &setup.emulator.rest)
            .env("LEASEHOLD_LOG", "warn")
            .arg("--")
            .arg("bash")
            .arg(setup.dir.join("cmd.sh"))
            .arg(&setup.log)
            .args([ticks.to_string(), code.to_string()])
            .stdin(Stdio::null())
            .spawn()
            .expect("leasehold run starts");
        Runner { child }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal}");
    }

    fn wait_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < within {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Line {
    kind: String,
    token: i64,
    pid: i32,
    at_nanos: i64,
    /// The runner's pod name.
    holder: String,
}

fn read_log(path: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(path).unwrap();
    // A line still being appended is read at the next poll.
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Line {
                kind: f[0].into(),
                token: f[1].parse().unwrap(),
                pid: f[2].parse().unwrap(),
                at_nanos: f[3].parse().unwrap(),
                holder: f[5].split('#').next().unwrap().into(),
            }
        })
        .collect()
}

/// Every command's lines form one block, and tokens increase from block to
/// block: no two commands were ever alive at once.
fn assert_one_at_a_time(lines: &[Line]) -> Vec<i64> {
    let mut blocks: Vec<i64> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if blocks.last() != Some(&line.token) {
            assert!(
                !blocks.contains(&line.token),
                "line {i}: command {} wrote again after command {} started: {lines:#?}",
                line.token,
                blocks.last().unwrap()
            );
            assert!(
                blocks.last().is_none_or(|last| *last < line.token),
                "line {i}: token {} after {:?}",
                line.token,
                blocks.last()
            );
            assert_eq!(line.kind, "start", "line {i}: a command's first line");
            blocks.push(line.token);
        }
    }
    blocks
}

fn alive(pid: i32) -> bool {
    // A zombie has exited; only its parent has not looked yet.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// Waits for a `start` line of a token other than those in `seen`.
fn wait_for_start(log: &Path, seen: &[i64], within: Duration) -> Option<Line> {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Some(line) = read_log(log)
            .into_iter()
            .find(|l| l.kind == "start" && !seen.contains(&l.token))
        {
            return Some(line);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

fn wait_for_exit(pid: i32, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if !alive(pid) {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// Checks with the store, while the row still names the first command's
/// term, that its last line was written before the lease could expire
/// (the emulator's clock is this machine's). Returns the time in ms from
/// the leader's deadline (last renewal's commit + R) to that last line;
/// negative when earlier (the runner counts R from the send, before the commit).
fn assert_gone_before_expiry(setup: &Setup, first: &Line) -> f64 {
    let record = setup.record();
    assert_eq!(record.token.map(|t| t.0), Some(first.token), "no other term began yet");
    let renewed = record.renewed_at.unwrap().0;
    let last = read_log(&setup.log)
        .into_iter()
        .filter(|l| l.token == first.token)
        .map(|l| l.at_nanos)
        .max()
        .unwrap();
    let expiry = renewed + D.as_nanos() as i64;
    assert!(
        last < expiry,
        "the command wrote {} ms after its lease could expire",
        (last - expiry) / 1_000_000
    );
    (last - (renewed + R.as_nanos() as i64)) as f64 / 1e6
}

fn three(setup: &Setup, ticks: u32, code: i32) -> Vec<Runner> {
    (0..3)
        .map(|i| Runner::start(setup, &format!("run-{i}"), ticks, code))
        .collect()
}

fn leader_of(first: &Line) -> usize {
    first.holder.trim_start_matches("run-").parse().unwrap()
}

#[test]
fn three_runners_run_a_one_shot_command_one_at_a_time_with_increasing_tokens() {
    let setup = setup();
    let mut runners = three(&setup, 10, 0);
    for (i, runner) in runners.iter_mut().enumerate() {
        // Each one waits at most for the others' runs (~0.6 s each) and a poll.
        let status = runner
            .wait_within(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("runner {i} did not finish"));
        assert!(status.success(), "runner {i}: {status}");
    }
    let lines = read_log(&setup.log);
    let blocks = assert_one_at_a_time(&lines);
    assert_eq!(blocks.len(), 3, "each runner ran its command once: {lines:#?}");
    let mut holders: Vec<&str> = lines
        .iter()
        .filter(|l| l.kind == "exit")
        .map(|l| l.holder.as_str())
        .collect();
    holders.sort();
    assert_eq!(holders, ["run-0", "run-1", "run-2"], "each ran to its end");
}

#[test]
fn kill_9_of_the_leading_runner_takes_its_command_along_and_another_starts_within_d_plus_p() {
    let setup = setup();
    let mut runners = three(&setup, 0, 0);
    let first = wait_for_start(&setup.log, &[], Duration::from_secs(20)).expect("a first command");
    runners[leader_of(&first)].child.kill().unwrap();
    let killed = Instant::now();
    let stopped = wait_for_exit(first.pid, D).expect("the command dies with its runner");
    assert_gone_before_expiry(&setup, &first);
    let next = wait_for_start(&setup.log, &[first.token], D + P + START_MARGIN);
    let failover = killed.elapsed();
    let next = next.unwrap_or_else(|| panic!("no next command within D + P + {START_MARGIN:?}"));
    assert!(!alive(first.pid));
    assert!(next.token > first.token);
    assert_one_at_a_time(&read_log(&setup.log));
    println!("kill -9 of the runner: its command stopped after {stopped:?}, the next started after {failover:?}");
}

#[test]
fn a_runner_stopped_past_d_has_its_command_stopped_before_the_next_starts() {
    let setup = setup();
    let runners = three(&setup, 0, 0);
    let first = wait_for_start(&setup.log, &[], Duration::from_secs(20)).expect("a first command");
    let paused = &runners[leader_of(&first)];
    paused.signal("STOP");
    let stopped_at = Instant::now();
    // The watchdog stops it by the last renewal + R + grace, before the
    // lease can expire: the store's record says whether it did.
    let stopped = wait_for_exit(first.pid, D).unwrap_or_else(|| panic!("the command outlived D = {D:?}"));
    let after_loss = assert_gone_before_expiry(&setup, &first);
    let next = wait_for_start(&setup.log, &[first.token], D + P + START_MARGIN).expect("another command starts");
    let takeover = stopped_at.elapsed();
    assert!(!alive(first.pid), "the first command is gone when the next starts");
    let lines = read_log(&setup.log);
    assert_one_at_a_time(&lines);
    let last_of_first = lines.iter().rfind(|l| l.token == first.token).unwrap();
    assert!(last_of_first.at_nanos < next.at_nanos);
    // Resumed past its deadline, the runner never restarts the old term.
    paused.signal("CONT");
    std::thread::sleep(D);
    let lines = read_log(&setup.log);
    assert_one_at_a_time(&lines);
    assert!(
        lines
            .iter()
            .filter(|l| l.token == first.token)
            .all(|l| l.at_nanos <= last_of_first.at_nanos)
    );
    println!(
        "SIGSTOP of the runner: its command's last line {after_loss:.1} ms after the leader's deadline (last renewal + R), \
         {stopped:?} after the SIGSTOP; the next started {takeover:?} after the SIGSTOP"
    );
}

#[test]
fn sigterm_to_the_runner_stops_its_command_returns_its_code_and_releases() {
    let setup = setup();
    let mut runners = three(&setup, 0, 0);
    let first = wait_for_start(&setup.log, &[], Duration::from_secs(20)).expect("a first command");
    let leader = &mut runners[leader_of(&first)];
    leader.signal("TERM");
    let termed = Instant::now();
    let status = leader
        .wait_within(GRACE + Duration::from_secs(2))
        .expect("the runner exits");
    assert_eq!(status.code(), Some(143), "the command's code: {status}");
    let lines = read_log(&setup.log);
    assert!(
        lines.iter().any(|l| l.token == first.token && l.kind == "term"),
        "the command got SIGTERM: {lines:#?}"
    );
    // Released: a follower starts within a poll, not after D.
    let next = wait_for_start(
        &setup.log,
        &[first.token],
        P + START_MARGIN + Duration::from_millis(300),
    );
    let handover = termed.elapsed();
    assert!(
        next.is_some(),
        "no next command within P + {START_MARGIN:?} + 300 ms of the release"
    );
    assert_one_at_a_time(&read_log(&setup.log));
    println!("SIGTERM handover: next command after {handover:?}");
}

/// A runner on the memory store (no emulator), in `dir`, running `sh -c SCRIPT`.
fn run_alone(dir: &Path, extra: &[&str], script: &str) -> Runner {
    let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["run", "--store", "memory", "--lock", "alone", "--kubernetes", "false"])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .current_dir(dir)
        .env("LEASEHOLD_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .expect("leasehold run starts");
    Runner { child }
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leasehold-run-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn wait_for_file(path: &Path) -> String {
    let started = Instant::now();
    loop {
        match std::fs::read_to_string(path) {
            Ok(text) if text.ends_with('\n') => return text,
            _ if started.elapsed() > Duration::from_secs(10) => panic!("{} was not written", path.display()),
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[test]
fn the_command_sees_its_token_in_env_and_token_file_and_leaves_nothing_running() {
    let dir = temp_dir();
    let mut runner = run_alone(
        &dir,
        &["--token-file", "token.json"],
        r#"sleep 30 & echo $! > bg; cp token.json seen; echo "$LEASEHOLD_TOKEN $LEASEHOLD_TERM" > env"#,
    );
    let status = runner.wait_within(Duration::from_secs(10)).expect("the runner exits");
    assert!(status.success(), "{status}");
    let env = wait_for_file(&dir.join("env"));
    let (token, term) = env.trim().split_once(' ').unwrap();
    let seen: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("seen")).unwrap()).unwrap();
    assert_eq!(
        seen["token"], token,
        "the token file was written before the command started"
    );
    assert_eq!(seen["leader"], true);
    assert_eq!(term, "1");
    let background: i32 = wait_for_file(&dir.join("bg")).trim().parse().unwrap();
    assert!(
        wait_for_exit(background, Duration::from_secs(1)).is_some(),
        "what the command left in its group is killed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigint_reaches_the_command_and_a_killed_watchdog_takes_the_command_along() {
    let dir = temp_dir();
    let script = r#"trap 'echo int > sig; exit 5' INT; echo "$$ $PPID" > pids; while :; do sleep 0.05; done"#;
    let mut runner = run_alone(&dir, &[], script);
    wait_for_file(&dir.join("pids"));
    runner.signal("INT");
    let status = runner.wait_within(Duration::from_secs(5)).expect("the runner exits");
    assert_eq!(status.code(), Some(5), "the command's code: {status}");
    assert_eq!(wait_for_file(&dir.join("sig")), "int\n");

    std::fs::remove_file(dir.join("pids")).unwrap();
    let mut runner = run_alone(&dir, &[], script);
    let pids = wait_for_file(&dir.join("pids"));
    let (command, watchdog) = pids.trim().split_once(' ').unwrap();
    let status = Command::new("kill").args(["-KILL", watchdog]).status().unwrap();
    assert!(status.success());
    assert!(
        wait_for_exit(command.parse().unwrap(), Duration::from_secs(1)).is_some(),
        "the command dies with its watchdog"
    );
    let status = runner.wait_within(Duration::from_secs(5)).expect("the runner exits");
    assert_eq!(status.code(), Some(128 + 9), "as a command killed by SIGKILL: {status}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_signal_exits_the_runner_at_once_and_the_watchdog_still_stops_the_command() {
    let dir = temp_dir();
    // The command notes SIGINT and carries on: only SIGKILL ends it.
    let script = r#"trap 'echo int >> sig' INT; echo "$$" > pid; while :; do sleep 0.05; done"#;
    let mut runner = run_alone(&dir, &["--grace-period", "1s"], script);
    let command: i32 = wait_for_file(&dir.join("pid")).trim().parse().unwrap();
    runner.signal("INT");
    wait_for_file(&dir.join("sig"));
    runner.signal("INT");
    let status = runner
        .wait_within(Duration::from_millis(500))
        .expect("the runner exits at once");
    assert_eq!(status.code(), Some(130), "{status}");
    assert!(alive(command), "the grace period is not over yet");
    assert!(
        wait_for_exit(command, Duration::from_millis(1500)).is_some(),
        "SIGKILL at the end of the grace period"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run-wrapped lock is visible to Prometheus as a sidecar's is: with
/// `--metrics-addr`, `leasehold run` serves the lease metrics (is_leader,
/// client-go's leader_election_master_status, store calls and latency per
/// operation, the renewal budget). On the memory store (one process).
#[test]
fn run_serves_the_sidecars_lease_metrics() {
    let dir = std::env::temp_dir().join(format!("leasehold-run-metrics-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let ready_file = dir.join("ready.json");
    let mut runner = Runner {
        child: Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["run", "--store", "memory", "--lock", "metered", "--pod-name", "solo"])
            .args(["--kubernetes", "false", "--metrics-addr", "127.0.0.1:0"])
            .arg("--ready-file")
            .arg(&ready_file)
            .env("LEASEHOLD_LEASE_DURATION", "2s")
            .env("LEASEHOLD_RENEW_DEADLINE", "1500ms")
            .env("LEASEHOLD_RETRY_PERIOD", "300ms")
            .env("LEASEHOLD_LOG", "warn")
            .args(["--", "sleep", "600"])
            .stdin(Stdio::null())
            .spawn()
            .expect("leasehold run starts"),
    };
    // Process start and binding: the sidecar's bound (tests/support).
    let bound = Duration::from_secs(20);
    let started = Instant::now();
    let listening: leasehold::cmd::run::Listening = loop {
        if let Ok(text) = std::fs::read_to_string(&ready_file) {
            break serde_json::from_str(&text).unwrap_or_else(|e| panic!("ready file: {e}: {text}"));
        }
        assert!(
            runner.child.try_wait().unwrap().is_none(),
            "the runner exited before binding"
        );
        assert!(started.elapsed() < bound, "no ready file within {bound:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let port = listening.metrics.port();
    // Alone on the lock it leads at its first attempt and renews every P:
    // a few renewals come within a few D.
    let within = 5 * D;
    let started = Instant::now();
    let wanted = [
        "leasehold_is_leader 1\n",
        "leader_election_master_status{name=\"metered\"} 1\n",
        "leasehold_store_calls_total{op=\"acquire\"} 1\n",
        "leasehold_store_latency_seconds_count{op=\"renew\"} ",
        "leasehold_renew_budget_used ",
        "leasehold_app_healthy -1\n",
    ];
    let text = loop {
        let text = match crate::support::get_text(port, "/metrics") {
            Ok((200, text)) => text,
            Ok((status, text)) => panic!("/metrics answered {status}: {text}"),
            Err(e) => panic!("/metrics on port {port} did not answer: {e}"),
        };
        if wanted.iter().all(|w| text.contains(w)) && text.contains("leasehold_store_calls_total{op=\"renew\"} ") {
            break text;
        }
        assert!(
            started.elapsed() < within,
            "within {within:?} the runner's metrics do not show it leading and renewing ({wanted:?}):\n{text}"
        );
        std::thread::sleep(P);
    };
    assert!(
        !text.contains("leasehold_store_failures_total{"),
        "no store call failed: {text}"
    );
    runner.signal("TERM");
    assert!(
        runner.wait_within(R + GRACE + START_MARGIN).is_some(),
        "the runner did not exit on SIGTERM"
    );
    assert!(
        crate::support::get_text(port, "/metrics").is_err(),
        "the metrics listener closes with the runner"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
