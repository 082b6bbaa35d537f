//! `smithfs completions SHELL` (docs/SPEC.md §6) and the hidden `smithfs man`: a completion
//! script on stdout (clap_complete), and the man pages (clap_mangen) — `smithfs.1` on stdout, or
//! one page per command into a directory, as `scripts/install.sh` does.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::CommandFactory;

/// A shell `completions` writes a script for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    /// bash (source it, or install it into `share/bash-completion/completions/smithfs`).
    Bash,
    /// zsh (`share/zsh/site-functions/_smithfs`).
    Zsh,
    /// fish (`share/fish/vendor_completions.d/smithfs.fish`).
    Fish,
}

/// Arguments of `smithfs completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Arguments of `smithfs man`.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write `smithfs.1` and `smithfs-COMMAND.1` for every command into this directory
    /// (created if missing) instead of printing `smithfs.1`.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Run `smithfs completions`.
pub fn run(args: CompletionsArgs) -> Result<ExitCode> {
    let shell = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(
        shell,
        &mut super::Cli::command(),
        "smithfs",
        &mut std::io::stdout(),
    );
    Ok(ExitCode::SUCCESS)
}

/// Run `smithfs man`.
pub fn man(args: ManArgs) -> Result<ExitCode> {
    let cmd = super::Cli::command();
    match args.dir {
        None => clap_mangen::Man::new(cmd)
            .render(&mut std::io::stdout())
            .context("cannot write the man page")?,
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
