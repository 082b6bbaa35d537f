//! Out-of-band frames (docs/SPEC.md §13, docs/PROTOCOL-NOTES.md R16): what `smithfs attach`
//! tells the daemon besides its kernel's FUSE requests, on the same connection, node → daemon
//! only — the run's output and, at the end, its exit report. A Slurm job's own output files are
//! discarded, so this is how a remote run's output reaches `conversations/RUN_ID/messages.log`
//! and its end reaches the launcher.
//!
//! A frame is shaped as a FUSE request so that the connection's framing does not change: a
//! 40-byte `fuse_in_header` whose `len` is the frame's length and whose `opcode` is one of ours
//! ([`OUTPUT`], [`EXIT`]: values no kernel sends), every other header field zero, then the body:
//! - [`OUTPUT`]: 1 to [`MAX_OUTPUT`] bytes of COMMAND's stdout and stderr (one stream, in the
//!   order written, as a local run's one pipe);
//! - [`EXIT`]: 8 bytes, `u32` kind (0 exited, 1 killed by a signal) and `i32` the exit code or
//!   the signal number (native-endian, as every frame).
//!
//! Anything else with one of these opcodes is malformed and closes the connection like any
//! malformed frame: a header field that is not zero, an empty or oversized output, an exit body
//! of another length or kind, a second exit report, output after the exit report.

use crate::fuse::wire::IN_HEADER_LEN;

/// `opcode` of an output frame (`"SMF"` + 1: far above every FUSE opcode and CUSE_INIT).
pub const OUTPUT: u32 = 0x534d_4601;
/// `opcode` of the exit report.
pub const EXIT: u32 = 0x534d_4602;
/// Most output bytes in one frame.
pub const MAX_OUTPUT: usize = 64 * 1024;
/// Bytes of an exit report's body.
const EXIT_LEN: usize = 8;

/// How COMMAND ended, as `attach` saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReport {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl ExitReport {
    /// The report of `status`.
    pub fn of(status: std::process::ExitStatus) -> ExitReport {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(c), _) => ExitReport::Code(c),
            (None, Some(s)) => ExitReport::Signal(s),
            (None, None) => ExitReport::Code(128),
        }
    }

    /// The wait status it stands for (what `waitpid` would have given for it).
    pub fn status(self) -> std::process::ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        match self {
            ExitReport::Code(c) => std::process::ExitStatus::from_raw((c & 0xff) << 8),
            ExitReport::Signal(s) => std::process::ExitStatus::from_raw(s & 0x7f),
        }
    }
}

/// Why an out-of-band frame is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OobError {
    /// A header field other than `len` and `opcode` is not zero.
    #[error("an out-of-band frame with a non-zero header field")]
    Header,
    /// An output frame empty or longer than [`MAX_OUTPUT`].
    #[error("an output frame of {0} bytes")]
    OutputLength(usize),
    /// An exit report of another length, or of an unknown kind.
    #[error("a malformed exit report")]
    Exit,
    /// A second exit report, or output after the report.
    #[error("{0} after the exit report")]
    AfterExit(&'static str),
}

/// An out-of-band frame, decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum Oob<'a> {
    /// Output bytes.
    Output(&'a [u8]),
    /// The exit report.
    Exit(ExitReport),
}

/// Whether the whole frame `frame` (its length checked by the caller) is out-of-band.
pub fn is_oob(frame: &[u8]) -> bool {
    frame
        .get(4..8)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .is_some_and(|op| op == OUTPUT || op == EXIT)
}

fn frame(op: u32, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(IN_HEADER_LEN + body.len());
    f.extend_from_slice(&((IN_HEADER_LEN + body.len()) as u32).to_ne_bytes());
    f.extend_from_slice(&op.to_ne_bytes());
    f.resize(IN_HEADER_LEN, 0);
    f.extend_from_slice(body);
    f
}

/// The output frame carrying `bytes` (1 to [`MAX_OUTPUT`] of them: the caller splits).
pub fn output(bytes: &[u8]) -> Vec<u8> {
    debug_assert!(!bytes.is_empty() && bytes.len() <= MAX_OUTPUT);
    frame(OUTPUT, bytes)
}

/// The exit report's frame.
pub fn exit(report: ExitReport) -> Vec<u8> {
    let (kind, value) = match report {
        ExitReport::Code(c) => (0u32, c),
        ExitReport::Signal(s) => (1u32, s),
    };
    let mut body = kind.to_ne_bytes().to_vec();
    body.extend_from_slice(&value.to_ne_bytes());
    frame(EXIT, &body)
}

/// Decode the whole out-of-band frame `frame` ([`is_oob`] said so).
///
/// # Errors
/// [`OobError`]: the connection is closed.
pub fn decode(frame: &[u8]) -> Result<Oob<'_>, OobError> {
    let head = frame.get(..IN_HEADER_LEN).ok_or(OobError::Header)?;
    if head[8..].iter().any(|&b| b != 0) {
        return Err(OobError::Header);
    }
    let body = &frame[IN_HEADER_LEN..];
    let op = u32::from_ne_bytes([head[4], head[5], head[6], head[7]]);
    if op == OUTPUT {
        if body.is_empty() || body.len() > MAX_OUTPUT {
            return Err(OobError::OutputLength(body.len()));
        }
        return Ok(Oob::Output(body));
    }
    if body.len() != EXIT_LEN {
        return Err(OobError::Exit);
    }
    let kind = u32::from_ne_bytes([body[0], body[1], body[2], body[3]]);
    let value = i32::from_ne_bytes([body[4], body[5], body[6], body[7]]);
    match kind {
        0 => Ok(Oob::Exit(ExitReport::Code(value))),
        1 if (1..=64).contains(&value) => Ok(Oob::Exit(ExitReport::Signal(value))),
        _ => Err(OobError::Exit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let f = output(b"hello\n");
        assert!(is_oob(&f));
        assert_eq!(f.len(), IN_HEADER_LEN + 6);
        assert_eq!(decode(&f), Ok(Oob::Output(b"hello\n")));
        for r in [
            ExitReport::Code(0),
            ExitReport::Code(3),
            ExitReport::Signal(9),
        ] {
            assert_eq!(decode(&exit(r)), Ok(Oob::Exit(r)));
        }
        let mut bad = output(b"x");
        bad[8] = 1;
        assert_eq!(decode(&bad), Err(OobError::Header));
        assert_eq!(decode(&frame(OUTPUT, &[])), Err(OobError::OutputLength(0)));
        assert_eq!(
            decode(&frame(OUTPUT, &vec![0; MAX_OUTPUT + 1])),
            Err(OobError::OutputLength(MAX_OUTPUT + 1))
        );
        assert_eq!(decode(&frame(EXIT, &[0; 7])), Err(OobError::Exit));
        let mut kind2 = exit(ExitReport::Code(0));
        kind2[IN_HEADER_LEN] = 2;
        assert_eq!(decode(&kind2), Err(OobError::Exit));
        assert_eq!(
            decode(&exit(ExitReport::Signal(0))),
            Err(OobError::Exit),
            "signal 0 kills nothing"
        );
        assert!(!is_oob(&crate::fuse::wire::out_header(1, 0, 0)));
    }

    #[test]
    fn reports_stand_for_wait_statuses() {
        use std::os::unix::process::ExitStatusExt;
        let s = ExitReport::Signal(15).status();
        assert_eq!((s.code(), s.signal()), (None, Some(15)));
        let s = ExitReport::Code(7).status();
        assert_eq!((s.code(), s.signal()), (Some(7), None));
        assert_eq!(ExitReport::of(s), ExitReport::Code(7));
        assert_eq!(
            ExitReport::of(ExitReport::Signal(9).status()),
            ExitReport::Signal(9)
        );
    }
}
