//! Caller credentials: acting as the caller for creates, its supplementary groups.

use std::os::fd::BorrowedFd;

use super::backing::CredGuard;
use super::error::FsResult;
use super::inode::Inode;
use super::{Caller, SmithFs};
use crate::identity::Identity;
use crate::policy::Zone;

impl SmithFs {
    /// The credentials a create in the store directory `dir` is made with: the caller's
    /// ([`as_caller`]), except that with the sandbox on an Operator's create as root in a
    /// smith dir, in a directory of the agents (one not owned by root: a smith's areas, brought
    /// over to the agents' uid at mount) is made as that directory's owner, from the new inode's first
    /// instant — what the operator puts in a smith's area the smith can go on with, and the
    /// kernel's mode check, which records no `why`, does not come before the §3 rules
    /// (docs/SPEC.md §12 "ownership", notes XT16). The store's mode bits do not stop the
    /// operator (`CAP_DAC_OVERRIDE` stays raised).
    ///
    /// `who` is the caller's identity: a smith's process with the sandbox on is a sandboxed run,
    /// which has no supplementary groups (§12), so they are not read from `/proc/PID/status` on
    /// every create.
    pub(super) fn create_creds(
        &self,
        caller: &Caller,
        who: Identity,
        dir: &Inode,
        dir_fd: BorrowedFd<'_>,
    ) -> FsResult<CredGuard> {
        let in_smith_dir = matches!(self.zone(dir), Zone::Smith(_));
        if caller.uid == 0 && in_smith_dir && self.opts.agents.is_some() {
            if let Ok(st) = nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(&dir_fd)) {
                if st.st_uid != 0 {
                    return Ok(CredGuard::switch_overriding_modes(
                        st.st_uid,
                        st.st_gid,
                        &[],
                    )?);
                }
            }
        }
        if caller.uid != 0 && self.opts.agents.is_some() && matches!(who, Identity::Smith(_)) {
            return switch_to(caller, &[], self.modes_decide());
        }
        as_caller(caller, self.modes_decide())
    }
}

impl SmithFs {
    /// The credentials a chmod or chown is made with: none for root (the operator, or a root
    /// daemon's own request), else the caller's — a sandboxed smith's without supplementary
    /// groups (§12), as [`SmithFs::create_creds`] — so that the store refuses what the kernel
    /// refuses an unprivileged process: a mode change of a file it does not own, a chown to
    /// another uid, a chgrp to a group it is not in (notes XT24).
    pub(super) fn attr_creds(&self, caller: &Caller, who: Identity) -> FsResult<Option<CredGuard>> {
        if caller.uid == 0 {
            return Ok(None);
        }
        if self.opts.agents.is_some() && matches!(who, Identity::Smith(_)) {
            return switch_to(caller, &[], self.modes_decide()).map(Some);
        }
        as_caller(caller, self.modes_decide()).map(Some)
    }
}

/// Switch this thread's filesystem credentials to the caller's for a create. With
/// `modes_decide: false` (`sandbox.uid_per_smith`: docs/SPEC.md §3, the rules alone decide
/// between smiths) the store's mode bits do not stop it — a parent's task in its child's
/// `inbox/`, the child's uid — while the new inode is still the caller's from its first instant
/// (notes XT10).
pub(super) fn as_caller(caller: &Caller, modes_decide: bool) -> FsResult<CredGuard> {
    if caller.uid == 0 {
        return Ok(CredGuard::switch(0, 0, &[])?);
    }
    switch_to(caller, &caller_groups(caller.pid), modes_decide)
}

/// [`as_caller`] with the caller's supplementary groups given.
fn switch_to(caller: &Caller, groups: &[u32], modes_decide: bool) -> FsResult<CredGuard> {
    if modes_decide {
        Ok(CredGuard::switch(caller.uid, caller.gid, groups)?)
    } else {
        Ok(CredGuard::switch_overriding_modes(
            caller.uid, caller.gid, groups,
        )?)
    }
}

/// Supplementary groups of process `pid` (empty when unknown).
pub(super) fn caller_groups(pid: u32) -> Vec<u32> {
    if pid == 0 {
        return Vec::new();
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
