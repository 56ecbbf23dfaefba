//! The `memprof` binary: parse the command line, run, map the outcome to an exit code
//! (0 ok, 1 finding, 2 error).

use clap::Parser;
use memprof::cli::{self, Cli, Outcome};
use std::process::ExitCode;

fn main() -> ExitCode {
    let parsed = Cli::parse();
    match cli::run(parsed) {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Finding) => ExitCode::from(1),
        Ok(Outcome::Exit(code)) => ExitCode::from(code),
        Err(err) => {
            let broken_pipe = err
                .chain()
                .filter_map(|e| e.downcast_ref::<std::io::Error>())
                .any(|e| e.kind() == std::io::ErrorKind::BrokenPipe);
            if broken_pipe {
                return ExitCode::SUCCESS;
            }
            eprintln!("memprof: error: {err:#}");
            ExitCode::from(2)
        }
    }
}
