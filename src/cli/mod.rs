//! Command line: one file per subcommand.

use std::process::ExitCode;

/// Parse the command line, run the subcommand and map its outcome to an exit code.
pub fn run() -> ExitCode {
    ExitCode::SUCCESS
}
