//! Caller credentials: acting as the caller for creates, its supplementary groups.

use super::backing::CredGuard;
use super::error::FsResult;
use super::Caller;

/// Switch this thread's filesystem credentials to the caller's for a create. With
/// `modes_decide: false` (`sandbox.uid_per_smith`: docs/SPEC.md §3, the rules alone decide
/// between smiths) the store's mode bits do not stop it — a parent's task in its child's
/// `inbox/`, the child's uid — while the new inode is still the caller's from its first instant
/// (notes XT10).
pub(super) fn as_caller(caller: &Caller, modes_decide: bool) -> FsResult<CredGuard> {
    if caller.uid == 0 {
        return Ok(CredGuard::switch(0, 0, &[])?);
    }
    let groups = caller_groups(caller.pid);
    if modes_decide {
        Ok(CredGuard::switch(caller.uid, caller.gid, &groups)?)
    } else {
        Ok(CredGuard::switch_overriding_modes(
            caller.uid, caller.gid, &groups,
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
