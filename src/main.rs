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
            // A closed stdout (`| head` has read what it wanted) ends the command quietly, as
            // ripgrep does. serde_json keeps the write's error inside its own, not as a source.
            let broken_pipe = err.chain().any(|e| {
                let kind = e
                    .downcast_ref::<std::io::Error>()
                    .map(|e| e.kind())
                    .or_else(|| {
                        e.downcast_ref::<serde_json::Error>()
                            .and_then(|e| e.io_error_kind())
                    });
                kind == Some(std::io::ErrorKind::BrokenPipe)
            });
            if broken_pipe {
                return ExitCode::SUCCESS;
            }
            // One line, whatever the file put in the message.
            eprintln!("memprof: error: {}", terminal_text(&format!("{err:#}")));
            ExitCode::from(2)
        }
    }
}
