//! `smithfs ui [DIR] [--listen ADDR:PORT] [--open] [--stalled-after SECS]`: the fleet in a
//! browser (docs/SPEC.md §14). Serves `crate::ui` on a loopback port and prints its URL with the
//! token. The [`Fleet`] given to it is the command line itself: the status as `status` reads it,
//! the journal as `events` reads it, `diff`, `accept`, `retry` and `cancel` through the very
//! functions those commands call — one code path per action.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Result};

use super::store::{self, Source};
use super::util::resolve_mount;
use crate::sched::view::StatusDoc;
use crate::ui::{Fleet, Options, Ui};

/// Arguments of `smithfs ui`.
#[derive(Debug, clap::Args)]
pub struct UiArgs {
    /// The mount (default as for `status`). A directory that is not mounted is shown read-only.
    pub dir: Option<PathBuf>,
    /// Listen here instead of 127.0.0.1 on a free port (keep it a loopback address: to reach
    /// the page from elsewhere use an SSH tunnel).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
    /// Open the URL in a browser (xdg-open).
    #[arg(long)]
    pub open: bool,
    /// A running smith with no output for this many seconds is shown as stalled.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub stalled_after: u64,
}

/// The command line as the ui's [`Fleet`].
struct CliFleet {
    dir: PathBuf,
}

/// An error as the one line the command line prints.
fn line(e: anyhow::Error) -> String {
    format!("{e:#}")
}

impl CliFleet {
    fn source(&self) -> Result<Source, String> {
        store::source(&self.dir).map_err(line)
    }

    fn located(&self, full_id: &str) -> Result<super::diff::Located, String> {
        match super::diff::locate_in(&self.dir, full_id).map_err(line)? {
            Ok(l) => Ok(l),
            Err(super::diff::Exit2(msg)) => Err(msg),
        }
    }

    /// The live mount for an action (as `mount_and_id` requires).
    fn live(&self) -> Result<(), String> {
        match self.source()? {
            Source::Mount(_) => Ok(()),
            Source::Store(d) => Err(format!("{} is not mounted: mount it first", d.display())),
        }
    }
}

impl Fleet for CliFleet {
    fn dir(&self) -> &Path {
        &self.dir
    }

    fn mounted(&self) -> Result<bool, String> {
        self.source().map(|s| matches!(s, Source::Mount(_)))
    }

    fn status(&self) -> Result<StatusDoc, String> {
        store::read_status(&self.source()?)
            .map(|(_, d)| d)
            .map_err(line)
    }

    fn journal_end(&self) -> Result<u64, String> {
        super::events::journal_end(&self.dir).map_err(|e| e.to_string())
    }

    fn journal_from(&self, from: u64) -> Result<(Vec<u8>, u64), String> {
        super::events::read_from(&self.dir, from).map_err(|e| e.to_string())
    }

    fn has_project(&self) -> bool {
        std::fs::read_to_string(self.dir.join("config.json"))
            .ok()
            .and_then(|t| crate::config::Config::parse(&t).ok())
            .is_some_and(|c| c.workspace.enabled())
    }

    fn diff(&self, full_id: &str, stat: bool, max: usize) -> Result<(String, bool), String> {
        let d = super::diff::diff_max(&self.located(full_id)?, stat, Some(max)).map_err(line)?;
        // The files left out (over 1 GiB, notes UI14) are named under the list of changes.
        let note = d.note();
        let mut text = d.text;
        if stat && !note.is_empty() {
            text.push_str(&format!("\n{note}\n"));
        }
        Ok((text, d.cut))
    }

    fn commits(&self, full_id: &str, max: usize) -> Result<(String, bool), String> {
        super::diff::commits(&self.located(full_id)?, Some(max))
    }

    fn retry(&self, full_id: &str) -> Result<String, String> {
        self.live()?;
        super::retry::request(&self.dir, full_id).map_err(line)
    }

    fn cancel(&self, full_id: &str) -> Result<String, String> {
        self.live()?;
        super::cancel::request(&self.dir, full_id).map_err(line)
    }

    fn accept(&self, full_id: &str, branch: Option<&str>) -> Result<String, String> {
        self.live()?;
        let a = super::accept::accept(&self.located(full_id)?, branch).map_err(line)?;
        let mut out = format!("{} {}", a.branch, a.commit);
        if a.uncommitted > 0 {
            out.push_str(&format!(
                "\n{} uncommitted change(s) in {full_id}'s workspace not included",
                a.uncommitted
            ));
        }
        Ok(out)
    }

    fn new_task(&self, title: &str, text: &str) -> Result<String, String> {
        self.live()?;
        new_task(&self.dir, title, text).map_err(line)
    }
}

/// Write a task into the root's inbox through the mount, as an operator's editor would (one
/// create, one write, the release completes it: docs/SPEC.md §5), from the mount's `task.md`
/// template: `inbox/task-ui-<UTC time>.md`.
fn new_task(dir: &Path, title: &str, text: &str) -> Result<String> {
    use crate::tree::scaffold_plan::{plan_task, TaskSpec};
    let title = title.trim();
    let description = text.trim();
    if description.is_empty() {
        return Err(anyhow!("the task is empty"));
    }
    let first = description.lines().next().unwrap_or("").trim();
    let title = if title.is_empty() { first } else { title };
    let t = crate::tree::template::Templates::with_overrides(|n| {
        std::fs::read_to_string(dir.join("templates").join(n)).ok()
    })
    .map_err(|e| anyhow!("{e}"))?;
    let now = crate::time::now_rfc3339();
    let stamp: String = now
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(15)
        .collect();
    let name = format!("task-ui-{stamp}.md");
    let content = plan_task(
        &t,
        &TaskSpec {
            title,
            task_id: &name[5..name.len() - 3],
            smith_id: crate::tree::model::ROOT_ID,
            parent_task_id: "none",
            timestamp: &now,
            level: 0,
            description,
            context: "Given by the operator in `smithfs ui`.",
            expected_output: "A complete answer in outbox/result.md.",
        },
    )
    .map_err(|e| anyhow!("{e}"))?;
    let path = dir
        .join(store::rel_dir(crate::tree::model::ROOT_ID))
        .join("inbox")
        .join(&name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
    f.write_all(&content)
        .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
    drop(f);
    Ok(format!(
        "wrote smiths/{}/inbox/{name}",
        crate::tree::model::ROOT_ID
    ))
}

/// Run `smithfs ui`: print the URL, then serve until interrupted.
pub fn run(args: UiArgs) -> Result<ExitCode> {
    let dir = resolve_mount(args.dir.as_deref())?;
    let src = store::source(&dir)?;
    let fleet = CliFleet { dir: dir.clone() };
    let opts = Options {
        listen: args.listen,
        stalled_after: Duration::from_secs(args.stalled_after),
    };
    let ui = Ui::bind(Box::new(fleet), &opts).map_err(|e| anyhow!("{e}"))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", ui.url)?;
    out.flush()?;
    drop(out);
    eprintln!(
        "smithfs ui: {} ({}); Ctrl-C stops it",
        dir.display(),
        match src {
            Source::Mount(_) => "mounted",
            Source::Store(_) => "not mounted: read-only",
        }
    );
    if args.open {
        let _ = std::process::Command::new("xdg-open")
            .arg(&ui.url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
    }
    ui.serve();
    Ok(ExitCode::SUCCESS)
}
