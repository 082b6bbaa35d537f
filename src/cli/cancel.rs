//! `smithfs cancel [DIR] FULL_ID`: stop a smith's run and its subtree's, marking them
//! cancelled, by writing `cancel FULL_ID` to `DIR/.smithfs/ctl` (PROTOCOL.md §6, §7). The mount
//! checks the writer's authority (the operator, or an ancestor smith).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};

use super::util::resolve_mount;

/// Arguments of `smithfs cancel`.
#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    /// `[DIR] FULL_ID`: the mount (default as for `status`) and the smith to cancel, e.g.
    /// `smith-root/smith-001`.
    #[arg(num_args = 1..=2, required = true, value_name = "[DIR] FULL_ID")]
    pub args: Vec<String>,
}

/// Run `smithfs cancel`.
pub fn run(args: CancelArgs) -> Result<ExitCode> {
    let (dir, id) = match args.args.as_slice() {
        [id] => (None, id.as_str()),
        [dir, id] => (Some(PathBuf::from(dir)), id.as_str()),
        _ => bail!("usage: smithfs cancel [DIR] FULL_ID"),
    };
    let dir = resolve_mount(dir.as_deref())?;
    let id = id.trim();
    if id.is_empty() || id.contains(char::is_whitespace) {
        bail!("`{id}` is not a full smith id");
    }
    let ctl = super::util::control_file(&dir, "ctl")?;
    let result = std::fs::OpenOptions::new()
        .write(true)
        .open(&ctl)
        .and_then(|mut f| {
            f.write_all(format!("cancel {id}\n").as_bytes())?;
            f.flush()
        });
    match result {
        Ok(()) => {
            println!("cancelled {id}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => bail!(
                "not allowed to cancel {id}: only the operator or an ancestor smith may (see {}/.smithfs/why)",
                dir.display()
            ),
            Some(libc::ENOENT) if ctl.exists() => bail!("no smith {id}"),
            Some(libc::ENOENT) => bail!(
                "cannot open {} (is {} a live smithfs mount?)",
                ctl.display(),
                dir.display()
            ),
            _ => bail!("cannot cancel {id}: {e}"),
        },
    }
}
