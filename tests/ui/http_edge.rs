//! The ui's HTTP edge attacked without a browser: a missing or wrong token, an action POSTed
//! from another origin or without the token in the form, a rebound host name, smith and run ids
//! that do not exist or try a path, and the port already taken.

use std::ffi::OsStr;

use crate::common::{smithfs, TestMount};
use crate::webdriver::http;
use crate::UiServer;

fn get(
    ui: &UiServer,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, String) {
    let path = format!("{}{path}", ui.base);
    let (s, h, b) = http(ui.port, "GET", &path, headers, b"").expect("GET");
    (s, h, String::from_utf8_lossy(&b).into_owned())
}

fn post(ui: &UiServer, headers: &[(&str, &str)], form: &str) -> (u16, String) {
    let mut hs = vec![("Content-Type", "application/x-www-form-urlencoded")];
    hs.extend_from_slice(headers);
    let path = format!("{}/action", ui.base);
    let (s, _, b) = http(ui.port, "POST", &path, &hs, form.as_bytes()).expect("POST");
    (s, String::from_utf8_lossy(&b).into_owned())
}

#[test]
fn the_token_and_the_origin_guard_every_request() {
    let m = TestMount::new();
    let ui = UiServer::start(m.path(), &[]);
    let cookie = format!("smithfs_ui={}", ui.token);
    let origin = format!("http://127.0.0.1:{}", ui.port);
    // No token, a wrong one, a wrong cookie: 403, for pages, fragments, assets and the tick.
    for path in [
        "/",
        "/smith?id=smith-root",
        "/api/tick",
        "/static/ui.js",
        "/events",
    ] {
        assert_eq!(get(&ui, path, &[]).0, 403, "{path}");
        assert_eq!(
            get(&ui, &format!("{path}?token=nope"), &[]).0,
            403,
            "{path}"
        );
        assert_eq!(
            get(&ui, path, &[("Cookie", "smithfs_ui=nope")]).0,
            403,
            "{path}"
        );
    }
    // The token in the URL: a cookie, and the address bar without it.
    let (s, h, _) = get(&ui, &format!("/?token={}", ui.token), &[]);
    assert_eq!(s, 303);
    let set = h
        .iter()
        .find(|(k, _)| k == "set-cookie")
        .map(|(_, v)| v.clone());
    assert!(
        set.as_deref().is_some_and(|c| c.contains(&cookie)
            && c.contains("HttpOnly")
            && c.contains("SameSite=Strict")
            && c.contains(&format!("Path={}/;", ui.base))),
        "{set:?}"
    );
    let home = format!("{}/", ui.base);
    assert!(
        h.iter().any(|(k, v)| k == "location" && *v == home),
        "{h:?}"
    );
    // The pages are under a random base, the cookie's path (notes UI13): elsewhere, nothing.
    assert!(
        ui.base.starts_with("/s-") && ui.base.len() == 35,
        "{}",
        ui.base
    );
    for path in ["/", "/smith?id=smith-root", "/api/tick"] {
        let (s, _, _) = http(ui.port, "GET", path, &[("Cookie", &cookie)], b"").expect("GET");
        assert_eq!(s, 404, "{path} outside the base");
    }
    let (s, h, body) = get(&ui, "/", &[("Cookie", &cookie)]);
    assert_eq!(s, 200);
    assert!(body.contains("smith-root"), "{body}");
    let csp = h
        .iter()
        .find(|(k, _)| k == "content-security-policy")
        .map(|(_, v)| v.as_str());
    assert!(
        csp.is_some_and(|c| c.contains("script-src 'self'")),
        "{csp:?}"
    );
    // Another Host (a rebound name): refused even with the token.
    let port_host = format!("evil.example:{}", ui.port);
    assert_eq!(
        get(&ui, "/", &[("Host", &port_host), ("Cookie", &cookie)]).0,
        403
    );
    assert_eq!(
        get(
            &ui,
            "/",
            &[
                ("Host", &format!("localhost:{}", ui.port)),
                ("Cookie", &cookie)
            ]
        )
        .0,
        200
    );
    // Actions: the token in the form and our origin, both, or 403.
    let form = format!("token={}&action=cancel&id=smith-root&confirmed=1", ui.token);
    assert_eq!(
        post(
            &ui,
            &[("Cookie", &cookie), ("Origin", "http://evil.example")],
            &form
        )
        .0,
        403
    );
    assert_eq!(
        post(&ui, &[("Cookie", &cookie), ("Origin", "null")], &form).0,
        403
    );
    assert_eq!(
        post(&ui, &[("Cookie", &cookie)], &form).0,
        403,
        "no Origin, no Referer"
    );
    assert_eq!(
        post(
            &ui,
            &[("Cookie", &cookie), ("Origin", &origin)],
            "action=cancel&id=smith-root&confirmed=1"
        )
        .0,
        403,
        "a cookie alone authorises no action"
    );
    assert_eq!(
        post(
            &ui,
            &[("Origin", &origin)],
            "token=nope&action=cancel&id=smith-root"
        )
        .0,
        403
    );
    // With both, unconfirmed: a page whose button says Confirm, and nothing done yet.
    let unconfirmed = format!("token={}&action=cancel&id=smith-root", ui.token);
    let (s, body) = post(
        &ui,
        &[("Cookie", &cookie), ("Origin", &origin)],
        &unconfirmed,
    );
    assert_eq!(s, 200, "{body}");
    assert!(body.contains(">Confirm</button>"), "{body}");
    // Ids that do not exist or try a path: 404.
    for path in [
        "/smith?id=smith-nope",
        "/smith?id=../../etc",
        "/smith?id=smith-root/../smith-root",
        "/smith",
        "/log?id=smith-root&run=../../../etc/passwd",
        "/log?id=smith-root&run=run-0001/../../x",
        "/log?id=smith-root&run=run-9999",
        "/raw?id=..%2F..%2Fetc&run=run-0001",
        "/frag/smith?id=%2E%2E",
        "/nothing",
        "/static/../Cargo.toml",
    ] {
        assert_eq!(get(&ui, path, &[("Cookie", &cookie)]).0, 404, "{path}");
    }
    let (s, body) = post(
        &ui,
        &[("Cookie", &cookie), ("Origin", &origin)],
        &format!("token={}&action=retry&id=..%2F..&confirmed=1", ui.token),
    );
    assert_eq!(s, 404, "{body}");
}

#[test]
fn a_taken_port_is_one_clear_line() {
    let m = TestMount::new();
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let addr = format!("127.0.0.1:{port}");
    let r = smithfs([
        OsStr::new("ui"),
        m.path().as_os_str(),
        OsStr::new("--listen"),
        OsStr::new(&addr),
    ]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("the port is taken") && r.stderr.contains(&addr),
        "{}",
        r.stderr
    );
    assert!(r.stdout.is_empty(), "no URL printed: {}", r.stdout);
    drop(l);
}

/// A smith's page reads only regular files of the smith's (notes H23): an `outbox/result.md`
/// that is a FIFO parked a worker thread per view in its open (eight views and the ui answered
/// nothing), one that is a symlink was followed as the operator. Now the page answers at once
/// with no result, every time, and never shows the symlink's target.
#[test]
fn a_fifo_or_symlink_result_neither_hangs_nor_leaks() {
    let m = TestMount::new();
    let result = "smiths/smith-root/outbox/result.md";
    crate::common::run_as(m.path(), "smith-root", &["mkfifo", result]).expect_ok("mkfifo");
    std::fs::write(
        m.path().join("smiths/smith-root/inbox/task-1.md"),
        "the task <text>\n",
    )
    .expect("task");
    let ui = UiServer::start(m.path(), &[]);
    let cookie = format!("smithfs_ui={}", ui.token);
    let (_, _, body) = get(&ui, "/smith?id=smith-root", &[("Cookie", &cookie)]);
    assert!(
        body.contains("the task &lt;text&gt;"),
        "a task shows: {body}"
    );
    for i in 0..12 {
        let (s, _, body) = get(&ui, "/smith?id=smith-root", &[("Cookie", &cookie)]);
        assert_eq!(s, 200, "view {i}");
        assert!(body.contains("no result yet"), "view {i}");
    }
    assert_eq!(get(&ui, "/", &[("Cookie", &cookie)]).0, 200);
    let secret = m.scratch().join("secret.txt");
    std::fs::write(&secret, "the operator's secret\n").expect("secret");
    crate::common::run_as(m.path(), "smith-root", &["rm", result]).expect_ok("rm");
    crate::common::run_as(
        m.path(),
        "smith-root",
        &["ln", "-s", &secret.to_string_lossy(), result],
    )
    .expect_ok("ln -s");
    let (s, _, body) = get(&ui, "/smith?id=smith-root", &[("Cookie", &cookie)]);
    assert_eq!(s, 200);
    assert!(!body.contains("the operator's secret"), "{body}");
}

/// The agent of `flood_the_ui`: `CONNS` connections to the ui's port, every other one with a
/// request begun and never finished, held for `HOLD` seconds; `private/ready` once all are open.
const FLOOD: &str = r#"
import os, socket, sys, time
port, conns, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
held = []
for i in range(conns):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        if i % 2:
            s.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    except OSError:
        pass
    held.append(s)
open(os.environ["SMITH_DIR"] + "/private/ready", "w").write("%d\n" % len(held))
time.sleep(hold)
"#;

/// Notes UI10: any process on the host reaches the ui's loopback port — a smith's agent too
/// (its network is the host's unless `sandbox.network` is `none`) — before any token is
/// checked. Against `tiny_http` 0.12 a few hundred idle connections from a sandboxed agent
/// ended the ui for good (its accept loop stopped at the first `EMFILE`, one thread per
/// connection without a limit). Now the operator's page answers while the agent holds 600
/// connections (half of them a request begun and never finished) against a ui with 256
/// descriptors, and after.
#[test]
fn an_agent_flooding_the_port_neither_ends_the_ui_nor_keeps_the_operator_out() {
    let m = TestMount::new();
    let ui = UiServer::start_with(m.path(), &[], Some(256));
    let cookie = format!("smithfs_ui={}", ui.token);
    assert_eq!(get(&ui, "/", &[("Cookie", &cookie)]).0, 200);
    let ready = m.path().join("smiths/smith-root/private/ready");
    let port = ui.port.to_string();
    let dir = m.path().to_path_buf();
    let agent = std::thread::spawn(move || {
        crate::common::run_as(
            &dir,
            "smith-root",
            &["python3", "-c", FLOOD, &port, "600", "8"],
        )
    });
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !ready.exists() {
        assert!(
            std::time::Instant::now() < end,
            "the agent never got its connections open"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for i in 0..3 {
        let t = std::time::Instant::now();
        let (s, _, body) = get(&ui, "/", &[("Cookie", &cookie)]);
        assert_eq!(s, 200, "under the flood, try {i}: {body}");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(3),
            "under the flood, try {i}: {:?}",
            t.elapsed()
        );
    }
    agent
        .join()
        .expect("agent thread")
        .expect_ok("the flooding agent");
    let (s, _, body) = get(&ui, "/smith?id=smith-root", &[("Cookie", &cookie)]);
    assert_eq!(s, 200, "after the flood: {body}");
}

/// The agent of `a_smiths_page_stays_small_whatever_it_wrote`: a file of `LINES` empty lines in
/// its workspace (a diff of as many `+` lines, each an element on the page) and, as the parent
/// of `smith-001`, `TASKS` task files of 200 KiB in that child's inbox.
const BLOAT: &str = r#"
import os, sys
lines, tasks = int(sys.argv[1]), int(sys.argv[2])
d = os.environ["SMITH_DIR"]
with open(d + "/workspace/big.txt", "w") as f:
    f.write("\n" * lines)
os.mkdir(d + "/children/smith-001")
for i in range(tasks):
    with open(d + "/children/smith-001/inbox/task-%04d.md" % i, "w") as f:
        f.write(("task %d " % i) * 25000)
"#;

/// Notes UI11: a smith's page showed its whole diff, its whole commit list and every task in
/// its inbox (each up to 256 KiB): a smith that wrote a file of 3 000 000 empty lines made its
/// page some 80 MiB of HTML (the ui held the diff and the page, the operator's browser an
/// element per line), and a parent that wrote 100 large tasks into its child's inbox made the
/// child's page 20 MiB. Now each part is cut (2 MiB of diff, 20 000 lines, 50 tasks, 1 MiB of
/// tasks), with a line saying so and how to see it all.
#[test]
fn a_smiths_page_stays_small_whatever_it_wrote() {
    let (m, _repo) = crate::project_mount();
    crate::common::run_as(
        m.path(),
        "smith-root",
        &["python3", "-c", BLOAT, "3000000", "100"],
    )
    .expect_ok("the bloating agent");
    let ui = UiServer::start(m.path(), &[]);
    let cookie = format!("smithfs_ui={}", ui.token);
    let t = std::time::Instant::now();
    let (s, _, body) = get(&ui, "/smith?id=smith-root", &[("Cookie", &cookie)]);
    assert_eq!(s, 200, "{}", &body[..body.len().min(2000)]);
    assert!(
        body.len() < 6 << 20,
        "the root's page is {} bytes",
        body.len()
    );
    assert!(body.contains("big.txt"), "the diff is there");
    assert!(body.contains("the diff cut here"), "and says it is cut");
    eprintln!("the root's page: {} bytes in {:?}", body.len(), t.elapsed());
    let (s, _, body) = get(
        &ui,
        "/smith?id=smith-root/smith-001",
        &[("Cookie", &cookie)],
    );
    assert_eq!(s, 200);
    assert!(
        body.len() < 3 << 20,
        "the child's page is {} bytes",
        body.len()
    );
    assert!(body.contains("task-0099.md"), "the newest tasks show");
    assert!(
        body.contains("more task file(s) not shown"),
        "{}",
        body.len()
    );
}

/// The agent of `bidirectional_controls_are_shown_not_obeyed`: Trojan Source
/// (CVE-2021-42574) in its workspace, its result and a task name of its child's.
const TROJAN: &str = r#"
import os
d = os.environ["SMITH_DIR"]
with open(d + "/workspace/access.py", "w") as f:
    f.write('def allowed(user):\n    """Only admins \u202e \u2066""" ; return True # \u2069 \u2066"""\n    return user.admin\n')
with open(d + "/outbox/result.md", "w") as f:
    f.write("all checks \u202edessap\u202c\n")
os.mkdir(d + "/children/smith-001")
with open(d + "/children/smith-001/inbox/task-\u202edm.exe.md", "w") as f:
    f.write("see \u2067the attachment\u2069\n")
"#;

/// Notes UI12: what a smith wrote was escaped, but its bidirectional formatting characters
/// (U+202A–U+202E, U+2066–U+2069, the direction marks) reached the page as they were, so the
/// browser reordered the line: a diff whose `return True` reads as part of a docstring, a result
/// that reads "all checks passed". Now each shows as its code (`⟨U+202E⟩`), on every page that
/// shows a smith's text (diff, result, task names and contents, logs).
#[test]
fn bidirectional_controls_are_shown_not_obeyed() {
    let (m, _repo) = crate::project_mount();
    crate::common::run_as(m.path(), "smith-root", &["python3", "-c", TROJAN])
        .expect_ok("the Trojan Source agent");
    let ui = UiServer::start(m.path(), &[]);
    let cookie = format!("smithfs_ui={}", ui.token);
    let bidi = |c: char| matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    for page in ["/smith?id=smith-root", "/smith?id=smith-root/smith-001"] {
        let (s, _, body) = get(&ui, page, &[("Cookie", &cookie)]);
        assert_eq!(s, 200, "{page}");
        let raw: Vec<char> = body.chars().filter(|c| bidi(*c)).collect();
        assert!(
            raw.is_empty(),
            "{page} has raw bidi controls {raw:?}:\n{body}"
        );
        assert!(body.contains("\u{27e8}U+202E\u{27e9}"), "{page}: {body}");
    }
    let (_, _, root) = get(&ui, "/smith?id=smith-root", &[("Cookie", &cookie)]);
    assert!(
        root.contains("return True # \u{27e8}U+2069\u{27e9}"),
        "{root}"
    );
    assert!(
        root.contains("all checks \u{27e8}U+202E\u{27e9}dessap"),
        "{root}"
    );
}

/// Notes UI14: git hashes every changed or untracked file of a work tree whole, so a sparse file
/// of 200 GB (which costs its smith no storage) kept the smith-side git of its page reading
/// zeros through the mount for the whole 60 s deadline, on every view, before the page said
/// "did not finish … may be a FIFO". Now the diff is refused at once, naming the file.
#[test]
fn a_huge_sparse_file_does_not_stall_the_smiths_page() {
    let (m, _repo) = crate::project_mount();
    crate::common::run_as(
        m.path(),
        "smith-root",
        &[
            "truncate",
            "-s",
            "200G",
            "smiths/smith-root/workspace/sparse.bin",
        ],
    )
    .expect_ok("the sparse file");
    crate::common::run_as(
        m.path(),
        "smith-root",
        &[
            "sh",
            "-c",
            "echo small > smiths/smith-root/workspace/small.txt",
        ],
    )
    .expect_ok("a small file");
    let ui = UiServer::start(m.path(), &[]);
    let cookie = format!("smithfs_ui={}", ui.token);
    let t = std::time::Instant::now();
    let (s, _, body) = get(&ui, "/smith?id=smith-root", &[("Cookie", &cookie)]);
    let took = t.elapsed();
    assert_eq!(s, 200);
    assert!(
        took < std::time::Duration::from_secs(20),
        "the page took {took:?}"
    );
    // The big file is left out and named; everything else is shown (UI14, revised).
    assert!(
        body.contains("left out of the diff") && body.contains("sparse.bin"),
        "{body}"
    );
    assert!(body.contains("+small"), "{body}");
}
