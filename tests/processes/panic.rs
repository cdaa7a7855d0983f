//! "A bug that panics ends the whole process at once" (README), in every
//! build: the tests and the end-to-end image run debug builds, where
//! `panic = "abort"` (release profile) does not apply.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use clap::Parser;

/// Set in the copy of this test binary the test starts.
const CHILD: &str = "LEASEHOLD_TEST_PANICKING_CHILD";
/// SIGABRT on Linux: what `std::process::abort` ends the process with.
const SIGABRT: i32 = 6;

/// In a child process: the CLI's entry point (`Cli::run`, which every role
/// goes through; here the quick `crd`), then a task that panics on a tokio
/// runtime, as the sidecar's token-file follower or publisher might. Tokio
/// catches a task's panic; the process must still end at once, by abort,
/// with the panic's message on stderr.
#[test]
fn a_panic_in_a_spawned_task_ends_the_whole_process() {
    if std::env::var_os(CHILD).is_some() {
        leasehold::cmd::Cli::parse_from(["leasehold", "crd"]).run().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let outcome = runtime.block_on(async { tokio::spawn(async { panic!("a planted bug in a task") }).await });
        // Reached only when the panic did not end the process.
        println!("survived the panic: {outcome:?}");
        return;
    }
    // This test's name as the harness knows it: its module path without the
    // test binary's crate name.
    let (_, module) = module_path!().split_once("::").unwrap();
    let name = format!("{module}::a_panic_in_a_spawned_task_ends_the_whole_process");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &name, "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.signal(),
        Some(SIGABRT),
        "the process did not abort: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("a planted bug in a task"),
        "the panic is reported: {stderr}"
    );
    assert!(!stdout.contains("survived the panic"), "{stdout}");
}
