//! The runs' secrets and tickets (docs/SPEC.md §13, docs/PROTOCOL-NOTES.md R2–R4).
//!
//! The daemon mints one secret per run ([`RunKeys::mint`]): 32 random bytes that exist only in
//! the daemon's memory and in the run's [`Ticket`], which reaches `smithfs attach` through an
//! inherited descriptor (never argv, never the tree). A connection proves its run by presenting
//! the run id and the secret ([`RunKeys::claim`]): compared in constant time, good for one
//! connection only (a replay is refused), and refused once the run is over
//! ([`RunKeys::revoke`], which also cuts the connection that claimed it).

use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};

use parking_lot::Mutex;
use ring::rand::SecureRandom;

use crate::tree::model::SmithIdx;

/// Bytes of a run's secret.
pub const SECRET_LEN: usize = 32;
/// Bytes of a certificate pin (SHA-256 of the certificate's DER).
pub const PIN_LEN: usize = 32;
/// Longest run id a hello may carry, bytes.
pub const MAX_RUN_ID: usize = 128;
/// First word of a ticket's text (its format's version).
const TICKET_MAGIC: &str = "smithfs-ticket-1";

/// A run's secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub [u8; SECRET_LEN]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    /// 32 bytes from the system's CSPRNG (`getrandom`, through `ring`).
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn random() -> Result<Secret, String> {
        let mut b = [0u8; SECRET_LEN];
        ring::rand::SystemRandom::new()
            .fill(&mut b)
            .map_err(|_| "the system's random source failed".to_string())?;
        Ok(Secret(b))
    }

    /// Equal to `other`, in time independent of where they differ.
    pub fn matches(&self, other: &[u8]) -> bool {
        if other.len() != SECRET_LEN {
            return false;
        }
        let diff = self
            .0
            .iter()
            .zip(other)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

/// What `smithfs attach` needs to reach its run: where the listener is, which run, the run's
/// secret, and the SHA-256 of the daemon's certificate (pinned: no other certificate is
/// accepted). Text: `smithfs-ticket-1 ADDRESS RUN_ID SECRET_HEX PIN_HEX` on one line.
#[derive(Clone, PartialEq, Eq)]
pub struct Ticket {
    /// `host:port` of the listener.
    pub addr: String,
    /// The run's id (`conversations/RUN_ID`).
    pub run_id: String,
    /// The run's secret.
    pub secret: Secret,
    /// SHA-256 of the listener's certificate (DER).
    pub pin: [u8; PIN_LEN],
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("addr", &self.addr)
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// The ticket's one line of text (newline-terminated).
    pub fn to_text(&self) -> String {
        format!(
            "{TICKET_MAGIC} {} {} {} {}\n",
            self.addr,
            self.run_id,
            hex(&self.secret.0),
            hex(&self.pin)
        )
    }

    /// Parse a ticket's text.
    ///
    /// # Errors
    /// One sentence saying what is wrong (never echoing the secret).
    pub fn parse(text: &str) -> Result<Ticket, String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let [magic, addr, run_id, secret, pin] = words[..] else {
            return Err(format!(
                "a ticket is `{TICKET_MAGIC} ADDRESS RUN_ID SECRET PIN`, got {} words",
                words.len()
            ));
        };
        if magic != TICKET_MAGIC {
            return Err(format!("not a ticket (it starts with {magic:?})"));
        }
        if run_id.is_empty() || run_id.len() > MAX_RUN_ID {
            return Err("the ticket's run id is empty or too long".into());
        }
        let secret =
            unhex::<SECRET_LEN>(secret).ok_or("the ticket's secret is not 64 hex digits")?;
        let pin = unhex::<PIN_LEN>(pin).ok_or("the ticket's pin is not 64 hex digits")?;
        Ok(Ticket {
            addr: addr.to_string(),
            run_id: run_id.to_string(),
            secret: Secret(secret),
            pin,
        })
    }
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `2 × N` hex digits (either case) → `N` bytes; `None` for any other length or a non-hex digit.
pub fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Why a claim was refused. The peer is told only that it was refused; the daemon's log says
/// which of these it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No such run has a secret: never minted, or the run is over.
    #[error("no live run has this id (never started, or over)")]
    NoSuchRun,
    /// The secret does not match the run's.
    #[error("the secret does not match the run's")]
    BadSecret,
    /// The secret was presented before (one connection per run).
    #[error("the run's secret was already used by a connection")]
    Replayed,
}

/// What the daemon gives a run's connection besides its smith (docs/PROTOCOL-NOTES.md R30,
/// R31): decided by the daemon when it mints the run's secret, never by the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// The uid and gid the connection's requests are judged with: the run's (what a local run of
    /// the smith has, its own uid under `sandbox.uid_per_smith`); `None`: the listener's
    /// `run_uid` and `run_gid`.
    pub ids: Option<(u32, u32)>,
    /// The run's §12 sandbox plan (JSON, `crate::sandbox::view::Plan`), sent in the welcome for
    /// `smithfs attach` to start COMMAND in; `None`: the mount runs agents without it.
    pub sandbox: Option<String>,
}

/// What a run's connection delivers besides FUSE (docs/PROTOCOL-NOTES.md R16): its output goes
/// into the run's output pipe, its exit report is kept for the launcher.
#[derive(Debug, Default)]
pub struct RunSlot {
    /// The write end of the run's output pipe (`None`: the output is discarded); taken away
    /// when the run is revoked.
    output: Mutex<Option<std::fs::File>>,
    /// The exit report, once the node sent it.
    report: Mutex<Option<super::oob::ExitReport>>,
    /// The connection that claimed the run has ended.
    ended: Mutex<bool>,
    ended_cv: parking_lot::Condvar,
}

impl RunSlot {
    /// Write `bytes` into the run's output pipe (blocking while the pipe is full: the node's
    /// connection waits, its output is held back at the source). An output already closed
    /// (the run revoked, or the pipe's reader gone) drops them.
    pub fn output(&self, bytes: &[u8]) {
        use std::io::Write;
        let mut out = self.output.lock();
        if let Some(f) = out.as_mut() {
            if f.write_all(bytes).is_err() {
                *out = None;
            }
        }
    }

    /// Keep the node's exit report; `false` if it had one already.
    pub fn report(&self, r: super::oob::ExitReport) -> bool {
        let mut slot = self.report.lock();
        if slot.is_some() {
            return false;
        }
        *slot = Some(r);
        true
    }

    /// The exit report, if the node sent one.
    pub fn exit_report(&self) -> Option<super::oob::ExitReport> {
        *self.report.lock()
    }

    /// The connection that claimed the run has ended.
    pub fn mark_ended(&self) {
        *self.ended.lock() = true;
        self.ended_cv.notify_all();
    }

    /// Wait up to `d` for the connection to end; whether it did.
    fn wait_ended(&self, d: std::time::Duration) -> bool {
        let mut ended = self.ended.lock();
        let deadline = std::time::Instant::now() + d;
        while !*ended {
            if self.ended_cv.wait_until(&mut ended, deadline).timed_out() {
                break;
            }
        }
        *ended
    }
}

/// One run's key.
#[derive(Debug)]
struct Key {
    secret: Secret,
    smith: SmithIdx,
    grant: Grant,
    slot: std::sync::Arc<RunSlot>,
    /// The connection that claimed it, kept to cut it when the run ends.
    claimed: Option<TcpStream>,
    /// Claimed once (a replay is refused even after that connection dropped).
    used: bool,
}

/// The live runs' secrets, by run id.
#[derive(Debug, Default)]
pub struct RunKeys {
    keys: Mutex<HashMap<String, Key>>,
}

impl RunKeys {
    /// Mint the secret of run `run_id` of `smith` (replacing one it had), with nothing granted
    /// beyond the smith.
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn mint(&self, run_id: &str, smith: SmithIdx) -> Result<Secret, String> {
        self.mint_with(run_id, smith, Grant::default(), None)
    }

    /// Mint the secret of run `run_id` of `smith` (replacing one it had), with `grant`; what its
    /// connection outputs goes to `output` (the write end of the run's output pipe; `None`:
    /// discarded; docs/PROTOCOL-NOTES.md R16).
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn mint_with(
        &self,
        run_id: &str,
        smith: SmithIdx,
        grant: Grant,
        output: Option<std::os::fd::OwnedFd>,
    ) -> Result<Secret, String> {
        let secret = Secret::random()?;
        let slot = RunSlot {
            output: Mutex::new(output.map(std::fs::File::from)),
            ..RunSlot::default()
        };
        self.keys.lock().insert(
            run_id.to_string(),
            Key {
                secret: secret.clone(),
                smith,
                grant,
                slot: std::sync::Arc::new(slot),
                claimed: None,
                used: false,
            },
        );
        Ok(secret)
    }

    /// The smith of run `run_id`, what was granted with it and its slot (where its output and
    /// exit report go), if `secret` is its secret and no connection presented it before; `conn`
    /// is remembered so that [`RunKeys::revoke`] can cut it.
    ///
    /// # Errors
    /// [`Refused`].
    pub fn claim(
        &self,
        run_id: &str,
        secret: &[u8],
        conn: TcpStream,
    ) -> Result<(SmithIdx, Grant, std::sync::Arc<RunSlot>), Refused> {
        let mut keys = self.keys.lock();
        let key = keys.get_mut(run_id).ok_or(Refused::NoSuchRun)?;
        if !key.secret.matches(secret) {
            return Err(Refused::BadSecret);
        }
        if key.used {
            return Err(Refused::Replayed);
        }
        key.used = true;
        key.claimed = Some(conn);
        Ok((key.smith, key.grant.clone(), key.slot.clone()))
    }

    /// Run `run_id` is over: its secret is refused from now on, its output closed, and the
    /// connection that claimed it, if any, shut down (its mount fails closed, ENOTCONN) once it
    /// ended by itself or `linger` passed (a node that reported and closed is read to its end
    /// first: its last output and its report are not cut off). Returns the node's exit report,
    /// if it sent one.
    pub fn revoke(
        &self,
        run_id: &str,
        linger: std::time::Duration,
    ) -> Option<super::oob::ExitReport> {
        let key = self.keys.lock().remove(run_id)?;
        if let Some(conn) = key.claimed {
            key.slot.wait_ended(linger);
            let _ = conn.shutdown(Shutdown::Both);
        }
        key.slot.output.lock().take();
        key.slot.exit_report()
    }

    /// The exit report run `run_id`'s node sent so far, if any.
    pub fn report(&self, run_id: &str) -> Option<super::oob::ExitReport> {
        self.keys.lock().get(run_id)?.slot.exit_report()
    }

    /// A connection has claimed run `run_id` (its node is attached, or was).
    pub fn claimed(&self, run_id: &str) -> bool {
        self.keys.lock().get(run_id).is_some_and(|k| k.used)
    }

    /// Runs with a live secret.
    pub fn len(&self) -> usize {
        self.keys.lock().len()
    }

    /// No run has a live secret.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_round_trip_and_refuse_bad_text() {
        let t = Ticket {
            addr: "127.0.0.1:4000".into(),
            run_id: "20261205T071400Z-1".into(),
            secret: Secret([7; SECRET_LEN]),
            pin: [9; PIN_LEN],
        };
        assert_eq!(Ticket::parse(&t.to_text()).unwrap(), t);
        assert!(
            !format!("{t:?}").contains("0707"),
            "Debug never shows the secret"
        );
        for bad in [
            "",
            "smithfs-ticket-1 a b",
            "other a b 00 00",
            &t.to_text().replace("07", "zz"),
            &t.to_text().replace(&hex(&[9; PIN_LEN]), "09"),
        ] {
            assert!(Ticket::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn secrets_compare_whole() {
        let s = Secret([1; SECRET_LEN]);
        assert!(s.matches(&[1; SECRET_LEN]));
        let mut other = [1; SECRET_LEN];
        other[31] = 2;
        assert!(!s.matches(&other));
        assert!(!s.matches(&[1; SECRET_LEN - 1]));
        assert_ne!(Secret::random().unwrap(), Secret::random().unwrap());
    }
}
