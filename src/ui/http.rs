//! The HTTP edge of `smithfs ui` (docs/SPEC.md §14): URLs and forms decoded, the token checked
//! (a query parameter once, then a cookie), the origin of a POST checked, and responses built
//! with the headers every page carries: no caching; no referrer to other origins (`same-origin`:
//! with `no-referrer` a browser sends `Origin: null` on our own POSTs); a content security policy
//! that allows only our own script and style; no framing.

pub use super::server::{Request, Resp};

/// The cookie that carries the token after the first visit.
pub const COOKIE: &str = "smithfs_ui";

/// A request's path and its decoded query parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The path, e.g. `/smith`.
    pub path: String,
    /// `key=value` pairs in order, decoded.
    pub query: Vec<(String, String)>,
}

impl Target {
    /// Split a request URL (`/smith?id=smith-root`) into path and decoded query.
    pub fn parse(url: &str) -> Target {
        let (path, query) = url.split_once('?').unwrap_or((url, ""));
        Target {
            path: percent_decode(path, false),
            query: parse_form(query),
        }
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        get(&self.query, key)
    }

    /// The URL again without the `token` parameter (where a first visit is sent on to).
    pub fn without_token(&self) -> String {
        let rest: Vec<(String, String)> = self
            .query
            .iter()
            .filter(|(k, _)| k != "token")
            .cloned()
            .collect();
        let mut url = encode_path(&self.path);
        if !rest.is_empty() {
            url.push('?');
            url.push_str(&encode_query(&rest));
        }
        url
    }
}

/// The first value of `key` in decoded pairs.
pub fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Decode `application/x-www-form-urlencoded` (a query string or a POSTed form).
pub fn parse_form(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

/// `%XX` decoded (and `+` as a space when `plus`); invalid UTF-8 replaced, a bad escape kept.
pub fn percent_decode(s: &str, plus: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encode everything but unreserved characters (and `/` when `keep_slash`).
fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A path, percent-encoded (slashes kept).
pub fn encode_path(s: &str) -> String {
    encode(s, true)
}

/// A query string from pairs (`a=1&b=x%20y`); slashes in values are kept readable.
pub fn encode_query(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k, false), encode(v, true)))
        .collect::<Vec<_>>()
        .join("&")
}

/// `path?k=v&…` from literal pairs, relative to the pages' base (`/smith` → `smith`, `/` →
/// `./`): every page is one level below the base, which only the server knows (notes UI13).
pub fn link(path: &str, pairs: &[(&str, &str)]) -> String {
    let path = match path.trim_start_matches('/') {
        "" => "./",
        p => p,
    };
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if pairs.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", encode_query(&pairs))
    }
}

/// The value of header `name` (case-insensitive).
pub fn header<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.header(name)
}

/// The value of cookie `name` in a `Cookie:` header.
pub fn cookie<'a>(cookies: &'a str, name: &str) -> Option<&'a str> {
    cookies
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Compare two secrets in time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Is a POST's origin our own (docs/SPEC.md §14)? Its `Origin` header (or, without one, its
/// `Referer`) must be `http://HOST` with `HOST` the `Host` the request was sent to, and that
/// host one of `hosts` (our listening address and its `localhost` spelling; empty: any, when
/// listening on every address).
pub fn same_origin(
    origin: Option<&str>,
    referer: Option<&str>,
    host: Option<&str>,
    hosts: &[String],
) -> bool {
    let Some(host) = host.filter(|h| hosts.is_empty() || hosts.iter().any(|x| x == h)) else {
        return false;
    };
    let ours = format!("http://{host}");
    match (origin, referer) {
        (Some(o), _) => o == ours,
        (None, Some(r)) => r == ours || r.starts_with(&format!("{ours}/")),
        (None, None) => false,
    }
}

/// A header (ours are ASCII; a control character in a value is dropped, so no header can
/// end early).
pub fn hdr(name: &str, value: &str) -> (String, String) {
    let clean = |s: &str| s.chars().filter(|c| !c.is_control()).collect::<String>();
    (clean(name), clean(value))
}

/// The content security policy of every response: our own script and style only, nothing
/// inline, no framing, forms only to ourselves.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A response with `body`, `status` and content type `ctype`, and the headers every response
/// carries.
pub fn respond(status: u16, ctype: &str, body: Vec<u8>) -> Resp {
    Resp {
        status,
        headers: Vec::new(),
        body,
    }
    .with_header(hdr("Content-Type", ctype))
    .with_header(hdr("Cache-Control", "no-store"))
    .with_header(hdr("X-Content-Type-Options", "nosniff"))
    .with_header(hdr("Referrer-Policy", "same-origin"))
    .with_header(hdr("X-Frame-Options", "DENY"))
    .with_header(hdr("Content-Security-Policy", CSP))
}

/// An HTML page.
pub fn html(status: u16, body: String) -> Resp {
    respond(status, "text/html; charset=utf-8", body.into_bytes())
}

/// Plain text (errors, 403, 404).
pub fn text(status: u16, body: &str) -> Resp {
    respond(
        status,
        "text/plain; charset=utf-8",
        format!("{body}\n").into_bytes(),
    )
}

/// A redirect (303 See Other) to `to`, a path of ours (absolute, under the base).
pub fn redirect(to: &str) -> Resp {
    respond(303, "text/plain; charset=utf-8", Vec::new()).with_header(hdr("Location", to))
}

/// `Range: bytes=A-B` / `bytes=A-` / `bytes=-N` against a file of `len` bytes: the byte range
/// `[start, end)` to send, `Err(())` when it cannot be satisfied (416), `Ok(None)` without a
/// usable range header (the whole file). Only one range is served.
#[allow(clippy::result_unit_err)]
pub fn byte_range(range: Option<&str>, len: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = range.and_then(|r| r.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let (a, b) = spec.split_once('-').ok_or(())?;
    let num = |s: &str| s.trim().parse::<u64>().map_err(drop);
    let (start, end) = match (a.trim().is_empty(), b.trim().is_empty()) {
        (true, false) => (len.saturating_sub(num(b)?), len),
        (false, true) => (num(a)?, len),
        (false, false) => (num(a)?, num(b)?.saturating_add(1).min(len)),
        (true, true) => return Err(()),
    };
    if start >= len || start >= end {
        return Err(());
    }
    Ok(Some((start, end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_and_encodes() {
        assert_eq!(percent_decode("a%2Fb+c", true), "a/b c");
        assert_eq!(percent_decode("a+b", false), "a+b");
        assert_eq!(percent_decode("%zz%4", true), "%zz%4");
        assert_eq!(percent_decode("%ff", true), "\u{fffd}");
        let t = Target::parse("/smith?id=smith-root%2Fsmith-001&token=abc&x=");
        assert_eq!(t.path, "/smith");
        assert_eq!(t.get("id"), Some("smith-root/smith-001"));
        assert_eq!(t.without_token(), "/smith?id=smith-root/smith-001&x=");
        assert_eq!(link("/log", &[("id", "a b"), ("run", "")]), "log?id=a%20b");
        assert_eq!(link("/", &[]), "./");
        assert_eq!(encode_query(&[("t".into(), "<&>".into())]), "t=%3C%26%3E");
    }

    #[test]
    fn secrets_cookies_origins() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert_eq!(cookie("a=1; smithfs_ui=xyz; b=2", COOKIE), Some("xyz"));
        assert_eq!(cookie("a=1", COOKIE), None);
        let hosts = vec!["127.0.0.1:8080".to_string(), "localhost:8080".to_string()];
        let h = Some("127.0.0.1:8080");
        assert!(same_origin(Some("http://127.0.0.1:8080"), None, h, &hosts));
        assert!(!same_origin(Some("http://evil.example"), None, h, &hosts));
        assert!(!same_origin(Some("http://127.0.0.1:9090"), None, h, &hosts));
        assert!(!same_origin(Some("null"), None, h, &hosts));
        assert!(same_origin(
            None,
            Some("http://127.0.0.1:8080/smith"),
            h,
            &hosts
        ));
        assert!(!same_origin(
            None,
            Some("http://127.0.0.1:80800/"),
            h,
            &hosts
        ));
        assert!(!same_origin(None, None, h, &hosts));
        // A rebound name reaching us: its Host is not ours.
        assert!(!same_origin(
            Some("http://evil.example:8080"),
            None,
            Some("evil.example:8080"),
            &hosts
        ));
    }

    #[test]
    fn ranges() {
        assert_eq!(byte_range(None, 10), Ok(None));
        assert_eq!(byte_range(Some("bytes=0-3"), 10), Ok(Some((0, 4))));
        assert_eq!(byte_range(Some("bytes=4-"), 10), Ok(Some((4, 10))));
        assert_eq!(byte_range(Some("bytes=-3"), 10), Ok(Some((7, 10))));
        assert_eq!(byte_range(Some("bytes=5-100"), 10), Ok(Some((5, 10))));
        assert_eq!(byte_range(Some("bytes=10-"), 10), Err(()));
        assert_eq!(byte_range(Some("bytes=x-"), 10), Err(()));
        assert_eq!(byte_range(Some("bytes=0-1,4-5"), 10), Ok(None));
        assert_eq!(byte_range(Some("items=0-1"), 10), Ok(None));
    }
}
