//! Test support: starts one Cloud Spanner emulator for a whole test run,
//! prints `SPANNER_EMULATOR_HOST=… SPANNER_EMULATOR_REST=…` and keeps it until
//! its standard input closes (the test script exits), then stops it.
//! `scripts/test.sh` uses it so the suite's tests share one emulator, each
//! with databases of its own.

use std::io::Read;

fn main() {
    let emulator = leasehold_testkit::Emulator::start_or_connect();
    println!(
        "SPANNER_EMULATOR_HOST={} SPANNER_EMULATOR_REST={}",
        emulator.host, emulator.rest
    );
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop(emulator);
}
