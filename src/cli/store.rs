//! Where the reporting commands read from (docs/SPEC.md §6): the live mount's `.smithfs/`
//! files, or — on a directory that is not mounted (post-mortem) — the store itself: the
//! journal in `.smithfs-state/` (with its rotated files) and the smith dirs under `smiths/`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::util::{self, MountState};
use crate::sched::journal::{self, Terminal};
use crate::sched::view::{SmithRow, StatusDoc};
use crate::tree::model::{parse_child_name, FullId, ROOT_ID};

/// What a reporting command reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `DIR/.smithfs/` is there (a live mount): read the control files.
    Mount(PathBuf),
    /// `DIR` is not mounted but holds a smithfs store (`smiths/` or `.smithfs-state/`).
    Store(PathBuf),
}

impl Source {
    /// The directory (mount point or store).
    pub fn dir(&self) -> &Path {
        match self {
            Source::Mount(d) | Source::Store(d) => d,
        }
    }
}

/// Decide where to read `dir` from: its `.smithfs/` when present, else the store when nothing
/// is mounted there and it looks like one.
///
/// # Errors
/// Neither: the one-line reason (not a smithfs directory, a dead mount, another filesystem).
pub fn source(dir: &Path) -> Result<Source> {
    if dir.join(".smithfs").is_dir() {
        return Ok(Source::Mount(dir.to_path_buf()));
    }
    if util::mount_state(dir) == MountState::NotMounted
        && (dir.join(crate::tree::layout::STATE_DIR).is_dir() || dir.join("smiths").is_dir())
    {
        return Ok(Source::Store(dir.to_path_buf()));
    }
    util::control_file(dir, "status.json")?;
    anyhow::bail!(
        "{} is neither a smithfs mount nor a smithfs directory (made by `smithfs init`)",
        dir.display()
    )
}

/// The store's `.smithfs-state/` directory, opened (`None` if there is none).
fn state_dir(dir: &Path) -> Option<std::fs::File> {
    std::fs::File::open(dir.join(crate::tree::layout::STATE_DIR)).ok()
}

/// The journal files of a store, oldest first, as [`journal::files`] lists them (docs/SPEC.md
/// §7: rotation keeps `journal.keep` old files).
pub fn journal_files(dir: &Path) -> Vec<PathBuf> {
    let state = dir.join(crate::tree::layout::STATE_DIR);
    let names = state_dir(dir)
        .and_then(|d| journal::files(std::os::fd::AsFd::as_fd(&d)).ok())
        .unwrap_or_else(|| vec![journal::JOURNAL_NAME.to_owned()]);
    names
        .iter()
        .map(|n| state.join(OsStr::from_bytes(n.as_bytes())))
        .collect()
}

/// Every complete line of the store's journal across its rotated files, oldest first
/// ([`journal::read_all_bytes`]).
pub fn journal_bytes(dir: &Path) -> Vec<u8> {
    state_dir(dir)
        .and_then(|d| journal::read_all_bytes(std::os::fd::AsFd::as_fd(&d)).ok())
        .unwrap_or_default()
}

/// The smiths of a store by walking `smiths/smith-root` and the `children/smith-NNN` below it:
/// (full id, parent, level), parents first.
fn walk(dir: &Path) -> Vec<(String, Option<String>, u8)> {
    let mut out = Vec::new();
    let root = dir.join("smiths").join(ROOT_ID);
    if !root.is_dir() {
        return out;
    }
    let mut stack = vec![(root, ROOT_ID.to_string(), None::<String>, 0u8)];
    while let Some((path, full, parent, level)) = stack.pop() {
        let mut kids: Vec<String> = std::fs::read_dir(path.join("children"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                    .filter(|n| parse_child_name(OsStr::new(n)).is_some())
                    .collect()
            })
            .unwrap_or_default();
        kids.sort();
        for k in kids.iter().rev() {
            stack.push((
                path.join("children").join(k),
                format!("{full}/{k}"),
                Some(full.clone()),
                level + 1,
            ));
        }
        out.push((full, parent, level));
    }
    out
}

/// `smiths/smith-root/children/smith-001` for `smith-root/smith-001`.
pub fn rel_dir(full_id: &str) -> String {
    FullId::parse(full_id).map_or_else(
        || format!("smiths/{}", full_id.replace('/', "/children/")),
        |f| f.smith_path(),
    )
}

/// The status document of a store that is not mounted (docs/SPEC.md §7, §9): smiths found in
/// the tree, states as a mount would rebuild them (`done` with a result, `failed`/`cancelled`
/// from the journal, `waiting` for a parent that ran, else `idle`), `state_since` its last
/// run's end (the last journaled event naming it for an `idle` smith or one whose run has no end).
pub fn status_doc(dir: &Path) -> StatusDoc {
    let events = journal::parse(&journal_bytes(dir));
    // The snapshot of rotated-away lines too, as a mount rebuilds it (docs/SPEC.md §7).
    let hist = state_dir(dir)
        .and_then(|d| journal::load(std::os::fd::AsFd::as_fd(&d)).ok())
        .map_or_else(|| journal::replay(&events).0, |r| r.hist);
    let mut last_ts: std::collections::HashMap<&str, &str> = Default::default();
    for ev in &events {
        if let Some(s) = &ev.smith {
            last_ts.insert(s.as_str(), ev.ts.as_str());
        }
    }
    let smiths = walk(dir);
    let parents: std::collections::HashSet<&str> =
        smiths.iter().filter_map(|s| s.1.as_deref()).collect();
    let rows = smiths
        .iter()
        .map(|(full, parent, level)| {
            let h = hist.get(full).cloned().unwrap_or_default();
            let has_result = dir.join(rel_dir(full)).join("outbox/result.md").is_file();
            let state = if has_result {
                "done"
            } else {
                match h.terminal {
                    Some(Terminal::Failed) => "failed",
                    Some(Terminal::Cancelled) => "cancelled",
                    None if h.runs > 0 && parents.contains(full.as_str()) => "waiting",
                    None => "idle",
                }
            };
            // Since the state began: the last run's end for a smith that ran (its state was
            // settled by that end, as a mount's status counts it), else its last event — not
            // any later line (an unmount's) that names it.
            let since = h
                .last_run
                .as_ref()
                .and_then(|lr| lr.ended.clone())
                .filter(|_| state != "idle")
                .or_else(|| last_ts.get(full.as_str()).map(|t| t.to_string()));
            let last_run = h.last_run.map(|mut lr| {
                lr.log = Some(format!(
                    "{}/conversations/{}/messages.log",
                    rel_dir(full),
                    lr.run_id
                ));
                lr
            });
            SmithRow {
                full_id: full.clone(),
                parent: parent.clone(),
                level: *level,
                state: state.into(),
                state_since: since,
                runs: h.runs,
                has_result,
                last_run,
            }
        })
        .collect();
    let config = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| crate::config::Config::parse(&t).ok());
    StatusDoc {
        smiths: rows,
        agent_configured: config.as_ref().is_some_and(|c| c.agent.command.is_some()),
        limits: config.map(|c| c.limits),
    }
}

/// The status document and its JSON text from `src`.
///
/// # Errors
/// The mount's `status.json` cannot be read or parsed (the message names the file).
pub fn read_status(src: &Source) -> Result<(String, StatusDoc)> {
    match src {
        Source::Mount(dir) => {
            let path = dir.join(".smithfs/status.json");
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "cannot read {} (is {} a live smithfs mount?)",
                    path.display(),
                    dir.display()
                )
            })?;
            let doc = serde_json::from_str(&text)
                .with_context(|| format!("{}: not a status document", path.display()))?;
            Ok((text, doc))
        }
        Source::Store(dir) => {
            let doc = status_doc(dir);
            let mut text = serde_json::to_string_pretty(&doc)?;
            text.push('\n');
            Ok((text, doc))
        }
    }
}

/// Resolve the smith id `query` (docs/SPEC.md §6) against the smiths `src` knows.
///
/// # Errors
/// The status cannot be read, or the id is ambiguous or unknown ([`super::ids::UsageError`],
/// exit 2).
pub fn resolve_id(src: &Source, query: &str) -> Result<String> {
    let (_, doc) = read_status(src)?;
    let known: Vec<&str> = doc.smiths.iter().map(|s| s.full_id.as_str()).collect();
    Ok(super::ids::resolve(&known, query)?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_files_oldest_first_and_walk() {
        let t = tempfile::tempdir().expect("tempdir");
        let d = t.path();
        let st = d.join(crate::tree::layout::STATE_DIR);
        std::fs::create_dir_all(&st).unwrap();
        for n in [
            "events.jsonl",
            "events.jsonl.1",
            "events.jsonl.3",
            "events.jsonl.x",
        ] {
            std::fs::write(st.join(n), format!("{n}\n")).unwrap();
        }
        let names: Vec<String> = journal_files(d)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["events.jsonl.3", "events.jsonl.1", "events.jsonl"]);
        for p in [
            "smiths/smith-root/children/smith-002/children/smith-001",
            "smiths/smith-root/children/smith-001",
            "smiths/smith-root/children/notes",
            "smiths/smith-root/private/children/smith-009",
        ] {
            std::fs::create_dir_all(d.join(p)).unwrap();
        }
        let ids: Vec<String> = walk(d).into_iter().map(|s| s.0).collect();
        assert_eq!(
            ids,
            [
                "smith-root",
                "smith-root/smith-001",
                "smith-root/smith-002",
                "smith-root/smith-002/smith-001"
            ]
        );
        assert_eq!(
            rel_dir("smith-root/smith-002/smith-001"),
            "smiths/smith-root/children/smith-002/children/smith-001"
        );
    }
}
