use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    match leasehold::cmd::Cli::parse().run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A line naming the problem, then a line per cause below it,
            // each said once, whatever RUST_BACKTRACE says.
            let causes = leasehold::api::errors::causes(&*e);
            let (problem, below) = causes.split_first().expect("an error has a message");
            eprintln!("error: {problem}");
            for cause in below {
                eprintln!("  cause: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}
