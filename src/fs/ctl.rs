//! The virtual control files under `.smithfs/` and `ctl` commands (docs/SPEC.md §6, §7).

use std::os::fd::AsFd;

use super::control::{Command, ControlFile};
use super::error::{FsError, FsResult};
use super::ids::Fh;
use super::{backing, control, Caller, OpenControl, SmithFs};
use crate::identity::Identity;
use crate::policy::{self, Area, CtlVerb, Ctx, Depth, Zone};
use crate::trigger::Trigger;

impl SmithFs {
    pub(super) fn open_control(&self, caller: &Caller, f: ControlFile, flags: i32) -> FsResult<Fh> {
        let who = self.identify(caller);
        let writing = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let decision = policy::decide_control_open(&who, f == ControlFile::Ctl, writing);
        let op = if writing {
            "open for writing"
        } else {
            "open for reading"
        };
        self.enforce(caller, who, decision, op, || {
            format!("{}/{}", control::DIR_NAME, f.name())
        })?;
        let data = match f {
            ControlFile::Whoami => self.whoami_text(caller, who).into_bytes(),
            ControlFile::Why => match self.why.render(who, caller.uid) {
                Some(text) => text.into_bytes(),
                None => {
                    format!("no denial recorded for {}\n", self.identity_name(who)).into_bytes()
                }
            },
            ControlFile::Status => match self.ports.sched.status_json() {
                Some(s) => s.into_bytes(),
                None => self.plain_status().into_bytes(),
            },
            // Served live from the scheduler's journal (`read_control`); without a scheduler
            // (a filesystem without a daemon, as in tests) it is empty.
            ControlFile::Events => Vec::new(),
            // Served live from the file (`read_control`).
            ControlFile::DaemonLog => Vec::new(),
            ControlFile::Ctl => Vec::new(),
        };
        Ok(self.controls.insert(OpenControl {
            file: f,
            data,
            origin: std::sync::atomic::AtomicU64::new(u64::MAX),
        }))
    }

    /// The size of control file `f` as `stat` shows it: the journal's end for `events.jsonl`
    /// and the file's size for `daemon.log`, both read live, so `tail -f` follows them; 0 for
    /// the others, whose content is made at open (docs/PROTOCOL-NOTES.md O13).
    pub(super) fn control_size(&self, f: ControlFile) -> u64 {
        match f {
            ControlFile::Events => self.ports.sched.journal_end().unwrap_or(0),
            ControlFile::DaemonLog => backing::stat_at(self.state.as_fd(), DAEMON_LOG)
                .map_or(0, |st| st.st_size.max(0) as u64),
            _ => 0,
        }
    }

    /// Read up to `size` bytes at `offset` of the open control file `fh`: `events.jsonl` and
    /// `daemon.log` live (O13), the others from the content made at open.
    pub(super) fn read_control(&self, fh: Fh, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        use std::sync::atomic::Ordering;
        let h = self.controls.get(fh)?;
        match h.file {
            ControlFile::Events => {
                // A first read at 0 (`cat`) starts at the oldest line kept, and this handle's
                // offsets are journal offsets less that; any other first read (`tail`, which
                // seeks near the size) reads journal offsets as they are.
                let origin = match h.origin.load(Ordering::Relaxed) {
                    u64::MAX if offset == 0 => None,
                    u64::MAX => {
                        h.origin.store(0, Ordering::Relaxed);
                        Some(0)
                    }
                    o => Some(o),
                };
                let at = offset + origin.unwrap_or(0);
                if let Some(got) = self.ports.sched.journal_read(at, size as usize) {
                    let (start, bytes) = got?;
                    match origin {
                        None => h.origin.store(start, Ordering::Relaxed),
                        // Rotation dropped what this reader had not read yet: it reads on from
                        // the oldest line kept, and its later offsets follow on from there —
                        // never the same line twice, never half a line (F-journal-1).
                        Some(o) if start > at => {
                            h.origin.store(o + (start - at), Ordering::Relaxed);
                        }
                        Some(_) => {}
                    }
                    return Ok(bytes);
                }
            }
            ControlFile::DaemonLog => {
                let fd = match backing::open_file(self.state.as_fd(), DAEMON_LOG, libc::O_RDONLY, 0)
                {
                    Ok(fd) => fd,
                    Err(nix::errno::Errno::ENOENT) => return Ok(Vec::new()),
                    Err(e) => return Err(e.into()),
                };
                let mut buf = vec![0u8; size as usize];
                let n = backing::pread(fd.as_fd(), &mut buf, offset)?;
                buf.truncate(n);
                return Ok(buf);
            }
            _ => {}
        }
        let start = (offset as usize).min(h.data.len());
        let end = (start + size as usize).min(h.data.len());
        Ok(h.data[start..end].to_vec())
    }

    /// `lseek` with `SEEK_DATA`/`SEEK_HOLE` on an open control file: `events.jsonl`'s data
    /// starts at the oldest journal offset still kept (what a first read at 0 starts at);
    /// everything else is data up to the size.
    pub(super) fn lseek_control(&self, f: ControlFile, offset: i64, whence: i32) -> FsResult<i64> {
        let size = self.control_size(f) as i64;
        let first = match f {
            ControlFile::Events => match self.ports.sched.journal_read(0, 0) {
                Some(Ok((start, _))) => start as i64,
                _ => 0,
            },
            _ => 0,
        };
        match whence {
            libc::SEEK_DATA if offset < size => Ok(offset.max(first)),
            libc::SEEK_HOLE if offset < size => Ok(size),
            libc::SEEK_DATA | libc::SEEK_HOLE => Err(FsError::SeekPastEnd),
            _ => Err(FsError::BadWhence),
        }
    }

    pub(super) fn write_control(&self, caller: &Caller, fh: Fh, data: &[u8]) -> FsResult<u32> {
        let h = self.controls.get(fh)?;
        if h.file != ControlFile::Ctl {
            return Err(FsError::NotCtl);
        }
        let who = self.identify(caller);
        let text = std::str::from_utf8(data).map_err(|_| FsError::BadName)?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            self.run_command(caller, who, line)?;
        }
        Ok(data.len() as u32)
    }

    /// Run one `ctl` command as `who` (docs/SPEC.md §7).
    pub(super) fn run_command(&self, caller: &Caller, who: Identity, line: &str) -> FsResult<()> {
        let path = || format!("{}/{}", control::DIR_NAME, ControlFile::Ctl.name());
        let cmd = match control::parse_command(line) {
            Ok(c) => c,
            Err(msg) => {
                return Err(self.denied(caller, who, "ctl", path(), policy::ctl_syntax(&msg)))
            }
        };
        if cmd == Command::Reload {
            let decision = policy::decide_reload(&who, &self.identity_name(who));
            self.enforce(caller, who, decision, "reload", path)?;
            return match self.ports.reload.reload() {
                Ok(changed) => {
                    tracing::info!(pid = caller.pid, ?changed, "config.json reloaded");
                    Ok(())
                }
                // Journaled by the reloader as `config.reload_failed`, not as a denial.
                Err(e) => Err(self.record_denial(
                    caller,
                    who,
                    "reload",
                    path(),
                    policy::reload_refused(&e),
                    false,
                )),
            };
        }
        let (verb, name, full_id) = match &cmd {
            Command::Bind(f) => (CtlVerb::Bind, "bind", f.clone()),
            Command::Cancel(f) => (CtlVerb::Cancel, "cancel", f.clone()),
            Command::Retry(f) => (CtlVerb::Retry, "retry", f.clone()),
            Command::Reload => return Ok(()),
        };
        let target = self.registry.by_full_id(&full_id);
        let decision = policy::decide_ctl(
            &who,
            &self.identity_name(who),
            verb,
            &full_id,
            target,
            |a, d| self.registry.is_ancestor(a, d),
        );
        self.enforce(caller, who, decision, name, path)?;
        let Some(smith) = target else {
            return Ok(());
        };
        match verb {
            CtlVerb::Bind => {
                if let Err(e) = self.identities.bind(caller.pid, smith) {
                    let d = policy::bind_failed(e.errno, caller.pid, &full_id, &e.reason);
                    return Err(self.denied(caller, who, name, path(), d));
                }
                tracing::info!(pid = caller.pid, smith = %full_id, "process bound");
            }
            CtlVerb::Cancel => self.emit(Trigger::Cancel { smith }),
            CtlVerb::Retry => self.emit(Trigger::Retry { smith }),
        }
        Ok(())
    }

    /// `.smithfs/whoami`: key: value lines (docs/SPEC.md §7).
    pub(super) fn whoami_text(&self, caller: &Caller, who: Identity) -> String {
        self.with_ctx(|ctx| self.whoami_lines(caller, who, ctx))
    }

    pub(super) fn whoami_lines(&self, caller: &Caller, who: Identity, ctx: &Ctx<'_>) -> String {
        let mut out = String::new();
        let kind = match who {
            Identity::Smith(_) => "smith",
            Identity::Operator => "operator",
            Identity::Unknown => "unknown",
        };
        out.push_str(&format!("identity: {kind}\n"));
        match who {
            Identity::Smith(s) => {
                if let Some(info) = self.registry.get(s) {
                    let parent = info
                        .parent
                        .and_then(|p| self.registry.full_id(p))
                        .map(String::from)
                        .unwrap_or_default();
                    out.push_str(&format!("full id: {}\n", info.full_id));
                    out.push_str(&format!("smith id: {}\n", info.id));
                    out.push_str(&format!("level: {}\n", info.level));
                    out.push_str(&format!("parent: {parent}\n"));
                    out.push_str(&format!(
                        "smith dir: {}\n",
                        self.opts.mount_point.join(info.rel_dir()).display()
                    ));
                    let z = |area| {
                        Zone::Smith(crate::policy::SmithZone {
                            owner: s,
                            owner_parent: info.parent,
                            owner_level: info.level,
                            area,
                            depth: Depth::Inner,
                        })
                    };
                    for (label, area) in [
                        ("smith.md", Area::SmithMd),
                        ("config.json", Area::Config),
                        ("inbox", Area::Inbox),
                        ("private", Area::Private),
                        ("outbox", Area::Outbox),
                        ("conversations", Area::Conversations),
                        ("children", Area::Children),
                        ("home", Area::Home),
                    ] {
                        let r = crate::policy::rights(&who, &z(area), ctx);
                        out.push_str(&format!("rights {label}: {r}\n"));
                    }
                    if let Some(p) = info.parent {
                        if let Some(pi) = self.registry.get(p) {
                            let pz = Zone::Smith(crate::policy::SmithZone {
                                owner: p,
                                owner_parent: pi.parent,
                                owner_level: pi.level,
                                area: Area::Outbox,
                                depth: Depth::Inner,
                            });
                            let r = crate::policy::rights(&who, &pz, ctx);
                            out.push_str(&format!("rights parent outbox: {r}\n"));
                        }
                    }
                    let limits = self.opts.limits.limits();
                    out.push_str(&format!(
                        "limits: max_level {}, max_children {}\n",
                        limits.max_level, limits.max_children
                    ));
                    let (_, mine) = self.open_limits.open_now(Some(s));
                    out.push_str(&format!(
                        "open files: {} (limit {})\n",
                        mine.unwrap_or(0),
                        self.open_limits.per_smith()
                    ));
                    out.push_str(&self.storage_lines(s));
                }
            }
            Identity::Operator => {
                out.push_str(&format!("operator mode: {}\n", self.opts.operator.as_str()));
            }
            Identity::Unknown => {}
        }
        out.push_str(&format!("identity mode: {}\n", self.identities.mode_name()));
        out.push_str(&format!("pid: {}\nuid: {}\n", caller.pid, caller.uid));
        // The uid and gid runs of this caller execute as (the smith's; the operator: the
        // agents' user), when the sandbox is on (docs/SPEC.md §7, §12).
        if let Some(a) = &self.opts.agents {
            let ids = match who {
                Identity::Smith(s) => self.registry.full_id(s).and_then(|f| a.uid_of(&f).ok()),
                Identity::Operator | Identity::Unknown => Some((a.uid(), a.gid())),
            };
            if let Some((u, g)) = ids {
                out.push_str(&format!("agents uid: {u}\nagents gid: {g}\n"));
            }
            // Layers removed by the daemon's test knob (docs/PROTOCOL-NOTES.md SB14).
            let removed = crate::sandbox::layers::Removed::of_this_daemon();
            if !removed.is_none() {
                out.push_str(&format!("sandbox without: {}\n", removed.names()));
            }
        }
        out.push_str(&format!("mount: {}\n", self.opts.mount_point.display()));
        out.push_str(&format!("daemon pid: {}\n", std::process::id()));
        out
    }

    pub(super) fn plain_status(&self) -> String {
        self.registry.idle_status(false).to_string() + "\n"
    }
}

/// The daemon's log in `.smithfs-state/` (`.smithfs/daemon.log`, O8).
const DAEMON_LOG: &std::ffi::CStr = c"daemon.log";
