//! The remote mount (docs/SPEC.md §13): the daemon's listener that serves the tree to runs on
//! other hosts, and what both ends share.
//!
//! A connection is TLS 1.3 over TCP ([`tls`]: a self-signed certificate made at mount, pinned
//! by the ticket). Inside it the node speaks first, once:
//!
//! - **hello** (node → daemon): `"SMFS"`, `u16` version ([`VERSION`]), `u16` run id length,
//!   the run id, and the run's 32-byte secret ([`keys`]);
//! - **welcome** (daemon → node): `"SMFS"`, `u32` status (0 accepted, 1 refused, 2 not a
//!   hello), `u32` the largest write the node may forward ([`conn::MAX_WRITE`]), `u32` text
//!   length and the text: the mount point on acceptance (the node mounts at the same path),
//!   one sentence otherwise; then `u32` sandbox length and the sandbox: the run's §12 plan as
//!   the daemon made it (JSON, at most [`MAX_SANDBOX`] bytes; empty: the mount runs agents
//!   without the sandbox), which `smithfs attach` starts COMMAND in (docs/PROTOCOL-NOTES.md
//!   R30). A refused connection is closed after its welcome.
//!
//! Then every frame is FUSE as on `/dev/fuse`: the node forwards its kernel's requests
//! ([`conn`] serves them as the run's smith) and writes back the replies and the daemon's
//! cache notifications (`fuse_out_header.unique` 0) as they come. Integers are native-endian,
//! as the kernel writes them; both ends must share a byte order (docs/PROTOCOL-NOTES.md R5).
//! Beside them the node sends out-of-band frames ([`oob`]): the run's output and its exit
//! report (docs/PROTOCOL-NOTES.md R16).

pub mod busy_poll;
pub mod channel;
pub mod client;
pub mod conn;
pub mod keys;
pub mod listener;
pub mod node;
pub mod oob;
pub mod tls;

/// The hello's and the welcome's first bytes.
pub const MAGIC: &[u8; 4] = b"SMFS";
/// The protocol's version (the hello's second field). 2: the welcome carries the run's
/// sandbox.
pub const VERSION: u16 = 2;
/// Longest welcome text, bytes.
pub const MAX_TEXT: usize = 4096;
/// Longest sandbox plan a welcome carries, bytes.
pub const MAX_SANDBOX: usize = 256 * 1024;

/// The welcome's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// The run's secret was accepted: the connection is the run's smith.
    Accepted = 0,
    /// Refused (an unknown or ended run, a wrong or replayed secret): the text does not say
    /// which (the daemon's log does).
    Refused = 1,
    /// The first bytes were not a hello of this version.
    NotHello = 2,
}

/// The hello for `run_id` with `secret`.
pub fn hello(run_id: &str, secret: &[u8; keys::SECRET_LEN]) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&VERSION.to_ne_bytes());
    b.extend_from_slice(&(run_id.len() as u16).to_ne_bytes());
    b.extend_from_slice(run_id.as_bytes());
    b.extend_from_slice(secret);
    b
}

/// A hello's fixed part: magic, version, run id length.
pub const HELLO_HEAD: usize = 8;

/// The welcome with `status`, `max_write`, `text` (cut at [`MAX_TEXT`]) and the run's
/// `sandbox` plan (empty: none; cut at [`MAX_SANDBOX`], which the node then refuses to parse).
pub fn welcome(status: Status, max_write: u32, text: &str, sandbox: &[u8]) -> Vec<u8> {
    let text = &text.as_bytes()[..text.len().min(MAX_TEXT)];
    let sandbox = &sandbox[..sandbox.len().min(MAX_SANDBOX)];
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&(status as u32).to_ne_bytes());
    b.extend_from_slice(&max_write.to_ne_bytes());
    b.extend_from_slice(&(text.len() as u32).to_ne_bytes());
    b.extend_from_slice(text);
    b.extend_from_slice(&(sandbox.len() as u32).to_ne_bytes());
    b.extend_from_slice(sandbox);
    b
}

/// A welcome's fixed part: magic, status, max_write, text length.
pub const WELCOME_HEAD: usize = 16;

/// `FUSE_NOTIFY_INVAL_INODE`.
pub const NOTIFY_INVAL_INODE: i32 = 2;
/// `FUSE_NOTIFY_INVAL_ENTRY`.
pub const NOTIFY_INVAL_ENTRY: i32 = 3;

/// The notification frame for `change` (`fuse_out_header` with `unique` 0 and the code in
/// `error`, then `fuse_notify_inval_inode_out` or `fuse_notify_inval_entry_out` and the name).
pub fn notification(change: &conn::Change) -> Vec<u8> {
    change.frame()
}
