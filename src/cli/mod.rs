//! Command line (PROTOCOL.md §6): one file per subcommand. Errors end as one clear line on
//! stderr and a non-zero exit.

pub mod init;
mod mount;
mod umount;
pub(crate) mod util;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// smithfs: a FUSE filesystem that enforces the Agent Smith protocol for fleets of agents.
#[derive(Debug, Parser)]
#[command(name = "smithfs", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the layout, a default config.json and the root smith in DIR.
    Init(init::InitArgs),
    /// Mount DIR over itself (the directory is both mount point and backing store).
    Mount(mount::MountArgs),
    /// Unmount DIR.
    Umount(umount::UmountArgs),
}

/// Parse the command line, run the subcommand and map its outcome to an exit code.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Init(a) => init::run(a),
        Command::Mount(a) => mount::run(a),
        Command::Umount(a) => umount::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("smithfs: {e:#}");
            ExitCode::from(1)
        }
    }
}
