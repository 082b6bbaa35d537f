//! The `smithfs` binary: parse the command line and hand over to [`smithfs::cli::run`].

use std::process::ExitCode;

fn main() -> ExitCode {
    smithfs::cli::run()
}
