//! Which transport carries FUSE requests (`mount --transport`).

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

/// The value of `enable_uring`: `Some(true)` for `Y`, `None` when the kernel has no such
/// parameter (no `CONFIG_FUSE_IO_URING`, or fuse not loaded).
pub fn enable_uring() -> Option<bool> {
    let s = std::fs::read_to_string(ENABLE_URING).ok()?;
    Some(matches!(s.trim(), "Y" | "y" | "1"))
}
