//! A small WebDriver client (W3C WebDriver over HTTP/1.1 on loopback, std only) for Debian's
//! `chromium` + `chromium-driver`, and the guard that starts chromedriver and always stops it and
//! the browser it started (by the process group chromedriver leads), even when a test fails.
//! Chosen over Python's selenium or a WebDriver crate to keep the build lean: about 250 lines.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The element key of the W3C protocol.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// An HTTP answer: status, headers (names lower-cased), body.
pub type Answer = (u16, Vec<(String, String)>, Vec<u8>);

/// One HTTP request to `127.0.0.1:port`.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Answer> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    // Read the head, then the body by its length (chromedriver keeps connections open).
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let split = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::other("no HTTP head"));
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    loop {
        let complete = match length {
            Some(n) => body.len() >= n,
            None if chunked => body.windows(5).any(|w| w == b"0\r\n\r\n"),
            None => false,
        };
        if complete || method == "HEAD" {
            break;
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&buf[..n]);
    }
    if let Some(n) = length {
        body.truncate(n);
    }
    if chunked {
        body = dechunk(&body);
    }
    Ok((status, headers, body))
}

/// Decode a chunked body.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..i])
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = i + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

/// A loopback port free now, below the kernel's ephemeral range (`ip_local_port_range`): a
/// port the kernel picks with `bind(:0)` is in that range, where an outgoing connection may
/// take it before chromedriver binds it (the listener flood tests cycle through the whole
/// range; scripts/slurm/cluster.sh has the same rule). Random, so parallel tests rarely meet.
pub fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768)
        .max(10_001);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut x = u64::from(nanos) ^ (u64::from(std::process::id()) << 32);
    for _ in 0..1000 {
        // xorshift: enough to spread the tries.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = 10_000 + (x % u64::from(low - 10_000)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below {low}");
}

/// Are chromium and chromedriver installed (scripts/install-deps.sh)?
pub fn available() -> bool {
    ["chromium", "chromedriver"].iter().all(|b| {
        Command::new("sh")
            .args(["-c", &format!("command -v {b}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// chromedriver on a free port with one headless chromium session. Drop ends the session and
/// kills chromedriver's process group (chromedriver and every browser process it started).
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

impl Browser {
    /// Start chromedriver and a headless chromium (1280×900).
    pub fn start() -> Browser {
        let spawn = |port: u16| {
            Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .expect("spawn chromedriver (scripts/install-deps.sh installs chromium-driver)")
        };
        let port = free_port();
        let mut b = Browser {
            driver: spawn(port),
            port,
            session: String::new(),
        };
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _, _)) = http(b.port, "GET", "/status", &[], b"") {
                break;
            }
            assert!(Instant::now() < end, "chromedriver did not start");
            // chromedriver ends at once when its port was taken meanwhile: another port.
            if let Ok(Some(_)) = b.driver.try_wait() {
                b.port = free_port();
                b.driver = spawn(b.port);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,900",
                         "--no-first-run", "--no-default-browser-check"]
            },
            "unhandledPromptBehavior": "ignore"
        }}});
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"].as_str().expect("a session id").to_string();
        b
    }

    /// One WebDriver command; the `value` of its answer. Panics on a WebDriver error.
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.try_call(method, path, body)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"))
    }

    /// One WebDriver command; `Err` with the error's message.
    pub fn try_call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let (status, _, out) = http(
            self.port,
            method,
            path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
        .map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_slice(&out).map_err(|e| format!("{e}"))?;
        if status != 200 {
            return Err(format!("{status}: {}", v["value"]));
        }
        Ok(v["value"].clone())
    }

    fn s(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Load `url`.
    pub fn go(&self, url: &str) {
        self.call("POST", &self.s("/url"), Some(json!({"url": url})));
    }

    /// The current URL.
    pub fn url(&self) -> String {
        self.call("GET", &self.s("/url"), None)
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// The element `css` matches, if any.
    pub fn find(&self, css: &str) -> Option<String> {
        self.try_call(
            "POST",
            &self.s("/element"),
            Some(json!({"using": "css selector", "value": css})),
        )
        .ok()
        .and_then(|v| v[ELEMENT].as_str().map(str::to_owned))
    }

    /// Every element `css` matches.
    pub fn find_all(&self, css: &str) -> Vec<String> {
        self.call(
            "POST",
            &self.s("/elements"),
            Some(json!({"using": "css selector", "value": css})),
        )
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
    }

    /// The rendered text of `css`'s element ("" when there is none).
    pub fn text(&self, css: &str) -> String {
        match self.find(css) {
            Some(e) => self
                .try_call("GET", &self.s(&format!("/element/{e}/text")), None)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            None => String::new(),
        }
    }

    /// Click `css`'s element.
    pub fn click(&self, css: &str) {
        let e = self
            .find(css)
            .unwrap_or_else(|| panic!("no element {css} on {}", self.url()));
        self.call(
            "POST",
            &self.s(&format!("/element/{e}/click")),
            Some(json!({})),
        );
    }

    /// Replace the value of `css`'s input with `text`.
    pub fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css).unwrap_or_else(|| panic!("no element {css}"));
        self.call(
            "POST",
            &self.s(&format!("/element/{e}/clear")),
            Some(json!({})),
        );
        self.call(
            "POST",
            &self.s(&format!("/element/{e}/value")),
            Some(json!({"text": text})),
        );
    }

    /// The text of the open `confirm()`/`alert()`, if one is open.
    pub fn alert_text(&self) -> Option<String> {
        self.try_call("GET", &self.s("/alert/text"), None)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
    }

    /// Accept the open `confirm()`.
    pub fn accept_alert(&self) {
        self.call("POST", &self.s("/alert/accept"), Some(json!({})));
    }

    /// Run `script` (a function body) in the page; its return value.
    pub fn js(&self, script: &str) -> Value {
        self.call(
            "POST",
            &self.s("/execute/sync"),
            Some(json!({"script": script, "args": []})),
        )
    }

    /// The page's HTML source.
    pub fn source(&self) -> String {
        self.call("GET", &self.s("/source"), None)
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// A PNG screenshot of the window.
    pub fn screenshot(&self) -> Vec<u8> {
        let b64 = self.call("GET", &self.s("/screenshot"), None);
        base64(b64.as_str().unwrap_or(""))
    }

    /// A PNG of the whole page: the window made as tall as the page (at most 2400 px) first.
    pub fn full_screenshot(&self) -> Vec<u8> {
        let h = self
            .js("return Math.min(2400, document.documentElement.scrollHeight + 20);")
            .as_u64()
            .unwrap_or(900);
        self.call(
            "POST",
            &self.s("/window/rect"),
            Some(json!({"width": 1280, "height": h})),
        );
        let png = self.screenshot();
        self.call(
            "POST",
            &self.s("/window/rect"),
            Some(json!({"width": 1280, "height": 900})),
        );
        png
    }

    /// Poll `f` every 100 ms until it is true or `secs` pass (then panic naming `what`).
    #[track_caller]
    pub fn wait(&self, secs: u64, what: &str, mut f: impl FnMut(&Browser) -> bool) {
        let end = Instant::now() + Duration::from_secs(secs);
        while !f(self) {
            assert!(
                Instant::now() < end,
                "timed out after {secs}s waiting for {what}; page {}:\n{}",
                self.url(),
                self.text("body")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.try_call("DELETE", &format!("/session/{}", self.session), None);
        }
        // chromedriver leads its own process group, with the browser in it: stop them all.
        let pgid = self.driver.id() as i32;
        // SAFETY: kill(2) on the process group this guard started; no memory is involved.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}

/// Decode standard base64 (the screenshot).
fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}
