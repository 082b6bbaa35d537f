//! Which transport carries FUSE requests, and what INIT settled (`mount --transport`).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// `/sys/module/fuse/parameters/enable_uring`: machine-wide; while it is `Y` the kernel offers
/// `FUSE_OVER_IO_URING` at INIT.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// The transport a mount asks for (`mount --transport`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// io_uring when the kernel offers it at INIT (`enable_uring` is on), else `/dev/fuse`.
    #[default]
    Auto,
    /// io_uring or fail the mount.
    IoUring,
    /// `/dev/fuse` reads and writes only.
    DevFuse,
}

/// What INIT settled, written by the INIT handler and read by the mount once the session is
/// set up.
#[derive(Debug, Default)]
pub struct Negotiated {
    /// `FUSE_OVER_IO_URING` was granted: queues must be registered at once.
    pub io_uring: AtomicBool,
    /// `FUSE_PASSTHROUGH` was granted.
    pub passthrough: AtomicBool,
    /// The granted max_write, bytes.
    pub max_write: AtomicU32,
    /// The granted max_pages (4 KiB pages per request).
    pub max_pages: AtomicU32,
}

impl Negotiated {
    /// Whether the connection runs over io_uring.
    pub fn io_uring(&self) -> bool {
        self.io_uring.load(Ordering::Relaxed)
    }

    /// Name of the transport in use, as the mount log and `doctor` print it.
    pub fn transport_name(&self) -> &'static str {
        if self.io_uring() {
            "io-uring"
        } else {
            "dev-fuse"
        }
    }
}

/// The value of `enable_uring`: `Some(true)` for `Y`, `None` when the kernel has no such
/// parameter (no `CONFIG_FUSE_IO_URING`, or fuse not loaded).
pub fn enable_uring() -> Option<bool> {
    let s = std::fs::read_to_string(ENABLE_URING).ok()?;
    Some(matches!(s.trim(), "Y" | "y" | "1"))
}
