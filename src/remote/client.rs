//! The node's end of a remote connection (docs/SPEC.md §13): connect with a [`Ticket`], prove
//! the run, learn the mount point. `smithfs attach` forwards its kernel's frames over the
//! [`Channel`] this returns; the tests drive the listener with it.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::channel::Channel;
use super::keys::Ticket;
use super::{hello, tls, Status, MAGIC, MAX_SANDBOX, MAX_TEXT, WELCOME_HEAD};

/// Time allowed to connect, shake hands and be welcomed.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An accepted connection.
#[derive(Debug)]
pub struct Attached {
    /// The channel, past the welcome: FUSE frames from here on.
    pub channel: Channel,
    /// The daemon's mount point (where the node mounts too).
    pub mount_point: String,
    /// The largest write the node may forward (its `max_write`).
    pub max_write: u32,
    /// The run's §12 sandbox plan as the daemon made it (JSON); `None`: the daemon's mount runs
    /// agents without the sandbox. Only the daemon decides this (docs/PROTOCOL-NOTES.md R30).
    pub sandbox: Option<String>,
}

/// Why a connection did not become a run's.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The listener could not be reached, or TLS failed (a certificate other than the pinned
    /// one is a TLS failure).
    #[error("cannot reach the daemon at {addr}: {why}")]
    Unreachable {
        /// The ticket's address.
        addr: String,
        /// The reason.
        why: String,
    },
    /// The daemon refused the run's secret (an ended run, a wrong or reused secret).
    #[error("the daemon refused run {0}'s ticket (an ended run, or a wrong or reused secret)")]
    Refused(String),
    /// The daemon's answer was not a welcome.
    #[error("the daemon's answer was not a welcome: {0}")]
    Protocol(String),
}

/// Connect to the listener `ticket` names, pinning its certificate, and present the run.
///
/// # Errors
/// [`AttachError`].
pub fn attach(ticket: &Ticket) -> Result<Attached, AttachError> {
    let unreachable = |why: String| AttachError::Unreachable {
        addr: ticket.addr.clone(),
        why,
    };
    let addr = ticket
        .addr
        .to_socket_addrs()
        .map_err(|e| unreachable(e.to_string()))?
        .next()
        .ok_or_else(|| unreachable("no address".into()))?;
    let sock = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        .map_err(|e| unreachable(e.to_string()))?;
    let cfg = tls::client_config(ticket.pin).map_err(unreachable)?;
    let tls = rustls::ClientConnection::new(cfg, tls::server_name())
        .map_err(|e| unreachable(e.to_string()))?;
    let mut ch = Channel::new(sock, tls.into()).map_err(|e| unreachable(e.to_string()))?;
    ch.handshake(CONNECT_TIMEOUT)
        .map_err(|e| unreachable(format!("TLS: {e}")))?;
    ch.send(&hello(&ticket.run_id, &ticket.secret.0))
        .map_err(|e| unreachable(e.to_string()))?;
    let head = ch
        .read_exact(WELCOME_HEAD, CONNECT_TIMEOUT)
        .map_err(|e| AttachError::Protocol(e.to_string()))?;
    let word = |i: usize| u32::from_ne_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let (status, max_write, n) = (word(4), word(8), word(12) as usize);
    if &head[..4] != MAGIC || n > MAX_TEXT {
        return Err(AttachError::Protocol("bad welcome".into()));
    }
    let text = ch
        .read_exact(n, CONNECT_TIMEOUT)
        .map_err(|e| AttachError::Protocol(e.to_string()))?;
    let text = String::from_utf8_lossy(&text).into_owned();
    if status != Status::Accepted as u32 {
        return Err(AttachError::Refused(ticket.run_id.clone()));
    }
    let len = ch
        .read_exact(4, CONNECT_TIMEOUT)
        .map_err(|e| AttachError::Protocol(e.to_string()))?;
    let len = u32::from_ne_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if len >= MAX_SANDBOX {
        return Err(AttachError::Protocol(format!(
            "a sandbox plan of {len} bytes (at most {} taken)",
            MAX_SANDBOX - 1
        )));
    }
    let sandbox = if len == 0 {
        None
    } else {
        let plan = ch
            .read_exact(len, CONNECT_TIMEOUT)
            .map_err(|e| AttachError::Protocol(e.to_string()))?;
        Some(
            String::from_utf8(plan)
                .map_err(|_| AttachError::Protocol("a sandbox plan that is not UTF-8".into()))?,
        )
    };
    Ok(Attached {
        channel: ch,
        mount_point: text,
        max_write,
        sandbox,
    })
}
