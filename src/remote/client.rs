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
/// Time [`attach_retrying`] goes on trying after connections closed before their welcome.
pub const RETRY_WITHIN: Duration = Duration::from_secs(30);

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
    /// The connection was closed or reset before the welcome (the listener closed it to make
    /// room among connections still in their handshake or hello, docs/PROTOCOL-NOTES.md R50),
    /// or its connect or TLS handshake timed out: the run's secret was not spent, a new
    /// connection may present it.
    #[error("the daemon at {addr} closed the connection before its welcome: {why}")]
    Dropped {
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

/// [`attach`], again after each [`AttachError::Dropped`] (with a backoff from 50 ms doubling to
/// 2 s, jittered) until `within` has passed; `retried` is told of each retry (the error, the
/// attempt number from 1).
///
/// # Errors
/// The last attempt's [`AttachError`]; any other than `Dropped` at once.
pub fn attach_retrying(
    ticket: &Ticket,
    within: Duration,
    mut retried: impl FnMut(&AttachError, u32),
) -> Result<Attached, AttachError> {
    let start = std::time::Instant::now();
    let mut backoff = Duration::from_millis(50);
    let mut attempt = 0;
    loop {
        let e = match attach(ticket) {
            Err(e @ AttachError::Dropped { .. }) => e,
            r => return r,
        };
        // Jitter (up to half the backoff) from the clock: retries of many nodes cut at once
        // do not come back at once.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let half = backoff.as_nanos().max(2) as u64 / 2;
        let wait = backoff + Duration::from_nanos(u64::from(nanos) % half);
        if start.elapsed() + wait >= within {
            return Err(e);
        }
        attempt += 1;
        retried(&e, attempt);
        std::thread::sleep(wait);
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Whether `e`, before the welcome, means the daemon's side closed or reset the connection
/// (the daemon closes a connection whose hello it did not take without a welcome).
fn closed(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
    )
}

/// Connect to the listener `ticket` names, pinning its certificate, and present the run (one
/// attempt; see [`attach_retrying`]).
///
/// # Errors
/// [`AttachError`]; [`AttachError::Dropped`] when the daemon closed or reset the connection
/// before its welcome.
pub fn attach(ticket: &Ticket) -> Result<Attached, AttachError> {
    let unreachable = |why: String| AttachError::Unreachable {
        addr: ticket.addr.clone(),
        why,
    };
    let dropped_or = |e: std::io::Error, other: &dyn Fn(String) -> AttachError| {
        if closed(&e) {
            AttachError::Dropped {
                addr: ticket.addr.clone(),
                why: e.to_string(),
            }
        } else {
            other(e.to_string())
        }
    };
    let addr = ticket
        .addr
        .to_socket_addrs()
        .map_err(|e| unreachable(e.to_string()))?
        .next()
        .ok_or_else(|| unreachable("no address".into()))?;
    // A connect or handshake that timed out never reached the hello: as good as dropped (a
    // flood fills the listener's accept queue, and the kernel then drops connects for a while).
    let late = |e: std::io::Error, other: &dyn Fn(String) -> AttachError| {
        if e.kind() == std::io::ErrorKind::TimedOut {
            AttachError::Dropped {
                addr: ticket.addr.clone(),
                why: e.to_string(),
            }
        } else {
            dropped_or(e, other)
        }
    };
    let sock =
        TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| late(e, &unreachable))?;
    let cfg = tls::client_config(ticket.pin).map_err(unreachable)?;
    let tls = rustls::ClientConnection::new(cfg, tls::server_name())
        .map_err(|e| unreachable(e.to_string()))?;
    let mut ch = Channel::new(sock, tls.into()).map_err(|e| unreachable(e.to_string()))?;
    ch.handshake(CONNECT_TIMEOUT)
        .map_err(|e| late(e, &|why| unreachable(format!("TLS: {why}"))))?;
    ch.send(&hello(&ticket.run_id, &ticket.secret.0))
        .map_err(|e| dropped_or(e, &unreachable))?;
    let head = ch
        .read_exact(WELCOME_HEAD, CONNECT_TIMEOUT)
        .map_err(|e| dropped_or(e, &AttachError::Protocol))?;
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
