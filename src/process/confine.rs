//! Confinement of the processes a root daemon starts for smiths (runs, and `smithfs run`), so
//! that a root agent cannot leave its smith (docs/SPEC.md §2 "orphaning cannot escape it";
//! docs/PROTOCOL-NOTES.md H13).
//!
//! In cgroup identity mode a process *is* the smith whose cgroup it is in, and root may write
//! its pid into any `cgroup.procs`: the unified hierarchy's root (then it is judged Operator),
//! another smith's `self/` leaf (then it is that smith), or out of its v1 limit cgroups. Root may
//! also read the daemon's descriptors through `/proc/DAEMON/fd` (the backing store, unjudged)
//! and reach the host's mounts through `/proc/1/root`. A confined process:
//!
//! 1. gets its own mount namespace (`unshare(CLONE_NEWNS)`), a recursive *slave* of the
//!    daemon's, so the FUSE mount and every later host mount still appear in it while nothing it
//!    does propagates back;
//! 2. sees `/sys` read-only, recursively (`mount_setattr(AT_RECURSIVE, MOUNT_ATTR_RDONLY)`):
//!    every cgroup filesystem (v1 and v2), fusectl's `abort` and the module parameters are
//!    below it. Reads keep working (runtimes read `memory.max`);
//! 3. sees `/proc/sys` and `/proc/sysrq-trigger` read-only (bind-mounted on themselves, then
//!    read-only): `kernel.core_pattern` and `kernel.modprobe` would run a program of its choice
//!    as full root outside any confinement;
//! 4. keeps only [`KEEP`] of the capabilities, in every set (bounding, permitted, effective,
//!    inheritable; ambient cleared): Docker's default set without `CAP_MKNOD`. Gone are
//!    `CAP_SYS_ADMIN` (no mount, umount, remount, `setns`, new mounts of cgroupfs),
//!    `CAP_SYS_PTRACE` (no ptrace of, and no `/proc/PID/{fd,root,mem}` of, a process with more
//!    capabilities, such as the daemon or init), `CAP_DAC_READ_SEARCH` (no `open_by_handle_at`
//!    into the backing store), `CAP_MKNOD` (no block device of the disk), `CAP_SYS_MODULE`,
//!    `CAP_SYS_RAWIO`, `CAP_BPF` and the rest. The mount flags of a namespace copied into a new
//!    user namespace are locked, so `unshare -Urm` cannot make them writable again; a cgroup2
//!    mount in a new cgroup namespace reaches only the process's own leaf, and a process in a
//!    cgroup below a leaf is judged Unknown (identity::resolve), never Operator.
//!
//! [`Confinement::prepare`] runs in the daemon (it allocates); [`Confinement::apply`] runs in the
//! child between `clone3`/`fork` and `execve` and makes raw system calls only (async-signal-safe,
//! no allocation), so it may also run in a single-threaded `pre_exec`.

use std::ffi::CStr;

use super::{errno, CapData, CapHeader, CAP_V3};

/// The capabilities a confined process keeps (bit numbers of `linux/capability.h`): Docker's
/// default set without `CAP_MKNOD` — `CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `FSETID`, `KILL`,
/// `SETGID`, `SETUID`, `SETPCAP`, `NET_BIND_SERVICE`, `NET_RAW`, `SYS_CHROOT`, `AUDIT_WRITE`,
/// `SETFCAP`. Enough for package managers, git, compilers and agents run as root.
pub const KEEP: u64 = (1 << 0)
    | (1 << 1)
    | (1 << 3)
    | (1 << 4)
    | (1 << 5)
    | (1 << 6)
    | (1 << 7)
    | (1 << 8)
    | (1 << 10)
    | (1 << 13)
    | (1 << 18)
    | (1 << 29)
    | (1 << 31);

/// `CAP_SYS_ADMIN`, the capability confinement needs (and takes away).
const CAP_SYS_ADMIN: u32 = 21;

/// Paths made read-only, recursively, in the confined process's mount namespace.
const READ_ONLY: [&CStr; 3] = [c"/sys", c"/proc/sys", c"/proc/sysrq-trigger"];

/// Paths that are bind-mounted on themselves first (they are not mount points of their own).
const BIND_FIRST: [&CStr; 2] = [c"/proc/sys", c"/proc/sysrq-trigger"];

/// The steps of [`Confinement::apply`], for error reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    /// `unshare(CLONE_NEWNS)`.
    Unshare,
    /// Making the namespace a recursive slave of the daemon's.
    Slave,
    /// Bind-mounting `/proc/sys` or `/proc/sysrq-trigger` on itself.
    Bind,
    /// Making `/sys`, `/proc/sys` or `/proc/sysrq-trigger` read-only.
    ReadOnly,
    /// Dropping capabilities (`PR_CAPBSET_DROP`, ambient, `capset`).
    Capabilities,
}

impl Failed {
    /// What failed, for messages ("making /sys read-only").
    pub fn what(self) -> &'static str {
        match self {
            Failed::Unshare => "creating its mount namespace",
            Failed::Slave => "making its mount namespace a slave",
            Failed::Bind => "bind-mounting /proc/sys",
            Failed::ReadOnly => "making /sys and /proc/sys read-only",
            Failed::Capabilities => "dropping capabilities",
        }
    }
}

/// A confinement ready to apply in a child (see the module header). `Copy`: it holds numbers
/// only, so the child needs no memory of the parent's but its own copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Confinement {
    /// The highest capability number the kernel knows (`/proc/sys/kernel/cap_last_cap`).
    last_cap: u32,
}

impl Confinement {
    /// The confinement for processes started by this process, or `None` when it cannot confine
    /// (it lacks `CAP_SYS_ADMIN` in its effective set: a non-root daemon, whose runs cannot
    /// write cgroup files or ptrace it anyway).
    pub fn prepare() -> Option<Confinement> {
        if !has_effective(CAP_SYS_ADMIN) {
            return None;
        }
        let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(40)
            .min(63);
        Some(Confinement { last_cap })
    }

    /// Confine the calling process (see the module header). Raw system calls only: safe between
    /// `fork`/`clone3` and `execve` (async-signal-safe, no allocation). On an error the caller
    /// must not exec: the process may be half confined.
    ///
    /// # Errors
    /// The step that failed and its errno.
    pub fn apply(&self) -> Result<(), (Failed, i32)> {
        // SAFETY: (the whole block) system calls with NUL-terminated literal paths, null
        // pointers where the kernel accepts them, and pointers to locals that outlive the call.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err((Failed::Unshare, errno()));
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ) != 0
            {
                return Err((Failed::Slave, errno()));
            }
            for p in BIND_FIRST {
                if libc::mount(
                    p.as_ptr(),
                    p.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
                {
                    let e = errno();
                    // A kernel without sysrq has no /proc/sysrq-trigger: nothing to protect.
                    if e != libc::ENOENT {
                        return Err((Failed::Bind, e));
                    }
                }
            }
            for p in READ_ONLY {
                let attr = libc::mount_attr {
                    attr_set: libc::MOUNT_ATTR_RDONLY,
                    attr_clr: 0,
                    propagation: 0,
                    userns_fd: 0,
                };
                if libc::syscall(
                    libc::SYS_mount_setattr,
                    libc::AT_FDCWD,
                    p.as_ptr(),
                    libc::AT_RECURSIVE,
                    &attr as *const libc::mount_attr,
                    std::mem::size_of::<libc::mount_attr>(),
                ) != 0
                {
                    let e = errno();
                    if e != libc::ENOENT {
                        return Err((Failed::ReadOnly, e));
                    }
                }
            }
        }
        self.drop_capabilities()
            .map_err(|e| (Failed::Capabilities, e))
    }

    /// Drop every capability outside [`KEEP`] from the bounding set, clear the ambient set,
    /// then mask the permitted, effective and inheritable sets (raw system calls only).
    fn drop_capabilities(&self) -> Result<(), i32> {
        // SAFETY: prctl and capget/capset with pointers to locals of the right layout.
        unsafe {
            for cap in 0..=self.last_cap {
                if KEEP & (1u64 << cap) == 0
                    && libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) != 0
                {
                    let e = errno();
                    // A capability this kernel does not know.
                    if e != libc::EINVAL {
                        return Err(e);
                    }
                }
            }
            if libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ) != 0
            {
                let e = errno();
                if e != libc::EINVAL {
                    return Err(e);
                }
            }
            let mut header = CapHeader {
                version: CAP_V3,
                pid: 0,
            };
            let mut data = [CapData::default(); 2];
            if libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) != 0 {
                return Err(errno());
            }
            for (i, d) in data.iter_mut().enumerate() {
                // KEEP's low word, then its high word.
                let keep = (KEEP >> (32 * i)) as u32;
                d.effective &= keep;
                d.permitted &= keep;
                d.inheritable &= keep;
            }
            header.version = CAP_V3;
            header.pid = 0;
            if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) != 0 {
                return Err(errno());
            }
        }
        Ok(())
    }
}

/// Whether the calling thread has capability `cap` in its effective set.
fn has_effective(cap: u32) -> bool {
    let mut header = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with pointers to locals of the kernel's layout.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return false;
    }
    let word = (cap / 32) as usize;
    data.get(word)
        .is_some_and(|d| d.effective & (1 << (cap % 32)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_set_is_dockers_default_without_mknod() {
        let names = [
            (0, "CHOWN"),
            (1, "DAC_OVERRIDE"),
            (3, "FOWNER"),
            (4, "FSETID"),
            (5, "KILL"),
            (6, "SETGID"),
            (7, "SETUID"),
            (8, "SETPCAP"),
            (10, "NET_BIND_SERVICE"),
            (13, "NET_RAW"),
            (18, "SYS_CHROOT"),
            (29, "AUDIT_WRITE"),
            (31, "SETFCAP"),
        ];
        let mask = names.iter().fold(0u64, |m, (bit, _)| m | (1 << bit));
        assert_eq!(KEEP, mask);
        // Never kept: DAC_READ_SEARCH 2, MKNOD 27, SYS_MODULE 16, SYS_RAWIO 17, SYS_PTRACE 19,
        // SYS_ADMIN 21, BPF 39.
        for bit in [2, 16, 17, 19, 21, 27, 39] {
            assert_eq!(KEEP & (1 << bit), 0, "capability {bit} must be dropped");
        }
    }

    #[test]
    fn failed_steps_say_what() {
        for f in [
            Failed::Unshare,
            Failed::Slave,
            Failed::Bind,
            Failed::ReadOnly,
            Failed::Capabilities,
        ] {
            assert!(!f.what().is_empty());
        }
    }
}
