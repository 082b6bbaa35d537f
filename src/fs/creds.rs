//! Caller credentials: acting as the caller for creates, its supplementary groups.

use super::backing::CredGuard;
use super::error::FsResult;
use super::Caller;

/// Switch this thread's filesystem credentials to the caller's for a create.
pub(super) fn as_caller(caller: &Caller) -> FsResult<CredGuard> {
    if caller.uid == 0 {
        return Ok(CredGuard::switch(0, 0, &[])?);
    }
    let groups = caller_groups(caller.pid);
    Ok(CredGuard::switch(caller.uid, caller.gid, &groups)?)
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
