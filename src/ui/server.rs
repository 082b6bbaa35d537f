//! The HTTP/1.1 server of `smithfs ui` (docs/SPEC.md §14, notes UI1, UI10): std only, one
//! request per connection, every connection bounded in number, size and time.
//!
//! Anything on the host may connect to the ui's loopback port — a smith's agent too (its
//! network is the host's by default) — long before a token is checked. So, whatever a
//! connection does, it cannot take the server down or keep the operator out (notes UI10):
//!
//! - at most [`MAX_CONNECTIONS`] connections are open at once; a new one beyond them closes the
//!   oldest that is still sending its request (never one being answered), else it is closed;
//! - a request's head (at most [`MAX_HEAD`] bytes) and its body (at most [`MAX_BODY`], by
//!   `Content-Length` only) must arrive within [`REQUEST_DEADLINE`], an answer be taken within
//!   [`WRITE_TIMEOUT`];
//! - an `accept` that fails (no descriptor left, say) is tried again, never the end of the
//!   server (`tiny_http` 0.12, used until 2026-12-06, ended its accept loop on the first error
//!   and ran one thread per connection without a limit: a few hundred idle connections took
//!   the ui down for good).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The most connections open at once.
pub const MAX_CONNECTIONS: usize = 64;
/// The most bytes of a request's line and headers.
pub const MAX_HEAD: usize = 16 << 10;
/// The most bytes of a request's body (a POSTed form: a new task's text).
pub const MAX_BODY: u64 = 1 << 20;
/// How long a connection has to send its whole request.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// How long one write of the answer may wait for the client to read.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A request's method (those the ui answers, and the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Other,
}

/// A request, read whole.
#[derive(Debug)]
pub struct Request {
    pub method: Method,
    /// The request target as sent (`/smith?id=…`).
    pub url: String,
    /// Header names and values in order (values trimmed).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The value of header `name` (case-insensitive), the first if repeated.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An answer: status, headers, body.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    /// This answer with one more header.
    #[must_use]
    pub fn with_header(mut self, h: (String, String)) -> Resp {
        self.headers.push(h);
        self
    }
}

/// A request's head, parsed: its method, its target, its headers.
pub type Head = (Method, String, Vec<(String, String)>);

/// Why a request could not be read: the status to answer with, or none (the connection went
/// away or ran out of time: nothing to say).
#[derive(Debug, PartialEq, Eq)]
pub struct Bad(pub Option<u16>);

/// The reason phrase of `status`.
fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        206 => "Partial Content",
        303 => "See Other",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Parse a request head (line and headers, without the blank line). Pure.
///
/// # Errors
/// 400 for anything not an HTTP/1.x request in origin form with well-formed headers.
pub fn parse_head(head: &[u8]) -> Result<Head, Bad> {
    let text = std::str::from_utf8(head).map_err(|_| Bad(Some(400)))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(m), Some(url), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Bad(Some(400)));
    };
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") || !url.starts_with('/') {
        return Err(Bad(Some(400)));
    }
    let method = match m {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        _ if !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) => Method::Other,
        _ => return Err(Bad(Some(400))),
    };
    let mut headers = Vec::new();
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            return Err(Bad(Some(400)));
        };
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if k.is_empty() || !k.bytes().all(token) || v.bytes().any(|b| b < 0x20 && b != b'\t') {
            return Err(Bad(Some(400)));
        }
        headers.push((k.to_string(), v.trim().to_string()));
    }
    Ok((method, url.to_string(), headers))
}

/// Read one request from `s` by `deadline`.
fn read_request(s: &mut TcpStream, deadline: Instant) -> Result<Request, Bad> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let split = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(Bad(Some(431)));
        }
        let n = read_by(s, &mut chunk, deadline)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    if split > MAX_HEAD {
        return Err(Bad(Some(431)));
    }
    let (method, url, headers) = parse_head(&buf[..split])?;
    let mut req = Request {
        method,
        url,
        headers,
        body: buf.split_off(split + 4),
    };
    if req.header("Transfer-Encoding").is_some() {
        return Err(Bad(Some(411)));
    }
    let lengths: Vec<&str> = req
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("Content-Length"))
        .map(|(_, v)| v.as_str())
        .collect();
    let len = match lengths.as_slice() {
        [] => 0,
        [one] => one.parse::<u64>().map_err(|_| Bad(Some(400)))?,
        _ => return Err(Bad(Some(400))),
    };
    if len > MAX_BODY {
        return Err(Bad(Some(413)));
    }
    let len = usize::try_from(len).map_err(|_| Bad(Some(413)))?;
    if req.body.len() < len
        && req
            .header("Expect")
            .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"))
    {
        let _ = s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    while req.body.len() < len {
        let n = read_by(s, &mut chunk, deadline)?;
        req.body.extend_from_slice(&chunk[..n]);
    }
    req.body.truncate(len);
    Ok(req)
}

/// One read that must complete by `deadline`; end of stream, an error or the deadline: `Bad`.
fn read_by(s: &mut TcpStream, chunk: &mut [u8], deadline: Instant) -> Result<usize, Bad> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Bad(None));
    }
    s.set_read_timeout(Some(left)).map_err(|_| Bad(None))?;
    match s.read(chunk) {
        Ok(0) | Err(_) => Err(Bad(None)),
        Ok(n) => Ok(n),
    }
}

/// `resp` as bytes on the wire (no body for HEAD), `Connection: close`.
pub fn encode(resp: &Resp, head_only: bool) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status)).into_bytes();
    for (k, v) in &resp.headers {
        out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            resp.body.len()
        )
        .as_bytes(),
    );
    if !head_only {
        out.extend_from_slice(&resp.body);
    }
    out
}

/// An open connection as the accept loop keeps it: a handle to close it with, and whether its
/// request is still being read.
struct Conn {
    id: u64,
    stream: TcpStream,
    reading: bool,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Conns {
    open: VecDeque<Conn>,
    next: u64,
}

/// Serve `listener` until the process ends: each connection on a thread of its own, its one
/// request answered by `handle`.
pub fn serve(listener: TcpListener, handle: Arc<dyn Fn(Request) -> Resp + Send + Sync>) {
    let conns = Arc::new(Mutex::new(Conns::default()));
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) => {
                // EMFILE, ENFILE, ENOBUFS, a connection reset before it was taken: the next
                // accept may succeed; never give up the port.
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let Ok(handle_copy) = stream.try_clone() else {
            continue;
        };
        let id = {
            let mut c = conns.lock();
            if c.open.len() >= MAX_CONNECTIONS {
                // The oldest connection still sending its request makes room; one being
                // answered is never cut. None: this one waits no turn.
                match c.open.iter().position(|x| x.reading) {
                    Some(i) => {
                        if let Some(old) = c.open.remove(i) {
                            let _ = old.stream.shutdown(Shutdown::Both);
                        }
                    }
                    None => continue,
                }
            }
            c.next += 1;
            let id = c.next;
            c.open.push_back(Conn {
                id,
                stream: handle_copy,
                reading: true,
            });
            id
        };
        let (conns2, handle) = (Arc::clone(&conns), Arc::clone(&handle));
        let spawned = std::thread::Builder::new()
            .name("ui-conn".into())
            .stack_size(1 << 20)
            .spawn(move || {
                one_connection(stream, id, &conns2, &*handle);
                conns2.lock().open.retain(|x| x.id != id);
            });
        if spawned.is_err() {
            let mut c = conns.lock();
            if let Some(i) = c.open.iter().position(|x| x.id == id) {
                if let Some(x) = c.open.remove(i) {
                    let _ = x.stream.shutdown(Shutdown::Both);
                }
            }
        }
    }
}

/// Read one request from `s`, answer it, close.
fn one_connection(
    mut s: TcpStream,
    id: u64,
    conns: &Mutex<Conns>,
    handle: &(dyn Fn(Request) -> Resp + Send + Sync),
) {
    let _ = s.set_nodelay(true);
    let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let (resp, head_only) = match read_request(&mut s, deadline) {
        Ok(req) => {
            {
                let mut c = conns.lock();
                match c.open.iter_mut().find(|x| x.id == id) {
                    Some(x) => x.reading = false,
                    // Closed to make room while its request came in.
                    None => return,
                }
            }
            let head_only = req.method == Method::Head;
            (handle(req), head_only)
        }
        Err(Bad(None)) => return,
        Err(Bad(Some(status))) => (
            super::http::text(status, &reason(status).to_lowercase()),
            false,
        ),
    };
    let _ = s.write_all(&encode(&resp, head_only));
    let _ = s.flush();
    let _ = s.shutdown(Shutdown::Write);
    // Let the client read the answer before the close (a close with unread input resets).
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 1024];
    let end = Instant::now() + Duration::from_millis(500);
    while Instant::now() < end {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        let (m, u, h) =
            parse_head(b"GET /smith?id=x HTTP/1.1\r\nHost: 127.0.0.1:1\r\nCookie:  a=b ")
                .expect("ok");
        assert_eq!(m, Method::Get);
        assert_eq!(u, "/smith?id=x");
        assert_eq!(h[1], ("Cookie".to_string(), "a=b".to_string()));
        assert_eq!(
            parse_head(b"GET http://evil/ HTTP/1.1"),
            Err(Bad(Some(400)))
        );
        assert_eq!(parse_head(b"GET / HTTP/2"), Err(Bad(Some(400))));
        assert_eq!(parse_head(b"GET /  HTTP/1.1"), Err(Bad(Some(400))));
        assert_eq!(
            parse_head(b"GET / HTTP/1.1\r\n folded"),
            Err(Bad(Some(400)))
        );
        assert_eq!(
            parse_head(b"GET / HTTP/1.1\r\nBad Name: x"),
            Err(Bad(Some(400)))
        );
        assert_eq!(
            parse_head(b"PUT / HTTP/1.1").map(|x| x.0),
            Ok(Method::Other)
        );
        assert_eq!(parse_head(b"\xff / HTTP/1.1"), Err(Bad(Some(400))));
    }

    #[test]
    fn encodes() {
        let r = Resp {
            status: 303,
            headers: vec![("Location".into(), "/".into())],
            body: b"x".to_vec(),
        };
        let w = String::from_utf8(encode(&r, false)).expect("utf8");
        assert_eq!(
            w,
            "HTTP/1.1 303 See Other\r\nLocation: /\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"
        );
        assert!(String::from_utf8(encode(&r, true))
            .expect("utf8")
            .ends_with("\r\n\r\n"));
    }
}
