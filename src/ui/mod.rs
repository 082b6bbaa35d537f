//! `smithfs ui`: the fleet in a browser (docs/SPEC.md §14). A small synchronous HTTP server
//! of its own (`server`: bounded connections, one request each; notes UI1, UI10) on a loopback
//! address, with a random token in the URL it
//! prints; every page, style and script is compiled into the binary.
//!
//! The ui reads and acts only through a [`Fleet`]: `cli/ui.rs` implements it with the very
//! functions `status`, `events`, `logs`, `diff`, `accept`, `retry` and `cancel` use (one code
//! path per action), so this module imports no command and touches no filesystem or scheduler
//! internals. It works on a mounted tree and, read-only, on one that is not mounted; each request
//! looks again, so an unmount while a page is open turns it read-only.

pub(crate) mod html;
mod http;
mod pages;
mod server;

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::sched::view::StatusDoc;
use http::{Resp, Target};
use server::{Method, Request};

/// Everything the ui reads and does, as the command line reads and does it. Errors are the one
/// line the command line would print.
pub trait Fleet: Send + Sync {
    /// The mount (or store) directory.
    fn dir(&self) -> &Path;
    /// Is the tree mounted now (actions possible)? `Err`: neither mounted nor a store (a dead
    /// mount), with the reason.
    fn mounted(&self) -> Result<bool, String>;
    /// The status document (`status --json`).
    fn status(&self) -> Result<StatusDoc, String>;
    /// The journal offset after its last byte (`events`).
    fn journal_end(&self) -> Result<u64, String>;
    /// The journal from offset `from` (clamped to the oldest line kept) to its end, and the
    /// offset after it (`events --follow`).
    fn journal_from(&self, from: u64) -> Result<(Vec<u8>, u64), String>;
    /// Does the tree have a project (`diff`, `accept` possible)?
    fn has_project(&self) -> bool;
    /// `smithfs diff DIR ID [--stat]`, its first `max` bytes, and whether there was more.
    fn diff(&self, full_id: &str, stat: bool, max: usize) -> Result<(String, bool), String>;
    /// The workspace's commits since its base, one a line (`git log --oneline`), the first
    /// `max` bytes, and whether there was more.
    fn commits(&self, full_id: &str, max: usize) -> Result<(String, bool), String>;
    /// `smithfs retry DIR ID`: the line it prints.
    fn retry(&self, full_id: &str) -> Result<String, String>;
    /// `smithfs cancel DIR ID`: the line it prints.
    fn cancel(&self, full_id: &str) -> Result<String, String>;
    /// `smithfs accept DIR ID [--branch NAME]`: the lines it prints.
    fn accept(&self, full_id: &str, branch: Option<&str>) -> Result<String, String>;
    /// Write a new task into the root's inbox, as the operator would: the line to show.
    fn new_task(&self, title: &str, text: &str) -> Result<String, String>;
}

/// How `smithfs ui` was asked to serve.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where to listen; `None`: `127.0.0.1` on a free port.
    pub listen: Option<SocketAddr>,
    /// A running smith with no output for this long is shown as stalled.
    pub stalled_after: Duration,
}

/// A bound server, its URL printed by the caller; [`Ui::serve`] answers until the process ends.
pub struct Ui {
    listener: TcpListener,
    app: Arc<App>,
    /// `http://ADDR:PORT/?token=…`: what to open.
    pub url: String,
}

/// The state every request sees.
pub(crate) struct App {
    pub fleet: Box<dyn Fleet>,
    pub token: String,
    /// The path every page is under, `/s-` and 32 random hex digits, without a trailing slash:
    /// the token's cookie is scoped to it, so the browser never sends that cookie to another
    /// server on the same host (cookies ignore ports; notes UI13). Pages link relatively.
    pub base: String,
    /// Host headers that name us (`127.0.0.1:PORT`, `localhost:PORT`, …).
    pub hosts: Vec<String>,
    pub stalled_after: Duration,
}

/// 32 hex digits from the kernel's random source.
fn random_token() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Ui {
    /// Bind the listening socket and make the token.
    ///
    /// # Errors
    /// The address is taken or cannot be bound (one line saying so), or no random token.
    pub fn bind(fleet: Box<dyn Fleet>, opts: &Options) -> Result<Ui, String> {
        let addr = opts
            .listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let listener = TcpListener::bind(addr).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => format!(
                "cannot listen on {addr}: the port is taken (choose another with --listen, or \
                 leave --listen out for a free one)"
            ),
            _ => format!("cannot listen on {addr}: {e}"),
        })?;
        let local = listener
            .local_addr()
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let token = random_token().map_err(|e| format!("cannot make a token: {e}"))?;
        let base = format!(
            "/s-{}",
            random_token().map_err(|e| format!("cannot make a token: {e}"))?
        );
        let port = local.port();
        let mut hosts = vec![local.to_string()];
        if local.ip().is_loopback() {
            hosts.push(format!("localhost:{port}"));
        }
        if local.ip().is_unspecified() {
            // Listening everywhere (behind a tunnel or a trusted network): any name may reach us;
            // the token still guards every request.
            hosts.clear();
        }
        let url = format!("http://{local}/?token={token}");
        Ok(Ui {
            listener,
            app: Arc::new(App {
                fleet,
                token,
                base,
                hosts,
                stalled_after: opts.stalled_after,
            }),
            url,
        })
    }

    /// Answer requests until the process ends (each connection on a thread of its own, at
    /// most `server::MAX_CONNECTIONS` of them).
    pub fn serve(self) {
        let app = Arc::clone(&self.app);
        server::serve(self.listener, Arc::new(move |req| app.answer(&req)));
    }
}

impl App {
    /// Answer one request (read whole, its body at most `server::MAX_BODY`). The URL (which
    /// may hold the token) is never logged.
    fn answer(&self, req: &Request) -> Resp {
        let target = Target::parse(&req.url);
        let from_cookie = http::header(req, "Cookie")
            .and_then(|c| http::cookie(c, http::COOKIE))
            .is_some_and(|t| http::same_secret(t, &self.token));
        let from_query = target
            .get("token")
            .is_some_and(|t| http::same_secret(t, &self.token));
        if !self.hosts.is_empty() {
            let host = http::header(req, "Host").unwrap_or("");
            if !self.hosts.iter().any(|h| h == host) {
                return http::text(403, "forbidden: not a host name of this server");
            }
        }
        if !(from_cookie || from_query) {
            return http::text(
                403,
                "forbidden: open the URL that `smithfs ui` printed (it carries the token)",
            );
        }
        if from_query && req.method == Method::Get {
            // First visit: keep the token in a cookie and take it out of the address bar. The
            // cookie goes only to our pages' path: a cookie is the host's, whatever the port,
            // and any program on this host may serve another port of it (notes UI13).
            let path = match target.path.strip_prefix(&self.base) {
                Some(rest) if rest.starts_with('/') => target.without_token(),
                _ => format!("{}{}", self.base, target.without_token()),
            };
            return http::redirect(&path).with_header(http::hdr(
                "Set-Cookie",
                &format!(
                    "{}={}; Path={}/; HttpOnly; SameSite=Strict",
                    http::COOKIE,
                    self.token,
                    self.base
                ),
            ));
        }
        // Every page is under the base (its cookie's path); what is not is no page of ours.
        let Some(route) = target
            .path
            .strip_prefix(&self.base)
            .filter(|r| r.starts_with('/'))
        else {
            return http::text(404, "not found");
        };
        let target = Target {
            path: route.to_string(),
            query: target.query.clone(),
        };
        match req.method {
            Method::Get | Method::Head => pages::get(self, req, &target),
            Method::Post => {
                let origin_ok = http::same_origin(
                    http::header(req, "Origin"),
                    http::header(req, "Referer"),
                    http::header(req, "Host"),
                    &self.hosts,
                );
                if !origin_ok {
                    return http::text(403, "forbidden: a POST from another origin");
                }
                let Ok(body) = std::str::from_utf8(&req.body) else {
                    return http::text(400, "bad request: the form is not UTF-8");
                };
                let form = http::parse_form(body);
                // The token must be in the form too: a cookie alone never authorises an action.
                if !http::get(&form, "token").is_some_and(|t| http::same_secret(t, &self.token)) {
                    return http::text(403, "forbidden: the form carries no valid token");
                }
                pages::post(self, &target, &form)
            }
            Method::Other => http::text(405, "method not allowed"),
        }
    }

    /// The directory as shown in page headers.
    pub fn dir_display(&self) -> String {
        self.fleet.dir().display().to_string()
    }
}

/// A smith dir's path under the mount for the full id `full` (only ids the status lists are
/// ever passed here).
pub(crate) fn smith_path(dir: &Path, full: &str) -> Option<PathBuf> {
    crate::tree::model::FullId::parse(full).map(|f| dir.join(f.smith_path()))
}
