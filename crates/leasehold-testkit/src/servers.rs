//! Private PostgreSQL and Redis servers for tests: each on a free loopback
//! port in a temporary directory of its own, stopped and removed on drop.
//! A missing binary fails the test with how to get it; nothing is skipped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{LOOPBACK, ReservedPort, port_open, reserve_port};

/// How to get PostgreSQL, printed when it is missing.
pub const HOW_TO_GET_POSTGRES: &str = "no PostgreSQL server binaries (initdb, postgres, pg_isready) found. \
Install them (Debian: `apt-get install -y postgresql`, which puts them in /usr/lib/postgresql/<version>/bin), \
then put that folder on PATH or set LEASEHOLD_PG_BIN to it";

/// How to get Redis, printed when it is missing.
pub const HOW_TO_GET_REDIS: &str = "no redis-server found. Install it (Debian: `apt-get install -y redis-server`; \
`.ci/run` does), put it on PATH or set LEASEHOLD_REDIS_SERVER to its path";

const STARTUP: Duration = Duration::from_secs(30);

/// The names the servers' certificates cover unless a test asks otherwise:
/// every name their URLs use.
const DEFAULT_NAMES: &[&str] = &["127.0.0.1", "localhost"];

/// PEM files of a fresh CA and a server certificate it signs (for
/// `127.0.0.1` and `localhost` unless told otherwise), for the servers' TLS.
#[derive(Debug, Clone)]
pub struct TestCertificates {
    /// The CA certificate: what a client names with `sslrootcert=`.
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TestCertificates {
    /// Writes them into `dir` (the key readable by its owner only, as
    /// PostgreSQL demands).
    pub fn write(dir: &Path) -> TestCertificates {
        Self::write_for(dir, DEFAULT_NAMES)
    }

    /// Writes them with a server certificate for `names` only.
    pub fn write_for(dir: &Path, names: &[&str]) -> TestCertificates {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "leasehold test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let key = KeyPair::generate().expect("server key");
        let params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("params");
        let cert = params
            .signed_by(&key, &Issuer::new(ca_params, ca_key))
            .expect("server certificate");
        let files = TestCertificates {
            ca_file: dir.join("ca.pem"),
            cert_file: dir.join("server.crt"),
            key_file: dir.join("server.key"),
        };
        for (path, pem) in [
            (&files.ca_file, ca.pem()),
            (&files.cert_file, cert.pem()),
            (&files.key_file, key.serialize_pem()),
        ] {
            std::fs::write(path, pem).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        }
        let owner_only = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(&files.key_file, owner_only).expect("key permissions");
        files
    }
}

/// A fresh, empty directory under the system's temporary directory.
pub fn scratch_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leasehold-{what}-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// Stops a server: `signal` first, SIGKILL if it has not exited within 5 s.
fn stop(child: &mut Child, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn spawn_postgres(command: &[std::ffi::OsString], dir: &Path, user: Option<(u32, u32)>) -> Child {
    let mut postgres = Command::new(&command[0]);
    postgres
        .args(&command[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("server.log")).map_or(Stdio::null(), Stdio::from));
    as_user(&mut postgres, user);
    postgres
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", command[0].to_string_lossy()))
}

/// The folder holding initdb, postgres and pg_isready.
fn postgres_bin() -> Option<PathBuf> {
    let complete = |dir: &Path| {
        ["initdb", "postgres", "pg_isready"]
            .iter()
            .all(|b| dir.join(b).is_file())
    };
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(dir) = std::env::var("LEASEHOLD_PG_BIN") {
        candidates.push(dir.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    // Debian keeps server binaries off PATH; prefer the newest version.
    if let Ok(versions) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut found: Vec<PathBuf> = versions.flatten().map(|v| v.path().join("bin")).collect();
        found.sort_by_key(|p| {
            std::cmp::Reverse(
                p.parent()
                    .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
                    .unwrap_or(0),
            )
        });
        candidates.extend(found);
    }
    candidates.into_iter().find(|dir| complete(dir))
}

/// PostgreSQL refuses to run as root: as root, servers run as this user.
fn unprivileged_user() -> Option<(u32, u32)> {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !is_root {
        return None;
    }
    for user in ["postgres", "nobody"] {
        let id = |flag: &str| {
            let out = Command::new("id").args([flag, user]).output().ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().ok()
        };
        if let (Some(uid), Some(gid)) = (id("-u"), id("-g")) {
            return Some((uid, gid));
        }
    }
    panic!("running as root, and neither a postgres nor a nobody user exists to run PostgreSQL as")
}

fn as_user(command: &mut Command, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        std::os::unix::process::CommandExt::uid(command, uid);
        std::os::unix::process::CommandExt::gid(command, gid);
    }
}

fn chown_tree(dir: &Path, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        let status = Command::new("chown")
            .args(["-R", &format!("{uid}:{gid}")])
            .arg(dir)
            .status();
        assert!(status.is_ok_and(|s| s.success()), "chown -R {}", dir.display());
    }
}

/// A cluster initialised once per machine and copied per server: initdb
/// costs seconds, a copy a fraction of one.
fn postgres_template(bin: &Path, user: Option<(u32, u32)>) -> PathBuf {
    let version = bin
        .parent()
        .and_then(|p| p.file_name())
        .map(|v| v.to_string_lossy().into_owned())
        .unwrap_or_else(|| "local".into());
    let uid = user.map_or(String::from("self"), |(uid, _)| uid.to_string());
    let template = std::env::temp_dir().join(format!("leasehold-pg-template-{version}-{uid}"));
    if template.join("PG_VERSION").is_file() {
        return template;
    }
    let building = scratch_dir("pg-template-building");
    chown_tree(&building, user);
    let data = building.join("data");
    let mut initdb = Command::new(bin.join("initdb"));
    initdb
        .arg("-D")
        .arg(&data)
        .args([
            "-U",
            "leasehold",
            "-A",
            "trust",
            "--no-sync",
            "--no-instructions",
            "-E",
            "UTF8",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    as_user(&mut initdb, user);
    let out = initdb
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.join("initdb").display()));
    assert!(
        out.status.success(),
        "initdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Another test may have won the race; either copy is as good.
    if std::fs::rename(&data, &template).is_err() {
        assert!(
            template.join("PG_VERSION").is_file(),
            "no template at {}",
            template.display()
        );
    }
    let _ = std::fs::remove_dir_all(&building);
    template
}

/// A private PostgreSQL server, superuser `leasehold` without a password.
#[derive(Debug)]
pub struct PostgresServer {
    pub port: u16,
    /// Set when the server also speaks TLS.
    pub certificates: Option<TestCertificates>,
    dir: PathBuf,
    /// The `postgres` command line, to start it again on the same data.
    command: Vec<std::ffi::OsString>,
    user: Option<(u32, u32)>,
    child: Child,
    /// Held while the server lives (and across restarts on the same port).
    _reserved: ReservedPort,
}

impl PostgresServer {
    /// Starts one; panics with [`HOW_TO_GET_POSTGRES`] when the binaries are missing.
    pub fn start() -> PostgresServer {
        Self::start_with(None, None)
    }

    /// Starts one that also accepts TLS, with a certificate of a fresh CA.
    pub fn start_tls() -> PostgresServer {
        Self::start_tls_for(DEFAULT_NAMES)
    }

    /// Starts one that also accepts TLS, with a certificate for `names` only.
    pub fn start_tls_for(names: &[&str]) -> PostgresServer {
        Self::start_with(Some(names), None)
    }

    /// Starts one that also listens on `host` (an address of this machine)
    /// and trusts clients on the networks this machine is attached to: the
    /// end-to-end suite's pods reach it there.
    pub fn start_on(host: std::net::IpAddr) -> PostgresServer {
        Self::start_with(None, Some(host))
    }

    /// `tls`: the names of the server's certificate, when it speaks TLS.
    fn start_with(tls: Option<&[&str]>, host: Option<std::net::IpAddr>) -> PostgresServer {
        let bin = postgres_bin().unwrap_or_else(|| panic!("{HOW_TO_GET_POSTGRES}"));
        let user = unprivileged_user();
        let template = postgres_template(&bin, user);
        let dir = scratch_dir("pg");
        let data = dir.join("data");
        let copied = Command::new("cp").arg("-a").arg(&template).arg(&data).status();
        assert!(copied.is_ok_and(|s| s.success()), "copying {}", template.display());
        let certificates = tls.map(|names| TestCertificates::write_for(&dir, names));
        let mut listen = String::from("listen_addresses=127.0.0.1");
        if let Some(host) = host {
            listen.push_str(&format!(",{host}"));
            // `samenet`: any address in a subnet this machine is directly on.
            let hba = data.join("pg_hba.conf");
            let mut rules = std::fs::read_to_string(&hba).expect("pg_hba.conf");
            rules.push_str("host all all samenet trust\n");
            std::fs::write(&hba, rules).expect("pg_hba.conf");
        }
        chown_tree(&dir, user);
        let reserved = reserve_port(LOOPBACK);
        let port = reserved.port;
        let mut command: Vec<std::ffi::OsString> = vec![bin.join("postgres").into(), "-D".into(), data.into()];
        let settings = [
            format!("port={port}"),
            listen,
            "unix_socket_directories=".into(),
            "fsync=off".into(),
            "shared_buffers=16MB".into(),
            "max_connections=40".into(),
        ];
        for setting in settings {
            command.extend(["-c".into(), setting.into()]);
        }
        if let Some(files) = &certificates {
            command.extend(["-c".into(), "ssl=on".into(), "-c".into()]);
            command.push(format!("ssl_cert_file={}", files.cert_file.display()).into());
            command.push("-c".into());
            command.push(format!("ssl_key_file={}", files.key_file.display()).into());
        }
        let child = spawn_postgres(&command, &dir, user);
        let server = PostgresServer {
            port,
            certificates,
            dir,
            command,
            user,
            child,
            _reserved: reserved,
        };
        server.wait_ready(&bin);
        server
    }

    fn wait_ready(&self, bin: &Path) {
        let started = Instant::now();
        loop {
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(
                started.elapsed() < STARTUP,
                "PostgreSQL on port {} not ready within {STARTUP:?}; see {}",
                self.port,
                self.dir.join("server.log").display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (fast shutdown) and starts it again on the same data
    /// and port, as a restart of a real server does.
    pub fn restart(&mut self) {
        self.restart_after(Duration::ZERO);
    }

    /// [`restart`](Self::restart), down for `down` in between (so clients
    /// that call every so often find it down, not only their connections cut).
    pub fn restart_after(&mut self, down: Duration) {
        stop(&mut self.child, "INT");
        std::thread::sleep(down);
        self.child = spawn_postgres(&self.command, &self.dir, self.user);
        let bin = Path::new(&self.command[0])
            .parent()
            .expect("postgres's folder")
            .to_path_buf();
        self.wait_ready(&bin);
    }

    /// The URL of database `postgres` at `addr` (this server, or a proxy in front of it).
    pub fn url_at(&self, addr: std::net::SocketAddr) -> String {
        format!("postgres://leasehold@{addr}/postgres?sslmode=disable")
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self) -> String {
        self.url_at(self.addr())
    }

    /// The URL over TLS, checking the certificate against the test CA.
    pub fn tls_url(&self) -> String {
        let ca = &self
            .certificates
            .as_ref()
            .expect("a server started with start_tls")
            .ca_file;
        format!(
            "postgres://leasehold@{}/postgres?sslmode=verify-full&sslrootcert={}",
            self.addr(),
            ca.display()
        )
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // SIGINT: fast shutdown, which also ends the backends.
        stop(&mut self.child, "INT");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private Redis server without persistence.
#[derive(Debug)]
pub struct RedisServer {
    pub port: u16,
    /// Set when the server speaks TLS (only TLS, on `port`).
    pub certificates: Option<TestCertificates>,
    dir: PathBuf,
    child: Child,
    /// Held while the server lives.
    _reserved: ReservedPort,
}

impl RedisServer {
    /// Starts one; panics with [`HOW_TO_GET_REDIS`] when redis-server is missing.
    pub fn start() -> RedisServer {
        Self::start_with(None, None)
    }

    /// Starts one that speaks only TLS, with a certificate of a fresh CA.
    pub fn start_tls() -> RedisServer {
        Self::start_tls_for(DEFAULT_NAMES)
    }

    /// Starts one that speaks only TLS, with a certificate for `names` only.
    pub fn start_tls_for(names: &[&str]) -> RedisServer {
        Self::start_with(Some(names), None)
    }

    /// Starts one that also listens on `host`, an address of this machine
    /// (the end-to-end suite's pods reach it there).
    pub fn start_on(host: std::net::IpAddr) -> RedisServer {
        Self::start_with(None, Some(host))
    }

    /// `tls`: the names of the server's certificate, when it speaks TLS.
    fn start_with(tls: Option<&[&str]>, host: Option<std::net::IpAddr>) -> RedisServer {
        let binary = std::env::var_os("LEASEHOLD_REDIS_SERVER")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::split_paths(&std::env::var_os("PATH")?)
                    .map(|dir| dir.join("redis-server"))
                    .find(|p| p.is_file())
            })
            .unwrap_or_else(|| panic!("{HOW_TO_GET_REDIS}"));
        let dir = scratch_dir("redis");
        let reserved = reserve_port(LOOPBACK);
        let port = reserved.port;
        let certificates = tls.map(|names| TestCertificates::write_for(&dir, names));
        let mut redis = Command::new(&binary);
        match &certificates {
            None => redis.args(["--port", &port.to_string()]),
            Some(files) => redis
                .args([
                    "--port",
                    "0",
                    "--tls-port",
                    &port.to_string(),
                    "--tls-auth-clients",
                    "no",
                ])
                .arg("--tls-cert-file")
                .arg(&files.cert_file)
                .arg("--tls-key-file")
                .arg(&files.key_file)
                .arg("--tls-ca-cert-file")
                .arg(&files.ca_file),
        };
        redis.args(["--bind", "127.0.0.1"]);
        if let Some(host) = host {
            redis.arg(host.to_string());
        }
        let child = redis
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("server.log")).map_or(Stdio::null(), Stdio::from))
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}; {HOW_TO_GET_REDIS}", binary.display()));
        let server = RedisServer {
            port,
            certificates,
            dir,
            child,
            _reserved: reserved,
        };
        let started = Instant::now();
        while !port_open(port) {
            assert!(
                started.elapsed() < STARTUP,
                "redis-server on port {port} not listening within {STARTUP:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The URL of database 0 at `addr` (this server, or a proxy in front of it).
    pub fn url_at(&self, addr: std::net::SocketAddr) -> String {
        format!("redis://{addr}/0")
    }

    pub fn url(&self) -> String {
        self.url_at(self.addr())
    }

    /// The `rediss://` URL, checking the certificate against the test CA.
    pub fn tls_url(&self) -> String {
        let ca = &self
            .certificates
            .as_ref()
            .expect("a server started with start_tls")
            .ca_file;
        format!("rediss://{}/0?sslrootcert={}", self.addr(), ca.display())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        stop(&mut self.child, "TERM");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
