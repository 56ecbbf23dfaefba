//! The `memprof` binary: parse the command line, run, map the outcome to an exit code
//! (0 ok, 1 finding, 2 error).

use clap::Parser;
use memprof::cli::{self, Cli, Outcome};
use memprof::report::terminal_text::terminal_text;
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
            // One line, whatever the file put in the message.
            eprintln!("memprof: error: {}", terminal_text(&format!("{err:#}")));
            ExitCode::from(2)
        }
    }
}
