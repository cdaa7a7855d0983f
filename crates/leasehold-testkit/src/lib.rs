//! Test support shared by every crate's unit tests, the integration tests
//! and the benchmarks: the Cloud Spanner emulator (found or started),
//! private PostgreSQL and Redis servers ([`servers`]), a TCP proxy the test
//! controls, the mock Kubernetes API servers ([`api`]), the store
//! conformance suite ([`conformance`]) and the JSON log capture ([`logs`]).
//! Not part of the product's behaviour; it depends on the core and the
//! database stores only, so the Kubernetes layer's tests can use it too.

#![warn(unreachable_pub)]

pub mod api;
pub mod conformance;
pub use leasehold_core::testing_logs as logs;
pub mod servers;

use std::net::{IpAddr, SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use leasehold_stores::spanner::{Endpoints, SpannerConfig, create_emulator_database};

/// How to get an emulator, printed when none is found.
pub(crate) const HOW_TO_GET_THE_EMULATOR: &str = "no Cloud Spanner emulator found. Either run one and set \
SPANNER_EMULATOR_HOST=host:port (and SPANNER_EMULATOR_REST=http://host:port for its admin gateway \
unless it is the gRPC port + 10), or set SPANNER_EMULATOR_DIR to a folder holding gateway_main and \
emulator_main, or `gcloud components install cloud-spanner-emulator`, or put both binaries on PATH";

const PROJECT: &str = "leasehold-test";
const INSTANCE: &str = "leasehold";

/// A running emulator: one this process started (stopped on drop) or one
/// named by `SPANNER_EMULATOR_HOST`.
#[derive(Debug)]
pub struct Emulator {
    /// gRPC `host:port`, what `SPANNER_EMULATOR_HOST` holds.
    pub host: String,
    /// REST admin gateway, `http://host:port`.
    pub rest: String,
    child: Option<Child>,
    /// Held while it runs (and across restarts on the same ports).
    _ports: Vec<ReservedPort>,
}

impl Emulator {
    /// Uses `SPANNER_EMULATOR_HOST` when set, else starts the emulator found
    /// in `SPANNER_EMULATOR_DIR`, the gcloud SDK or `PATH`. Panics with
    /// [`HOW_TO_GET_THE_EMULATOR`] when there is none: a test that needs it
    /// never passes without it.
    pub fn start_or_connect() -> Emulator {
        match Self::try_start_or_connect() {
            Ok(emulator) => emulator,
            Err(e) => panic!("{e}"),
        }
    }

    pub(crate) fn try_start_or_connect() -> Result<Emulator, String> {
        if let Ok(host) = std::env::var("SPANNER_EMULATOR_HOST")
            && !host.is_empty()
        {
            let rest = std::env::var("SPANNER_EMULATOR_REST")
                .ok()
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| {
                    let (name, port) = host.rsplit_once(':').unwrap_or((&host, "9010"));
                    format!("http://{name}:{}", port.parse::<u16>().unwrap_or(9010) + 10)
                });
            return Ok(Emulator {
                host,
                rest,
                child: None,
                _ports: Vec::new(),
            });
        }
        Self::start_own()
    }

    /// Starts an emulator of this process's own, even when
    /// `SPANNER_EMULATOR_HOST` names one: for tests that restart it.
    pub fn start_own() -> Result<Emulator, String> {
        Self::start_on(LOOPBACK)
    }

    /// Starts an emulator of this process's own listening on `host`, an
    /// address of this machine (the end-to-end suite's pods reach it there).
    pub fn start_on(host: IpAddr) -> Result<Emulator, String> {
        let ports = [reserve_port(host), reserve_port(host)];
        let (grpc, http) = (ports[0].port, ports[1].port);
        let child = spawn(host, grpc, http)?;
        Ok(Emulator {
            host: SocketAddr::new(host, grpc).to_string(),
            rest: format!("http://{}", SocketAddr::new(host, http)),
            child: Some(child),
            _ports: ports.into(),
        })
    }

    /// Kills the emulator this process started and starts a fresh one on the
    /// same ports: every instance, database, session and row is gone, as
    /// after a crash of the real thing.
    pub fn restart(&mut self) -> Result<(), String> {
        let address = |endpoint: &str| endpoint.trim_start_matches("http://").parse::<SocketAddr>().ok();
        let (Some(grpc), Some(http)) = (address(&self.host), address(&self.rest)) else {
            return Err(format!("cannot tell the addresses of {} and {}", self.host, self.rest));
        };
        let child = self
            .child
            .as_mut()
            .ok_or("this emulator was not started by this process; use Emulator::start_own")?;
        kill_group(child);
        self.child = Some(spawn(grpc.ip(), grpc.port(), http.port())?);
        Ok(())
    }

    pub fn endpoints(&self) -> Endpoints {
        Endpoints {
            data: Some(format!("http://{}", self.host)),
            admin: Some(self.rest.clone()),
        }
    }

    /// A fresh database of its own, so tests run in parallel.
    pub async fn create_database(&self, table: &str) -> SpannerConfig {
        let name = format!("t{:016x}", rand::random::<u64>());
        self.create_named_database(&name, table).await
    }

    /// The database `name` (created when missing), e.g. again after a restart.
    pub async fn create_named_database(&self, name: &str, table: &str) -> SpannerConfig {
        let database = create_emulator_database(&self.endpoints(), PROJECT, INSTANCE, name)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "creating database {name} on the emulator at {}: {}",
                    self.host,
                    e.chain()
                )
            });
        SpannerConfig {
            database,
            table: table.to_string(),
        }
    }

    /// A Spanner client of the emulator, as a user's own code would open one.
    pub async fn client(&self) -> google_cloud_spanner::client::Spanner {
        google_cloud_spanner::client::Spanner::builder()
            .with_endpoint(format!("http://{}", self.host))
            .build()
            .await
            .unwrap_or_else(|e| panic!("a Spanner client of the emulator at {}: {e}", self.host))
    }

    /// Runs one DDL statement on `database`, as the database's owner would.
    pub async fn ddl(&self, database: &str, statement: &str) {
        use google_cloud_lro::Poller;
        self.client()
            .await
            .database_admin_builder()
            .with_endpoint(self.rest.clone())
            .build()
            .await
            .unwrap_or_else(|e| panic!("the emulator's database admin at {}: {e}", self.rest))
            .update_database_ddl()
            .set_database(database.to_string())
            .set_statements([statement.to_string()])
            .poller()
            .until_done()
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            kill_group(child);
        }
    }
}

/// Kills the gateway and the emulator_main it started in its process group.
fn kill_group(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.wait();
}

/// Starts the emulator found in `SPANNER_EMULATOR_DIR`, the gcloud SDK or
/// `PATH` on the given ports and waits until both are open.
fn spawn(host: IpAddr, grpc: u16, http: u16) -> Result<Child, String> {
    let dir = find_binaries().ok_or_else(|| HOW_TO_GET_THE_EMULATOR.to_string())?;
    let mut command = Command::new(dir.join("gateway_main"));
    command
        .args([
            "--hostname",
            &host.to_string(),
            "--grpc_port",
            &grpc.to_string(),
            "--http_port",
            &http.to_string(),
        ])
        .arg("--grpc_binary")
        .arg(dir.join("emulator_main"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", dir.join("gateway_main").display()))?;
    let started = Instant::now();
    while !(address_open(SocketAddr::new(host, grpc)) && address_open(SocketAddr::new(host, http))) {
        if started.elapsed() > Duration::from_secs(30) {
            kill_group(&mut child);
            return Err(format!(
                "the emulator in {} did not open ports {grpc}/{http} within 30 s",
                dir.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child)
}

fn find_binaries() -> Option<PathBuf> {
    let has_both = |dir: &Path| dir.join("gateway_main").is_file() && dir.join("emulator_main").is_file();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(dir) = std::env::var("SPANNER_EMULATOR_DIR") {
        candidates.push(dir.into());
    }
    if let Ok(root) = std::env::var("CLOUDSDK_ROOT_DIR") {
        candidates.push(Path::new(&root).join("bin/cloud_spanner_emulator"));
    }
    if let Ok(out) = Command::new("gcloud")
        .args(["info", "--format=value(installation.sdk_root)"])
        .output()
        && out.status.success()
    {
        let root = String::from_utf8_lossy(&out.stdout).trim().to_string();
        candidates.push(Path::new(&root).join("bin/cloud_spanner_emulator"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates.into_iter().find(|dir| has_both(dir))
}

/// A port reserved for a server that must be told its port before it
/// binds (the emulator, PostgreSQL, Redis: none can bind port 0 and say
/// which port it got). A port the system picks for `bind(:0)` and lets go
/// could be taken again by any other socket before the server binds it,
/// including an outgoing connection's. These come from below the system's
/// ephemeral range, which no automatic choice uses, and each is held by an
/// exclusive lock on a file named after it for as long as this value
/// lives, so no other test process (of any worktree) reserves it meanwhile.
#[derive(Debug)]
pub struct ReservedPort {
    pub port: u16,
    _lock: std::fs::File,
}

/// The lowest port the system picks for `bind(:0)` and outgoing connections.
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// The folder of the reservations' lock files, one per port.
fn reservations() -> PathBuf {
    std::env::temp_dir().join("leasehold-test-ports")
}

/// Reserves a port on `host` (see [`ReservedPort`]).
pub fn reserve_port(host: IpAddr) -> ReservedPort {
    const LOWEST: u16 = 10000;
    let dir = reservations();
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let below = ephemeral_start().max(LOWEST + 1000);
    for _ in 0..1000 {
        let port = rand::random_range(LOWEST..below);
        let path = dir.join(port.to_string());
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        // Reserved by another test, or in use by something else.
        if lock.try_lock().is_err() || StdListener::bind(SocketAddr::new(host, port)).is_err() {
            continue;
        }
        return ReservedPort { port, _lock: lock };
    }
    panic!("no port on {host} between {LOWEST} and {below} could be reserved in 1000 tries")
}

pub(crate) const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

pub(crate) fn port_open(port: u16) -> bool {
    address_open(SocketAddr::new(LOOPBACK, port))
}

fn address_open(address: SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_ok()
}

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ProxyMode {
    /// Forward both ways.
    Forward,
    /// Forward requests; hold every reply back by this long.
    DelayReplies(Duration),
    /// Close every connection and refuse new ones (S4: cut off from the store).
    Cut,
}

/// A TCP proxy in front of `target`, switched by the test.
#[derive(Debug, Clone)]
pub struct TcpProxy {
    pub addr: SocketAddr,
    mode: Arc<watch::Sender<ProxyMode>>,
}

impl TcpProxy {
    /// On a free port of 127.0.0.1.
    pub async fn start(target: SocketAddr) -> TcpProxy {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into(), target).await
    }

    /// On a free port of `host` (an address of this machine), e.g. where
    /// the end-to-end suite's pods reach it.
    pub async fn start_on(host: IpAddr, target: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind((host, 0)).await.expect("proxy listener");
        let addr = listener.local_addr().expect("proxy address");
        let mode = Arc::new(watch::channel(ProxyMode::Forward).0);
        let modes = mode.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *modes.borrow() == ProxyMode::Cut {
                    continue; // dropped: refused
                }
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pipe(client_read, server_write, modes.subscribe(), false));
                tokio::spawn(pipe(server_read, client_write, modes.subscribe(), true));
            }
        });
        TcpProxy { addr, mode }
    }

    pub fn set(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }
}

/// Copies one direction. Replies under `DelayReplies` are shifted in time
/// (each chunk goes out `delay` after it arrived), not queued behind each
/// other, so a round trip costs one delay however the bytes are split.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
    replies: bool,
) {
    let (chunks, mut due) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read { Ok(0) | Err(_) => break, Ok(n) => n },
            _ = mode.wait_for(|m| *m == ProxyMode::Cut) => break,
        };
        let at = match *mode.borrow() {
            ProxyMode::Cut => break,
            ProxyMode::DelayReplies(delay) if replies => tokio::time::Instant::now() + delay,
            _ => tokio::time::Instant::now(),
        };
        if chunks.send((at, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    if *mode.borrow() == ProxyMode::Cut {
        writer.abort();
    } else {
        drop(chunks);
        let _ = writer.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reserved port lies below the ephemeral range, and while its
    /// reservation lives no other reservation (its file lock, taken
    /// through another open file as another process would) can take it.
    #[test]
    fn a_reserved_port_is_below_the_ephemeral_range_and_locked_while_held() {
        let reserved = reserve_port(LOOPBACK);
        assert!(reserved.port < ephemeral_start(), "{}", reserved.port);
        let path = reservations().join(reserved.port.to_string());
        let other = std::fs::File::open(&path).unwrap();
        assert!(other.try_lock().is_err(), "port {} reserved twice", reserved.port);
        drop(reserved);
        assert!(other.try_lock().is_ok(), "the reservation ends with its value");
    }
}
