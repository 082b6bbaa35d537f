//! FUSE: the mount, the wire codec, and the framings that carry requests to [`crate::fs::SmithFs`]
//! through one dispatcher (docs/SPEC.md §6, §13): `/dev/fuse` ([`devfuse`]) and io_uring
//! ([`uring`]) locally, a remote connection (`crate::remote`) from a node. INIT is answered in
//! one place ([`init`]) for the daemon's mount and for a node's.

pub mod devfuse;
pub mod dispatch;
pub mod init;
pub mod mount;
pub mod session;
pub mod transport;
pub mod uring;
pub mod wire;
