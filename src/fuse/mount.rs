//! Making the FUSE mount itself, with the type `fuse.smithfs` whoever mounts (docs/SPEC.md §6):
//! `mount(2)` on a `/dev/fuse` connection this process opened when the kernel lets it (root, or
//! CAP_SYS_ADMIN in the mount's user namespace), otherwise the setuid `fusermount3`, which opens
//! `/dev/fuse` itself — so a root-only `/dev/fuse` (`crw-------`) does not stop an unprivileged
//! mount — and hands the connection back over a socket (libfuse's `_FUSE_COMMFD` protocol).
//! Both are what libfuse's `fuse_kern_mount` does; fuser 0.18's own direct mount uses the bare
//! type `fuse` and never falls back when `/dev/fuse` cannot be opened, hence this module
//! (docs/PROTOCOL-NOTES.md O42).

use std::ffi::CString;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Result};

use crate::sys::mount::{FS_NAME, FS_TYPE};

/// The setuid helper of libfuse 3 that mounts for unprivileged users.
pub const FUSERMOUNT: &str = "fusermount3";

/// How a mount was made: decides how it is undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `mount(2)` by this process.
    Direct,
    /// The setuid `fusermount3`.
    Fusermount,
}

/// `fusermount3` on `PATH`, as `mount` runs it and `doctor` reports it.
pub fn fusermount() -> Option<PathBuf> {
    crate::sys::path::find_program(FUSERMOUNT.as_ref())
}

/// Mount a FUSE connection at `dir` (type [`FS_TYPE`], source [`FS_NAME`], `nosuid`, `nodev`,
/// plus `default_permissions` and `allow_other` when asked) and return the `/dev/fuse` descriptor that
/// serves it. The kernel sends INIT on it next.
///
/// # Errors
/// One line: `/dev/fuse` missing, no way to mount for this user (`/dev/fuse` not accessible and
/// no `fusermount3`), or `cannot mount DIR: …` with the kernel's or fusermount3's reason.
pub fn mount(dir: &Path, allow_other: bool, default_permissions: bool) -> Result<(OwnedFd, Via)> {
    let (denied, dev_denied) = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(dev) => match mount_direct(OwnedFd::from(dev), dir, allow_other, default_permissions)? {
            Some(fd) => return Ok((fd, Via::Direct)),
            None => ("mount(2) is not permitted to this user", false),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("/dev/fuse does not exist: load the fuse kernel module (modprobe fuse)")
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            ("/dev/fuse is not accessible to this user", true)
        }
        Err(e) => bail!("/dev/fuse: {e}"),
    };
    let Some(helper) = fusermount() else {
        bail!("{denied} and {FUSERMOUNT} is not installed (apt-get install fuse3)");
    };
    match mount_fusermount(&helper, dir, allow_other, default_permissions) {
        Ok(fd) => Ok((fd, Via::Fusermount)),
        // fusermount3 (libfuse 3) opens /dev/fuse as the calling user: say what to change.
        // SAFETY: geteuid has no preconditions.
        Err(e) if dev_denied && unsafe { libc::geteuid() } != 0 => Err(e.context(format!(
            "{denied} ({}): as root, chmod 0666 /dev/fuse (the mode distributions ship)",
            dev_fuse_mode()
        ))),
        Err(e) => Err(e),
    }
}

/// `mode 0600, owner 0:0` of `/dev/fuse`, for messages.
pub fn dev_fuse_mode() -> String {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::metadata("/dev/fuse").map_or_else(
        |e| e.to_string(),
        |m| {
            format!(
                "mode {:04o}, owner {}:{}",
                m.permissions().mode() & 0o7777,
                m.uid(),
                m.gid()
            )
        },
    )
}

/// `mount(2)` with `dev` as the connection; `None` when the kernel says EPERM (unprivileged).
fn mount_direct(
    dev: OwnedFd,
    dir: &Path,
    allow_other: bool,
    default_permissions: bool,
) -> Result<Option<OwnedFd>> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir).map_err(|e| anyhow!("{}: {e}", dir.display()))?;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={:o},user_id={uid},group_id={gid}",
        dev.as_raw_fd(),
        meta.mode() & libc::S_IFMT,
    );
    if default_permissions {
        data.push_str(",default_permissions");
    }
    if allow_other {
        data.push_str(",allow_other");
    }
    let target = CString::new(dir.as_os_str().as_bytes())?;
    let source = CString::new(FS_NAME)?;
    let fstype = CString::new(FS_TYPE)?;
    let data = CString::new(data)?;
    // SAFETY: all pointers are NUL-terminated strings that live across the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc == 0 {
        return Ok(Some(dev));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EPERM) {
        return Ok(None);
    }
    bail!("cannot mount {}: {e}", dir.display())
}

/// Run `fusermount3 -o OPTS -- DIR` with one end of a socket pair in `_FUSE_COMMFD` and receive
/// the `/dev/fuse` descriptor it sends back (SCM_RIGHTS).
fn mount_fusermount(
    helper: &Path,
    dir: &Path,
    allow_other: bool,
    default_permissions: bool,
) -> Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    let mut opts = format!("fsname={FS_NAME},subtype={FS_NAME},nodev,nosuid");
    if default_permissions {
        opts.push_str(",default_permissions");
    }
    if allow_other {
        opts.push_str(",allow_other");
    }
    let their_fd: RawFd = theirs.as_raw_fd();
    let mut cmd = Command::new(helper);
    cmd.arg("-o")
        .arg(&opts)
        .arg("--")
        .arg(dir)
        .env("_FUSE_COMMFD", their_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure only calls fcntl (async-signal-safe) on a descriptor that stays open
    // until the child has been spawned.
    unsafe {
        cmd.pre_exec(move || {
            let flags = libc::fcntl(their_fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(their_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let child = cmd
        .spawn()
        .map_err(|e| anyhow!("cannot run {}: {e}", helper.display()))?;
    drop(theirs);
    let received = receive_fd(&ours);
    drop(ours);
    let out = child
        .wait_with_output()
        .map_err(|e| anyhow!("{FUSERMOUNT}: {e}"))?;
    match received {
        Some(fd) => Ok(fd),
        None => {
            let why = String::from_utf8_lossy(&out.stderr);
            let why = why.lines().map(str::trim).find(|l| !l.is_empty());
            bail!(
                "cannot mount {}: {}",
                dir.display(),
                why.unwrap_or("fusermount3 sent no connection")
            )
        }
    }
}

/// The descriptor of one SCM_RIGHTS message on `sock`; `None` at EOF or on anything else.
fn receive_fd(sock: &UnixStream) -> Option<OwnedFd> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(RawFd);
    let msg = loop {
        match recvmsg::<UnixAddr>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
            Ok(m) => break m,
        }
    };
    let mut fds = msg.cmsgs().ok()?.filter_map(|c| match c {
        ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
        _ => None,
    });
    let fd = fds.next().filter(|fd| *fd >= 0)?;
    // SAFETY: the kernel just installed `fd` in this process for us; nobody else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fd-passing half of the fusermount3 protocol, against a peer that sends a descriptor
    /// the way fusermount3 does (one byte, one SCM_RIGHTS).
    #[test]
    fn receives_the_descriptor_fusermount3_sends() {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
        use std::io::IoSlice;
        let (a, b) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        let sent = [file.as_raw_fd()];
        sendmsg::<UnixAddr>(
            b.as_raw_fd(),
            &[IoSlice::new(b"\0")],
            &[ControlMessage::ScmRights(&sent)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        let fd = receive_fd(&a).expect("a descriptor");
        let ino = |fd: RawFd| std::fs::metadata(format!("/proc/self/fd/{fd}")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(ino(fd.as_raw_fd()).ino(), ino(file.as_raw_fd()).ino());
        drop(b);
        assert!(receive_fd(&a).is_none(), "EOF gives no descriptor");
    }
}
