//! The candidate build (Cargo feature `candidate`; the Dockerfile's
//! `sidecar` image): a binary with only what a candidate pod runs. It
//! refuses the operator's and the tools' commands as clap refuses any
//! unknown one, its help lists only its own, and it serves as a candidate:
//! sidecars on a private PostgreSQL elect one leader (one reaching it by
//! host name), and the runner it
//! installs (as the webhook's init container does for `leasehold.dev/run`
//! pods) runs a command while it leads. It is linked statically, as the
//! image's, which has no libc.
//!
//! The binary is built once, outside the suite (scripts/test.sh does):
//! `export LEASEHOLD_CANDIDATE_BINARY=$(scripts/candidate-binary.sh)`.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::support::*;
use leasehold::api::contract::{INSTALL_SELF_COMMAND, RUNNER_FILE_NAME};
use leasehold::testing::TcpProxy;
use leasehold::testing::servers::PostgresServer;

/// The commands a candidate pod runs (hidden ones aside: the watchdog and
/// the installer), in the order help lists them.
const CANDIDATE_COMMANDS: [&str; 4] = ["sidecar", "run", "version", "help"];

/// Commands of the full binary the candidate binary must not carry.
const FULL_ONLY: [&str; 9] = [
    "operator",
    "crd",
    "check",
    "inject",
    "status",
    "transfer",
    "demo",
    "advise",
    "completions",
];

fn candidate_binary() -> OsString {
    let binary = std::env::var_os("LEASEHOLD_CANDIDATE_BINARY").unwrap_or_else(|| {
        panic!(
            "LEASEHOLD_CANDIDATE_BINARY is unset: build the candidate binary and name it with \
             `export LEASEHOLD_CANDIDATE_BINARY=$(scripts/candidate-binary.sh)` (scripts/test.sh does)"
        )
    });
    assert!(
        Path::new(&binary).is_file(),
        "LEASEHOLD_CANDIDATE_BINARY={} is not a file; rebuild it with scripts/candidate-binary.sh",
        binary.to_string_lossy()
    );
    binary
}

fn output(binary: &OsString, args: &[&str]) -> Output {
    Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{} {args:?}: {e}", binary.to_string_lossy()))
}

/// The subcommand names in `--help`'s "Commands:" section.
fn listed_commands(binary: &OsString) -> Vec<String> {
    let help = output(binary, &["--help"]);
    assert!(help.status.success(), "--help: {help:?}");
    let help = String::from_utf8(help.stdout).unwrap();
    let (_, commands) = help.split_once("Commands:\n").expect("a Commands: section");
    commands
        .lines()
        .take_while(|line| line.starts_with("  "))
        .filter(|line| !line.starts_with("   ")) // a wrapped description
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_candidate_binary_lists_only_its_commands_and_refuses_the_others() {
    let candidate = candidate_binary();
    assert_eq!(listed_commands(&candidate), CANDIDATE_COMMANDS);
    // The full binary lists them all: the list above is the build's, not
    // the parser's.
    let full = listed_commands(&env!("CARGO_BIN_EXE_leasehold").into());
    for command in FULL_ONLY {
        assert!(
            full.iter().any(|c| c == command),
            "the full binary lacks {command}: {full:?}"
        );
        let refused = output(&candidate, &[command]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{command}: {refused:?}");
        assert!(
            stderr.contains(&format!("unrecognized subcommand '{command}'")),
            "{command}: {stderr}"
        );
    }
    let version = output(&candidate, &["version", "--client-only"]);
    assert!(version.status.success(), "{version:?}");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("client: {}", env!("CARGO_PKG_VERSION"))
    );
}

/// The candidate binary is linked statically, as the `sidecar` image's
/// (which has no libc): it names no program interpreter (ELF `PT_INTERP`),
/// so the kernel loads no dynamic loader and no shared library.
#[test]
fn the_candidate_binary_needs_no_dynamic_loader() {
    let candidate = candidate_binary();
    let elf = std::fs::read(&candidate).unwrap();
    assert_eq!(&elf[..5], b"\x7fELF\x02", "{candidate:?} is not a 64-bit ELF file");
    assert!(!program_header_types(&elf).is_empty(), "no program headers read");
    assert!(
        !program_header_types(&elf).contains(&PT_INTERP),
        "{candidate:?} asks for a dynamic loader: build it with scripts/candidate-binary.sh \
         (RUSTFLAGS=\"-C target-feature=+crt-static\")"
    );
}

const PT_INTERP: u32 = 3;

/// The types of a little-endian ELF64 file's program headers.
fn program_header_types(elf: &[u8]) -> Vec<u32> {
    let read = |at: usize, width: usize| {
        elf[at..at + width]
            .iter()
            .rev()
            .fold(0usize, |value, byte| value << 8 | usize::from(*byte))
    };
    let (offset, size, count) = (read(0x20, 8), read(0x36, 2), read(0x38, 2));
    (0..count)
        .map(|i| u32::try_from(read(offset + i * size, 4)).unwrap())
        .collect()
}

#[test]
fn candidate_sidecars_on_postgres_elect_one_leader() {
    let candidate = candidate_binary();
    let server = PostgresServer::start();
    let runtime = proxy_runtime();
    let sidecars: Vec<Sidecar> = (0..2)
        .map(|i| {
            let proxy = runtime.block_on(TcpProxy::start(server.addr()));
            let mut flags = vec!["--store".to_string(), "postgres".to_string()];
            if i == 0 {
                flags.push("--create-table".into());
            }
            // The first, which creates the table the other needs, names its
            // store by host name: the statically linked resolver reads
            // /etc/hosts with no library to load.
            let url = server.url_at(proxy.addr);
            let url = match i {
                0 => url.replacen(&proxy.addr.ip().to_string(), "localhost", 1),
                _ => url,
            };
            let env = [("LEASEHOLD_STORE_URL".to_string(), url)];
            Sidecar::launch_binary(
                &candidate,
                &format!("pod-{i}"),
                proxy,
                "candidate-lock",
                &flags,
                &env,
                &[],
            )
        })
        .collect();
    let all: Vec<&Sidecar> = sidecars.iter().collect();
    // Elected within a lease duration and a poll of the second start.
    let leader = wait_for_one_leader(&all, failover_bound()).expect("a candidate sidecar leads");
    let (_, view) = sidecars[leader].leader();
    assert!(token_of(&view).parse::<i64>().unwrap() > 0, "{view}");
    assert!(!others(&sidecars, leader)[0].leads());
}

#[test]
fn the_runner_the_candidate_binary_installs_runs_a_command_while_leading() {
    let candidate = candidate_binary();
    let dir = std::env::temp_dir().join(format!("leasehold-candidate-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let installed = output(&candidate, &[INSTALL_SELF_COMMAND, dir.to_str().unwrap()]);
    assert!(installed.status.success(), "{installed:?}");
    let runner = dir.join(RUNNER_FILE_NAME);
    assert_eq!(std::fs::read(&runner).unwrap(), std::fs::read(&candidate).unwrap());
    let ran = Command::new(&runner)
        .args(["run", "--store", "memory", "--lock", "alone", "--kubernetes", "false"])
        .args(["--", "sh", "-c", r#"echo "$LEASEHOLD_TOKEN" > token"#])
        .current_dir(&dir)
        .env("LEASEHOLD_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(ran.status.success(), "{ran:?}");
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    assert!(token.trim().parse::<i64>().unwrap() > 0, "token {token:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
