//! The one INIT negotiation (`include/uapi/linux/fuse.h`, `fuse_init_in` / `fuse_init_out`):
//! the daemon's own mount answers its kernel's INIT here ([`super::session`]), and so does
//! `smithfs attach` on a node (`crate::remote::node`, docs/SPEC.md §13). Both ask for the same
//! flags ([`WANTED`]); only the daemon's own mount may add passthrough and io_uring
//! ([`Offer::passthrough`], [`Offer::io_uring`]), which make no sense across a network.
//!
//! The protocol minor agreed is the kernel's, capped at [`MAX_MINOR`] (what the codec decodes);
//! a kernel of a newer major is told ours and sends INIT again; one older than 7.6 is refused
//! (`EPROTO`), as fuser and libfuse do.

use std::os::fd::{AsRawFd, BorrowedFd};

use super::transport::{self, Transport};
use super::wire::{self, opcode, IN_HEADER_LEN};
use crate::fs::FsError;

/// The newest protocol minor smithfs speaks: what the codec decodes ([`super::wire`]).
pub const MAX_MINOR: u32 = 40;
/// The largest write asked for, bytes (and the largest readahead).
pub const MAX_WRITE: u32 = 1 << 20;
/// Requests the kernel may have in the background (readahead, async writes).
const MAX_BACKGROUND: u16 = 64;
/// Background requests at which the kernel counts the connection congested (3/4 of them).
const CONGESTION_THRESHOLD: u16 = 48;
/// Bytes of `fuse_init_out` from minor 23 on.
const INIT_OUT_LEN: usize = 64;
/// Bytes of `fuse_init_out` from minor 5 to 22.
const INIT_OUT_COMPAT22_LEN: usize = 24;
/// Bytes of `fuse_init_out` before minor 5.
const INIT_OUT_COMPAT_LEN: usize = 8;

/// `fuse_init_in.flags` / `flags2` bits (`FUSE_*`), as one 64-bit word (`flags2` above bit 31).
#[allow(missing_docs)]
pub mod flag {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// The flags every smithfs mount asks for (granted as far as the kernel offers them): reads in
/// parallel, `O_TRUNC` with the open, writes up to `max_write`, cached data dropped when the
/// attributes say the file changed, READDIRPLUS (and when to use it), directory operations in
/// parallel, `max_pages`, and the kernel leaving setuid/capability removal to the daemon.
pub const WANTED: u64 = flag::ASYNC_READ
    | flag::ATOMIC_O_TRUNC
    | flag::BIG_WRITES
    | flag::AUTO_INVAL_DATA
    | flag::DO_READDIRPLUS
    | flag::READDIRPLUS_AUTO
    | flag::PARALLEL_DIROPS
    | flag::MAX_PAGES
    | flag::HANDLE_KILLPRIV_V2;

/// What a mount asks for at INIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// Ask for passthrough of regular files (with a stack depth of 1): the daemon's own mount,
    /// as root, never a node.
    pub passthrough: bool,
    /// How requests are to reach the daemon: io_uring only if asked and offered (never a node:
    /// [`Transport::DevFuse`]).
    pub io_uring: Transport,
    /// The largest write to ask for, bytes (clamped to 4 KiB – [`MAX_WRITE`]).
    pub max_write: u32,
}

/// What INIT settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// The kernel's protocol minor.
    pub kernel_minor: u32,
    /// The minor agreed (the kernel's, at most [`MAX_MINOR`]).
    pub minor: u32,
    /// The flags granted (the kernel's offer ∩ what was asked).
    pub flags: u64,
    /// The largest write the kernel sends, bytes.
    pub max_write: u32,
    /// The largest request the kernel sends, in 4 KiB pages.
    pub max_pages: u32,
}

impl Settled {
    /// Passthrough of regular files was granted.
    pub fn passthrough(&self) -> bool {
        self.flags & flag::PASSTHROUGH != 0
    }

    /// FUSE over io_uring was granted: the queues must be registered at once.
    pub fn io_uring(&self) -> bool {
        self.flags & flag::OVER_IO_URING != 0
    }
}

/// Why INIT failed: one sentence (the kernel was answered with an error where it could be).
pub type InitError = String;

/// Read the kernel's INIT from `dev` (a `/dev/fuse` connection just mounted) and answer it
/// with `offer`.
///
/// # Errors
/// The device failed or closed, the first request is not INIT, the kernel's major is older
/// than 7.6, or `--transport io-uring` was asked and the kernel does not offer it.
pub fn answer(dev: BorrowedFd<'_>, offer: &Offer) -> Result<Settled, InitError> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = loop {
            match nix::unistd::read(dev.as_raw_fd(), &mut buf) {
                Ok(n) => break n,
                Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => continue,
                Err(nix::errno::Errno::ENOENT) => continue,
                Err(e) => return Err(format!("reading INIT from /dev/fuse: {e}")),
            }
        };
        let (h, _, _) =
            wire::split_dev_fuse(&buf[..n]).map_err(|e| format!("the kernel's INIT: {e}"))?;
        // `fuse_init_in` follows the header: the codec does not decode INIT (it never crosses
        // a remote connection).
        let arg = &buf[IN_HEADER_LEN.min(n)..n];
        if h.opcode != opcode::INIT || arg.len() < 16 {
            let _ = reply(dev, h.unique, -libc::EIO, &[]);
            return Err(format!(
                "the kernel's first request was opcode {}, not INIT",
                h.opcode
            ));
        }
        let word = |i: usize| {
            arg.get(i..i + 4)
                .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        };
        let (major, kernel_minor, readahead, flags) = (word(0), word(4), word(8), word(12));
        if major > 7 {
            // A newer major: say ours; the kernel sends an INIT it can speak to us.
            let mut out = [0u8; INIT_OUT_COMPAT_LEN];
            out[..4].copy_from_slice(&7u32.to_ne_bytes());
            out[4..].copy_from_slice(&MAX_MINOR.to_ne_bytes());
            reply(dev, h.unique, 0, &out).map_err(|e| format!("answering INIT: {e}"))?;
            continue;
        }
        if major < 7 || kernel_minor < 6 {
            let _ = reply(dev, h.unique, -libc::EPROTO, &[]);
            return Err(format!(
                "the kernel speaks FUSE {major}.{kernel_minor}, older than 7.6"
            ));
        }
        let mut offered = u64::from(flags);
        if offered & flag::INIT_EXT != 0 {
            offered |= u64::from(word(16)) << 32;
        }
        let (settled, out) = match settle(offer, kernel_minor, readahead, offered) {
            Ok(s) => s,
            Err((errno, why)) => {
                let _ = reply(dev, h.unique, -errno, &[]);
                return Err(why);
            }
        };
        reply(dev, h.unique, 0, &out).map_err(|e| format!("answering INIT: {e}"))?;
        tracing::debug!(
            kernel_minor,
            minor = settled.minor,
            flags = format_args!("{:#x}", settled.flags),
            max_write = settled.max_write,
            "FUSE INIT answered"
        );
        return Ok(settled);
    }
}

/// The answer to an INIT of `kernel_minor` offering `offered` flags and `readahead` bytes:
/// what is settled and the `fuse_init_out` bytes (as long as that minor expects). `Err`: the
/// errno to answer and why.
fn settle(
    offer: &Offer,
    kernel_minor: u32,
    readahead: u32,
    offered: u64,
) -> Result<(Settled, Vec<u8>), (i32, String)> {
    let mut wanted = WANTED;
    if offer.passthrough && offered & flag::PASSTHROUGH != 0 {
        wanted |= flag::PASSTHROUGH;
    }
    // The kernel offers io_uring only while the machine-wide `enable_uring` is on.
    let uring_offered = offered & flag::OVER_IO_URING != 0;
    match offer.io_uring {
        Transport::DevFuse => {}
        Transport::Auto if uring_offered => wanted |= flag::OVER_IO_URING,
        Transport::Auto => {}
        Transport::IoUring if uring_offered => wanted |= flag::OVER_IO_URING,
        Transport::IoUring => {
            return Err((
                FsError::NoUring.raw(),
                format!(
                    "--transport io-uring: the kernel does not offer FUSE over io_uring ({} is off, or the kernel lacks CONFIG_FUSE_IO_URING); see `smithfs doctor`",
                    transport::ENABLE_URING
                ),
            ));
        }
    }
    let granted = (wanted | flag::INIT_EXT) & offered;
    let minor = kernel_minor.min(MAX_MINOR);
    let max_write = offer.max_write.clamp(4096, MAX_WRITE);
    let readahead = readahead.min(max_write);
    let max_pages = (max_write.max(readahead) - 1) / 4096 + 1;
    let mut out = Vec::with_capacity(INIT_OUT_LEN);
    out.extend_from_slice(&7u32.to_ne_bytes());
    out.extend_from_slice(&minor.to_ne_bytes());
    out.extend_from_slice(&readahead.to_ne_bytes());
    out.extend_from_slice(&(granted as u32).to_ne_bytes());
    out.extend_from_slice(&MAX_BACKGROUND.to_ne_bytes());
    out.extend_from_slice(&CONGESTION_THRESHOLD.to_ne_bytes());
    out.extend_from_slice(&max_write.to_ne_bytes());
    out.extend_from_slice(&1u32.to_ne_bytes()); // time_gran: 1 ns
    out.extend_from_slice(&(max_pages as u16).to_ne_bytes());
    out.extend_from_slice(&0u16.to_ne_bytes()); // map_alignment
    out.extend_from_slice(&((granted >> 32) as u32).to_ne_bytes()); // flags2
    let stack_depth: u32 = if granted & flag::PASSTHROUGH != 0 {
        1
    } else {
        0
    };
    out.extend_from_slice(&stack_depth.to_ne_bytes()); // max_stack_depth
    out.resize(INIT_OUT_LEN, 0);
    out.truncate(match minor {
        0..=4 => INIT_OUT_COMPAT_LEN,
        5..=22 => INIT_OUT_COMPAT22_LEN,
        _ => INIT_OUT_LEN,
    });
    Ok((
        Settled {
            kernel_minor,
            minor,
            flags: granted,
            max_write,
            max_pages,
        },
        out,
    ))
}

/// Write one reply (`fuse_out_header` and `body`) for `unique` with `error` to `dev`.
fn reply(dev: BorrowedFd<'_>, unique: u64, error: i32, body: &[u8]) -> nix::Result<usize> {
    let mut frame = wire::out_header(unique, error, body.len()).to_vec();
    frame.extend_from_slice(body);
    nix::unistd::write(dev, &frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(passthrough: bool, io_uring: Transport) -> Offer {
        Offer {
            passthrough,
            io_uring,
            max_write: MAX_WRITE,
        }
    }

    fn u32_at(b: &[u8], i: usize) -> u32 {
        u32::from_ne_bytes(b[i..i + 4].try_into().unwrap())
    }

    #[test]
    fn grants_what_is_asked_and_offered() {
        let all = u64::MAX;
        let (s, out) = settle(&offer(true, Transport::Auto), 45, 1 << 20, all).unwrap();
        assert_eq!(s.minor, MAX_MINOR);
        assert!(s.passthrough() && s.io_uring());
        assert_eq!(
            s.flags & !(flag::PASSTHROUGH | flag::OVER_IO_URING | flag::INIT_EXT),
            WANTED
        );
        assert_eq!(out.len(), INIT_OUT_LEN);
        assert_eq!(u32_at(&out, 4), 40);
        assert_eq!(u32_at(&out, 12), s.flags as u32);
        assert_eq!(u32_at(&out, 32), (s.flags >> 32) as u32, "flags2");
        assert_eq!(u32_at(&out, 36), 1, "max_stack_depth with passthrough");
        assert_eq!(s.max_pages, 256);
        // A node: neither passthrough nor io_uring, whatever the kernel offers.
        let (n, out) = settle(&offer(false, Transport::DevFuse), 45, 1 << 20, all).unwrap();
        assert!(!n.passthrough() && !n.io_uring());
        assert_eq!(u32_at(&out, 36), 0);
        // Nothing the kernel does not offer.
        let (k, _) = settle(&offer(true, Transport::Auto), 45, 1 << 20, flag::ASYNC_READ).unwrap();
        assert_eq!(k.flags, flag::ASYNC_READ);
    }

    #[test]
    fn io_uring_asked_but_not_offered_is_refused() {
        let e = settle(&offer(false, Transport::IoUring), 45, 4096, WANTED).unwrap_err();
        assert_eq!(e.0, FsError::NoUring.raw());
        assert!(e.1.contains("enable_uring"), "{}", e.1);
    }

    #[test]
    fn old_minors_get_the_short_reply_and_readahead_is_capped() {
        let (s, out) = settle(&offer(false, Transport::DevFuse), 22, 1 << 30, WANTED).unwrap();
        assert_eq!((s.minor, out.len()), (22, INIT_OUT_COMPAT22_LEN));
        assert_eq!(u32_at(&out, 8), MAX_WRITE, "readahead at most max_write");
        let (_, out) = settle(&offer(false, Transport::DevFuse), 4, 4096, WANTED).unwrap();
        assert_eq!(out.len(), INIT_OUT_COMPAT_LEN);
    }
}
