use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    match leasehold::cmd::Cli::parse().run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line naming the problem, whatever RUST_BACKTRACE says.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
