//! `sandbox.network: "none"` (docs/SPEC.md §12 "Network"): a network namespace of the run's own
//! with only its loopback interface, up. The host's interfaces, its loopback (a model server on
//! the host's 127.0.0.1) and its abstract unix sockets (they belong to a network namespace) are
//! out of reach; a server the run starts on its own 127.0.0.1 is reachable from the run.
//!
//! [`isolate`] makes raw system calls only (async-signal-safe), for the child between fork and
//! exec while it still has `CAP_SYS_ADMIN` and `CAP_NET_ADMIN` (before the credential drop).

use crate::process::errno;

/// `SIOCGIFFLAGS` and `SIOCSIFFLAGS` (`linux/sockios.h`).
const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;

/// `struct ifreq` with the `ifr_flags` member of its union (40 bytes on 64-bit Linux).
#[repr(C)]
struct IfreqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    pad: [u8; 22],
}

/// The step of [`isolate`] that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    /// `unshare(CLONE_NEWNET)`.
    Unshare,
    /// Bringing `lo` up (`socket`, `SIOCGIFFLAGS`, `SIOCSIFFLAGS`).
    Loopback,
}

impl Failed {
    /// What failed, for `spawn_error`.
    pub fn what(self) -> &'static str {
        match self {
            Failed::Unshare => "building the sandbox: its network namespace",
            Failed::Loopback => "building the sandbox: bringing up its loopback",
        }
    }
}

/// Move the calling process into a new network namespace and bring its loopback up. Raw system
/// calls only.
///
/// # Errors
/// The step that failed and its errno.
pub fn isolate() -> Result<(), (Failed, i32)> {
    // SAFETY: unshare with a flag; socket, ioctl on a local struct of the kernel's layout, close.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNET) != 0 {
            return Err((Failed::Unshare, errno()));
        }
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err((Failed::Loopback, errno()));
        }
        let mut req = IfreqFlags {
            name: [0; 16],
            flags: 0,
            pad: [0; 22],
        };
        req.name[..2].copy_from_slice(b"lo");
        let r = if libc::ioctl(s, SIOCGIFFLAGS, &mut req as *mut IfreqFlags) != 0 {
            Err((Failed::Loopback, errno()))
        } else {
            req.flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(s, SIOCSIFFLAGS, &req as *const IfreqFlags) != 0 {
                Err((Failed::Loopback, errno()))
            } else {
                Ok(())
            }
        };
        libc::close(s);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP socket on 127.0.0.1:`port` (0: any), listening; returns (fd, port).
    fn listen(port: u16) -> Option<(i32, u16)> {
        // SAFETY: socket, bind, listen, getsockname on a zeroed sockaddr_in.
        unsafe {
            let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if s < 0 {
                return None;
            }
            let mut a: libc::sockaddr_in = std::mem::zeroed();
            a.sin_family = libc::AF_INET as libc::sa_family_t;
            a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            a.sin_port = port.to_be();
            let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
            if libc::bind(s, &a as *const _ as *const libc::sockaddr, len) != 0
                || libc::listen(s, 4) != 0
            {
                libc::close(s);
                return None;
            }
            let mut got: libc::sockaddr_in = std::mem::zeroed();
            let mut l = len;
            libc::getsockname(s, &mut got as *mut _ as *mut libc::sockaddr, &mut l);
            Some((s, u16::from_be(got.sin_port)))
        }
    }

    /// `connect` to 127.0.0.1:`port`: 0 or its errno.
    fn connect(port: u16) -> i32 {
        // SAFETY: socket and connect on a zeroed sockaddr_in.
        unsafe {
            let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if s < 0 {
                return errno();
            }
            let mut a: libc::sockaddr_in = std::mem::zeroed();
            a.sin_family = libc::AF_INET as libc::sa_family_t;
            a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            a.sin_port = port.to_be();
            let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
            let r = libc::connect(s, &a as *const _ as *const libc::sockaddr, len);
            let e = if r == 0 { 0 } else { errno() };
            libc::close(s);
            e
        }
    }

    #[test]
    fn host_loopback_unreachable_own_loopback_reachable() {
        // SAFETY: geteuid reads no memory.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: a network namespace needs CAP_SYS_ADMIN; not tried");
            return;
        }
        let (host, port) = listen(0).expect("a listener on the host's loopback");
        // SAFETY: fork; the child makes raw system calls only and `_exit`s.
        let code = unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                let code = match isolate() {
                    Err(_) => 1,
                    // The host's server: not in this namespace.
                    Ok(()) if connect(port) != libc::ECONNREFUSED => 2,
                    // The run's own server on its loopback, at the same port.
                    Ok(()) => match listen(port) {
                        None => 3,
                        Some(_) if connect(port) != 0 => 4,
                        Some(_) => 0,
                    },
                };
                libc::_exit(code);
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            libc::WEXITSTATUS(status)
        };
        // The host's server is still reachable from here.
        let here = connect(port);
        // SAFETY: our own descriptor.
        unsafe { libc::close(host) };
        assert_eq!(code, 0);
        assert_eq!(here, 0);
    }
}
