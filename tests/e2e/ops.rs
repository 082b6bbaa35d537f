//! Operator experience (issue 11, docs/SPEC.md §5–§7) on real mounts, driven through the CLI as
//! a user would: short ids and exit codes, `status` (full ids, failure detail, `state_since`,
//! columns under a pty), `logs` and `events --follow` (a new line within a second, never
//! holding the mount busy), `retry`, the `fleet.done` hook, post-mortem reading of an
//! unmounted store.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::msched::*;
use common::{poll_until, smithfs, SMITHFS};
use serde_json::{json, Value};

const C1: &str = "smith-root/smith-001";
const C2: &str = "smith-root/smith-002";

/// The agent of these tests (replacing `msched::AGENT` after the mount): the first line of the
/// task is `split` (each further line is the task of one child), `ok`, `failonce` (exit 3 unless
/// woken for a retry) or `slow N` (prints `first`, sleeps N s, prints `second`).
const AGENT: &str = concat!(
    r#"
echo "run $SMITH_FULL_ID wake=$SMITH_WAKE""#,
    agent_prelude!(),
    r#"split)
  tail -n +2 "$SMITH_TASK_FILE" > private/lines
  n=0
  while read -r line; do n=$((n+1)); mkdir "children/$(printf 'smith-%03d' $n)"; done < private/lines
  n=0
  while read -r line; do
    n=$((n+1)); printf '%s\n' "$line" > private/t.md
    mv private/t.md "children/$(printf 'smith-%03d' $n)/inbox/task-1.md"
  done < private/lines
  exit 0 ;;
ok) publish "ok $SMITH_ID" ;;
failonce)
  if [ "$SMITH_WAKE" = retry ]; then publish "retried $SMITH_ID"; else echo "failing on purpose" >&2; exit 3; fi ;;
slow) echo first; sleep "$arg"; echo second; publish "slow $SMITH_ID" ;;
symlink) echo "mine" > private/r.md && ln -s ../private/r.md outbox/result.md ;;
slowfail)
  if [ "$SMITH_WAKE" = retry ]; then publish "retried $SMITH_ID"; else sleep 1; echo "failing slowly" >&2; exit 3; fi ;;
esac
"#
);

/// A mount running [`AGENT`] with `patch` merged into its config.
fn mount(patch: Value) -> Sm {
    let s = Sm::new(patch);
    s.write("agents/agent.sh", AGENT);
    s
}

fn smith<'a>(status: &'a Value, full: &str) -> &'a Value {
    smith_of(status, full)
}

/// Root splits into a failing child and a good one; wait until the child failed and the root
/// aggregated.
fn failed_tree(patch: Value) -> Sm {
    let s = mount(patch);
    s.task("split\nfailonce\nok\n");
    s.wait_state(30, C1, "failed");
    s.wait_state(30, "smith-root", "done");
    s
}

#[test]
fn a_failed_smith_shows_why_in_status_logs_and_events_and_retry_reruns_it() {
    let done_log = tempfile::NamedTempFile::new().expect("tempfile");
    let done = done_log.path().display().to_string();
    let exits_log = tempfile::NamedTempFile::new().expect("tempfile");
    let exits = exits_log.path().display().to_string();
    // The hooks read what they need from the environment (docs/SPEC.md §5), not from stdin.
    let record = |file: &str| {
        format!(
            "printf 'event=%s full=%s run=[%s] exit=[%s] path=%s\\n' \"$SMITH_EVENT\" \"$SMITH_FULL_ID\" \"$SMITH_RUN_ID\" \"$SMITH_EXIT_CODE\" \"$SMITH_PATH\" >> {file}"
        )
    };
    let s = failed_tree(json!({
        "agent": {"retries": 0},
        "hooks": {
            "fleet.done": [["sh", "-c", record(&done)]],
            "run.exited": [["sh", "-c", record(&exits)]],
        },
    }));

    // status --json: §7 fields.
    let st = s.status();
    let c1 = smith(&st, C1);
    assert_eq!(c1["state"], "failed", "{st}");
    assert!(c1["state_since"].as_str().is_some(), "{c1}");
    let lr = &c1["last_run"];
    assert_eq!(lr["exit_code"], 3, "{lr}");
    assert_eq!(lr["reason"], "exit", "{lr}");
    assert_eq!(lr["signal"], Value::Null, "{lr}");
    let log = lr["log"].as_str().expect("last_run.log");
    assert_eq!(
        log,
        format!(
            "{}/conversations/{}/messages.log",
            rel(C1),
            lr["run_id"].as_str().unwrap()
        )
    );
    assert!(s.p(log).is_file(), "{log} exists in the mount");
    assert_eq!(smith(&st, "smith-root")["last_run"]["reason"], "exit");

    // status: full ids, the failure's detail, plain in a pipe.
    let text = s.cli("status", &[]).expect_ok("status");
    let line = text
        .lines()
        .find(|l| l.contains(C1))
        .unwrap_or_else(|| panic!("a line for {C1}: {text}"));
    assert!(
        line.contains("failed") && line.contains("exit 3 (exit)") && line.contains(log),
        "{line}"
    );
    assert!(
        text.lines().any(|l| l.contains(C2) && l.contains("done")),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "no colour into a pipe: {text}");

    // run.exited carries reason.
    let exited = s.of("run.exited", Some(C1));
    assert_eq!(
        exited.last().map(|e| e["reason"].clone()),
        Some(json!("exit")),
        "{exited:?}"
    );

    // logs: the latest run by short id; a named run; unknown ids and runs exit 2.
    let out = s.cli("logs", &["smith-001"]).expect_ok("logs smith-001");
    assert!(
        out.contains("run smith-root/smith-001 wake=task") && out.contains("failing on purpose"),
        "{out}"
    );
    let out = s
        .cli("logs", &["smith-001", "--run", "1"])
        .expect_ok("logs --run 1");
    assert!(out.contains("failing on purpose"), "{out}");
    assert_eq!(
        s.cli("logs", &["smith-001", "--run", "run-0009"]).code,
        Some(2)
    );
    let r = s.cli("logs", &["smith-009"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stderr.contains(C1) && r.stderr.lines().count() == 1,
        "candidates in one line: {r:?}"
    );

    // retry by suffix: runs again with SMITH_WAKE=retry; the parent aggregates again.
    let finals_before = s.of("fleet.done", Some("smith-root")).len();
    assert!(finals_before >= 1, "fleet.done after the first final.md");
    let r = s.cli("retry", &["001"]);
    assert!(r.ok(), "{r:?}");
    s.wait_state(30, C1, "done");
    let started = s.of("run.started", Some(C1));
    assert_eq!(
        started.last().map(|e| e["wake"].clone()),
        Some(json!("retry")),
        "{started:?}"
    );
    poll_until(
        Duration::from_secs(30),
        "final.md with the retried result",
        || {
            s.read("results/final.md")
                .is_some_and(|f| f.contains("retried smith-001"))
        },
    );
    s.wait_state(30, "smith-root", "done");
    let fleet = s.wait_events(30, "fleet.done", Some("smith-root"), finals_before + 1);
    assert_eq!(fleet[0]["smith"], "smith-root");
    poll_until(
        Duration::from_secs(10),
        "the fleet.done hook ran twice",
        || {
            std::fs::read_to_string(&done)
                .unwrap_or_default()
                .lines()
                .count()
                >= 2
        },
    );
    let text = std::fs::read_to_string(&done).unwrap_or_default();
    for l in text.lines() {
        assert_eq!(
            l, "event=fleet.done full=smith-root run=[] exit=[] path=results/final.md",
            "{text}"
        );
    }
    // run.exited: the run's id and exit code (3: the failing agent, 0 once retried).
    let text = std::fs::read_to_string(&exits).unwrap_or_default();
    assert!(
        text.lines()
            .any(|l| l == format!("event=run.exited full={C1} run=[run-0001] exit=[3] path=")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == format!("event=run.exited full={C1} run=[run-0002] exit=[0] path=")),
        "{text}"
    );
    // The daemon's log, while mounted.
    let daemon = s.cli("logs", &["--daemon"]).expect_ok("logs --daemon");
    assert!(
        !daemon.is_empty(),
        "the daemon log through .smithfs/daemon.log"
    );
    // A done smith cannot be retried: a usage error.
    assert_eq!(s.cli("retry", &[C1]).code, Some(2));
}

#[test]
fn ids_resolve_everywhere_and_unknown_ones_exit_2() {
    let s = failed_tree(json!({"agent": {"retries": 0}}));
    // wait: short id and suffix; unknown → 2 (not 1, the code for "failed").
    assert_eq!(
        s.cli("wait", &["--smith", "smith-002", "--timeout", "5"])
            .code,
        Some(0)
    );
    assert_eq!(
        s.cli("wait", &["--smith", "001", "--timeout", "5"]).code,
        Some(1)
    );
    let r = s.cli("wait", &["--smith", "smith-009", "--timeout", "5"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stderr.contains("smith-root/smith-002"),
        "lists candidates: {r:?}"
    );
    // cancel: unknown → 2 with candidates (was EINVAL); a short id works.
    let r = s.cli("cancel", &["smith-009"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(!r.stderr.contains("os error"), "{r:?}");
    let r = s.cli("cancel", &["smith-001"]);
    assert!(r.ok() && r.stdout.contains(C1), "{r:?}");
    // events --smith: that smith's subtree only.
    let out = s
        .cli("events", &["--json", "--smith", "smith-002"])
        .expect_ok("events --smith");
    assert!(!out.is_empty());
    for l in out.lines() {
        let v: Value = serde_json::from_str(l).expect("json");
        assert_eq!(v["smith"], C2, "{l}");
    }
    assert_eq!(s.cli("events", &["--smith", "nope"]).code, Some(2));
    // run --smith by short id.
    let r = smithfs([
        "run",
        "--mount",
        &s.dir(),
        "--smith",
        "smith-002",
        "--",
        "sh",
        "-c",
        "echo $SMITH_FULL_ID",
    ]);
    assert_eq!(r.stdout.trim(), C2, "{r:?}");
}

/// Spawn `smithfs ARGS…` with stdout piped; its lines arrive on the channel with their time.
fn spawn_lines(args: &[&str]) -> (std::process::Child, mpsc::Receiver<(Instant, String)>) {
    let mut child = Command::new(SMITHFS)
        .args(args)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn smithfs");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Wait (bounded) for a line containing `needle`; when it arrived.
fn line_with(rx: &mpsc::Receiver<(Instant, String)>, needle: &str, secs: u64) -> (Instant, String) {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((t, l)) if l.contains(needle) => return (t, l),
            Ok(_) => {}
            Err(_) => panic!("no line with {needle:?} within {secs} s"),
        }
    }
}

#[test]
fn events_follow_prints_new_lines_within_a_second_and_never_keeps_the_mount_busy() {
    let mut s = mount(json!({}));
    let dir = s.dir();
    let (mut child, rx) = spawn_lines(&["events", &dir, "--follow", "--json"]);
    // The follower is up once it printed the first task's lines.
    s.task("ok\n");
    line_with(&rx, "result.published", 20);
    s.wait_state(20, "smith-root", "done");
    let wrote = Instant::now();
    s.write("smiths/smith-root/inbox/task-2.md", "ok\n");
    let (t, l) = line_with(&rx, "task-2.md", 10);
    assert!(
        t.duration_since(wrote) < Duration::from_secs(1),
        "{:?}: {l}",
        t.duration_since(wrote)
    );
    let (t, _) = line_with(&rx, "run.exited", 20);
    let journaled = s
        .of("run.exited", Some("smith-root"))
        .last()
        .map(|e| ts(&e["ts"]))
        .expect("journaled");
    let now_wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let shown_wall = now_wall - t.elapsed().as_secs_f64();
    assert!(
        shown_wall - journaled < 1.0,
        "shown {:.3} s after it was journaled",
        shown_wall - journaled
    );
    // The follower does not keep the mount busy: umount works at once.
    let began = Instant::now();
    s.m.umount();
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "umount took {:?}",
        began.elapsed()
    );
    // It follows on into the store (the unmount's own lines), until interrupted.
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "still following"
    );
    child.kill().expect("kill follower");
    let _ = child.wait();
    s.m.mount();
}

#[test]
fn logs_follow_shows_new_lines_within_a_second_and_ends_with_the_run() {
    let s = mount(json!({}));
    s.task("slow 2\n");
    s.wait_state(20, "smith-root", "running");
    let dir = s.dir();
    let (mut child, rx) = spawn_lines(&["logs", &dir, "smith-root", "--follow"]);
    let (first, _) = line_with(&rx, "first", 10);
    let (t, _) = line_with(&rx, "second", 10);
    // The agent sleeps 2 s between the lines: `second` shows within a second of being written.
    let gap = t.duration_since(first);
    assert!(
        gap < Duration::from_millis(3000),
        "second shown {gap:?} after first"
    );
    let end = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        assert!(
            Instant::now() < end,
            "logs --follow did not end with the run"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let meta = s.metas("smith-root");
    assert!(meta[0]["end"].is_string(), "the run ended: {meta:?}");
}

/// `logs ID --follow` on the latest run goes on with the next when the smith is retried at once
/// (docs/PROTOCOL-NOTES.md O48): both runs' lines, a note on stderr, and it ends with the retry.
#[test]
fn logs_follow_goes_on_with_an_automatic_retry() {
    let s = mount(json!({"agent": {"retries": 1}}));
    s.task("slowfail\n");
    s.wait_state(20, "smith-root", "running");
    let out = s.cli("logs", &["smith-root", "--follow"]);
    assert!(out.ok(), "{out:?}");
    assert!(out.stdout.contains("wake=task"), "{out:?}");
    assert!(out.stdout.contains("failing slowly"), "{out:?}");
    assert!(out.stdout.contains("wake=retry"), "{out:?}");
    assert!(
        out.stderr.contains("run-0001 ended; following run-0002"),
        "{out:?}"
    );
    assert_eq!(s.state("smith-root"), "done");
}

#[test]
fn status_events_and_logs_work_on_an_unmounted_store() {
    let mut s = failed_tree(json!({"agent": {"retries": 0}}));
    s.m.umount();
    let dir = s.dir();
    let st: Value =
        serde_json::from_str(&smithfs(["status", &dir, "--json"]).expect_ok("status --json"))
            .expect("json");
    assert_eq!(smith(&st, C1)["state"], "failed", "{st}");
    assert_eq!(smith(&st, C2)["state"], "done", "{st}");
    assert_eq!(smith(&st, C1)["last_run"]["reason"], "exit");
    // Time in state counts from the run that settled it, not from the unmount.
    for id in [C1, C2, "smith-root"] {
        assert_eq!(
            smith(&st, id)["state_since"],
            smith(&st, id)["last_run"]["ended"],
            "{id}: {st}"
        );
    }
    let text = smithfs(["status", &dir]).expect_ok("status");
    assert!(text.contains("not mounted"), "{text}");
    let ev = smithfs(["events", &dir, "--json"]).expect_ok("events");
    assert!(ev.lines().any(|l| l.contains("run.exited")), "{ev}");
    let log = smithfs(["logs", &dir, "smith-001"]).expect_ok("logs");
    assert!(log.contains("failing on purpose"), "{log}");
    let daemon = smithfs(["logs", &dir, "--daemon"]).expect_ok("logs --daemon");
    assert!(!daemon.is_empty(), "the daemon log");
    assert_eq!(smithfs(["logs", &dir, "nope"]).code, Some(2));
    // Not a smithfs directory at all: one line, exit 1.
    let r = smithfs(["status", s.m.scratch().to_str().unwrap()]);
    assert_eq!(r.code, Some(1), "{r:?}");
    s.m.mount();
}

#[test]
fn status_watch_under_a_pty_keeps_columns_aligned_with_colour() {
    let s = failed_tree(json!({"agent": {"retries": 0}}));
    // Run `status --watch` on a pty for a moment and read its screen.
    let code = r#"
import os, pty, sys, time, select
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], "status", sys.argv[2], "--watch"])
out = b""
end = time.time() + 2.5
while time.time() < end:
    r, _, _ = select.select([fd], [], [], 0.1)
    if r:
        try:
            out += os.read(fd, 65536)
        except OSError:
            break
os.kill(pid, 9)
sys.stdout.write(out.decode("utf-8", "replace"))
"#;
    let out = common::py_in(s.m.scratch(), code, &[SMITHFS, &s.dir()]).expect_ok("pty");
    assert!(out.contains("\x1b["), "coloured on a terminal: {out:?}");
    // The last screen, escapes removed.
    let last = out.rsplit("\x1b[2J").next().unwrap_or(&out);
    let plain = strip_ansi(last);
    let rows: Vec<&str> = plain.lines().filter(|l| l.contains("smith-root")).collect();
    assert_eq!(rows.len(), 3, "{plain}");
    let col = |l: &str, w: &str| l.find(w).map(|i| l[..i].chars().count());
    let runs: Vec<_> = rows.iter().map(|l| col(l, "runs ")).collect();
    assert!(
        runs[0].is_some() && runs.windows(2).all(|w| w[0] == w[1]),
        "aligned: {plain}"
    );
    let states: Vec<_> = rows
        .iter()
        .map(|l| {
            ["done", "failed"]
                .iter()
                .filter_map(|w| col(l, &format!(" {w} ")))
                .min()
        })
        .collect();
    assert!(
        states.windows(2).all(|w| w[0] == w[1]),
        "state column: {plain}"
    );
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else if c != '\r' {
            out.push(c);
        }
    }
    out
}

/// A smith cancelled on a new task keeps the result of its earlier one, and stays `cancelled`
/// through a `reload` (which rescans the store): a result older than the newest task is not a
/// reason to call it done (docs/PROTOCOL-NOTES.md S29).
#[test]
fn a_cancelled_smith_stays_cancelled_through_a_rescan() {
    let s = mount(json!({"agent": {"retries": 0}}));
    s.task("ok\n");
    s.wait_state(30, "smith-root", "done");
    s.write("smiths/smith-root/inbox/task-2.md", "slow 60\n");
    s.wait_events(30, "run.started", Some("smith-root"), 2);
    s.cli("cancel", &["smith-root"]).expect_ok("cancel");
    s.wait_state(30, "smith-root", "cancelled");
    // The scheduler handles one message at a time and publishes the status after each: once
    // the second reload is journaled, the status shows what the first one's rescan did.
    s.cli("reload", &[]).expect_ok("reload");
    s.cli("reload", &[]).expect_ok("reload again");
    s.wait_events(10, "config.reloaded", None, 2);
    assert_eq!(s.state("smith-root"), "cancelled");
    assert!(s.of("result.published", Some("smith-root")).len() == 1);
}

/// `retry` returns only once the smith has left `failed` (docs/PROTOCOL-NOTES.md O49): a `wait`
/// right after it waits for the retried run and never answers from the stale `failed` (it did
/// about one time in four). Twenty rounds of a run that fails each time: every `wait` ends after
/// one more run.
#[test]
fn retry_then_wait_never_sees_the_stale_failed() {
    // `msched::AGENT`, whose `fail` exits 3.
    let s = Sm::new(json!({"agent": {"retries": 0}}));
    s.task("fail\n");
    s.wait_state(30, "smith-root", "failed");
    let runs = |s: &Sm| {
        smith(&s.status_file(), "smith-root")["runs"]
            .as_u64()
            .unwrap_or(0)
    };
    for round in 0..20 {
        let before = runs(&s);
        let r = s.cli("retry", &["smith-root"]);
        assert!(r.ok(), "round {round}: {r:?}");
        // Returned once in effect: out of failed, or the retried run already ran (and failed).
        let (state, now) = (s.state("smith-root"), runs(&s));
        assert!(
            state != "failed" || now > before,
            "round {round}: retry returned too early ({state}, {now} runs)"
        );
        let w = s.cli("wait", &["--smith", "smith-root", "--timeout", "30"]);
        assert_eq!(
            w.code,
            Some(1),
            "round {round}: the retried run fails: {w:?}"
        );
        assert_eq!(
            runs(&s),
            before + 1,
            "round {round}: wait answered after the retried run, not from the stale state"
        );
    }
}

/// `cancel` returns only once the smith is `cancelled` and its run is gone (journaled
/// `run.exited`, `reason: cancelled`; docs/PROTOCOL-NOTES.md O49).
#[test]
fn cancel_returns_once_the_run_is_gone() {
    let s = mount(json!({"agent": {"retries": 0, "kill_grace_secs": 1}}));
    s.task("slow 60\n");
    s.wait_events(30, "run.started", Some("smith-root"), 1);
    s.cli("cancel", &["smith-root"]).expect_ok("cancel");
    assert_eq!(s.state("smith-root"), "cancelled");
    let exits = s.of("run.exited", Some("smith-root"));
    assert_eq!(exits.len(), 1, "{exits:?}");
    assert_eq!(exits[0]["reason"], "cancelled");
}

/// An `outbox/result.md` that is a symlink is no result (docs/SPEC.md §5: a regular file
/// completes): the run fails, and `run.exited`'s `error`, `status` and `status --json` say why
/// (docs/PROTOCOL-NOTES.md S28); no `results/final.md` is made.
#[test]
fn a_symlinked_result_is_no_result_and_status_says_why() {
    let s = mount(json!({"agent": {"retries": 0}}));
    s.task("symlink\n");
    s.wait_state(30, "smith-root", "failed");
    let want = "outbox/result.md is a symlink, not a regular file";
    let exited = s.wait_events(10, "run.exited", Some("smith-root"), 1);
    assert!(
        exited[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains(want)),
        "{exited:?}"
    );
    let text = s.cli("status", &[]).stdout;
    assert!(text.contains(want), "{text}");
    let doc: Value =
        serde_json::from_str(&s.cli("status", &["--json"]).stdout).expect("status --json");
    let lr = &smith(&doc, "smith-root")["last_run"];
    assert!(
        lr["error"].as_str().is_some_and(|e| e.contains(want)),
        "{lr}"
    );
    assert_eq!(lr["reason"], "exit");
    assert!(s.read("results/final.md").is_none());
}

/// A reader of `.smithfs/events.jsonl` that rotation left behind (`keep` × `max_bytes` written
/// between two of its reads) reads on from the oldest line kept: every line it gets is whole,
/// none twice, and it ends with the journal's last line (docs/PROTOCOL-NOTES.md O13,
/// F-journal-1).
#[test]
fn a_reader_left_behind_by_rotation_gets_whole_lines_once() {
    use std::io::{Read, Seek, SeekFrom};
    let s = Sm::new(json!({"journal": {"max_bytes": 4096, "keep": 1}}));
    let path = s.p(".smithfs/events.jsonl");
    let deny = |n: u32| {
        let script = format!(
            "for i in $(seq 1 {n}); do : > smiths/smith-root/inbox/t$i 2>/dev/null; done; true"
        );
        common::run_as(s.m.path(), "smith-root", &["bash", "-c", &script]).expect_ok("denials");
    };
    deny(1);
    poll_until(Duration::from_secs(10), "a first line", || {
        std::fs::metadata(&path).is_ok_and(|m| m.len() > 0)
    });
    let mut f = std::fs::File::open(&path).expect("open events.jsonl");
    let size = f.metadata().expect("fstat").len();
    // Start at the last line's newline: the reads after it begin on a line.
    f.seek(SeekFrom::Start(size - 1)).expect("seek");
    let mut nl = [0u8; 16];
    assert_eq!(f.read(&mut nl).expect("first read"), 1);
    assert_eq!(nl[0], b'\n');
    // Denials are journaled, far more than the one file kept: the reader's offset is dropped.
    // 20 denials a second per identity are journaled in full (H7): about 4 s of them.
    poll_until(Duration::from_secs(30), "the journal to grow", || {
        deny(25);
        std::fs::metadata(&path).is_ok_and(|m| m.len() > size + 3 * 4096)
    });
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8(got).expect("utf-8");
    assert!(text.ends_with('\n'), "ends on a whole line: {text:?}");
    let mut seen = std::collections::HashSet::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a whole journal line ({e}): {line:?}"));
        assert!(v.is_object(), "{line}");
        assert!(seen.insert(line.to_string()), "read twice: {line}");
    }
    let last = smithfs(["events", &s.dir(), "--json"]).expect_ok("events");
    assert_eq!(
        text.lines().last(),
        last.lines().last(),
        "ends at the journal's end"
    );
}

#[test]
fn umount_of_a_busy_mount_names_the_holders() {
    let m = common::TestMount::new();
    let holder = common::Holder::new(m.path());
    let began = Instant::now();
    let r = smithfs(["umount", m.path().to_str().unwrap()]);
    assert_ne!(r.code, Some(0), "{r:?}");
    assert!(
        began.elapsed() < Duration::from_secs(15),
        "took {:?}",
        began.elapsed()
    );
    let err = r.stderr.trim();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "pid {} (sleep) cwd {}",
            holder.pid(),
            m.path().join("smiths").display()
        )),
        "{err}"
    );
    drop(holder);
    // The guard's umount then succeeds.
}

/// A busy unmount names the processes that are not the daemon's: a run still stopping (it
/// ignores SIGTERM, and the grace is longer than umount waits) is not named, the foreign holder
/// is (docs/PROTOCOL-NOTES.md H14).
#[test]
fn umount_names_the_foreign_holder_not_the_daemons_runs() {
    let s = Sm::new(json!({"agent": {
        "command": ["bash", "-c", "trap '' TERM; exec sleep 300"],
        "kill_grace_secs": 25,
    }}));
    s.task("hold\n");
    s.wait_events(30, "run.started", Some("smith-root"), 1);
    let holder = common::Holder::new(s.m.path());
    let r = smithfs(["umount", &s.dir()]);
    assert_ne!(r.code, Some(0), "{r:?}");
    let err = r.stderr.trim();
    assert!(
        err.contains(&format!("pid {} (sleep)", holder.pid())),
        "{err}"
    );
    assert_eq!(err.matches("pid ").count(), 1, "only the holder: {err}");
    drop(holder);
    // The run is killed at the end of its grace; the guard's umount then succeeds.
}

#[test]
fn signals_keep_working_after_a_failed_unmount() {
    let mut m = common::TestMount::with(common::MountOpts {
        allow_other: true,
        foreground: true,
        ..Default::default()
    });
    let pid = m.daemon_pid().expect("server pid");
    let holder = common::Holder::new(m.path());
    // SAFETY: signalling the foreground server this test started.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let log = m.scratch().join("foreground.log");
    poll_until(
        Duration::from_secs(15),
        "the failed unmount reported",
        || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("unmount failed")),
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains(&format!("pid {} (sleep)", holder.pid())),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "no colour into a file: {text}");
    assert!(common::is_smithfs_mounted(m.path()), "still mounted");
    drop(holder);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let st = m.wait_foreground_exit();
    assert!(st.success(), "{st}");
    assert!(!common::is_smithfs_mounted(m.path()));
    m.mount();
}

#[test]
fn mount_refuses_a_directory_init_did_not_make() {
    let t = tempfile::tempdir().expect("tempdir");
    let d = t.path().join("plain");
    std::fs::create_dir(&d).expect("mkdir");
    let r = smithfs(["mount", d.to_str().unwrap()]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        r.stderr.contains("smithfs init") && r.stderr.lines().count() == 1,
        "{r:?}"
    );
    assert!(!common::is_smithfs_mounted(&d));
    assert!(!d.join(".smithfs-state").exists(), "nothing left behind");
}

#[test]
fn a_smith_cannot_unmount_the_fleet() {
    // The daemon's own refusal: a sandboxed run cannot even reach this test build's binary
    // (outside its view, §12), so the run here is unsandboxed.
    let m = common::TestMount::unsandboxed();
    let dir = m.path().to_str().unwrap();
    let r = smithfs([
        "run",
        "--mount",
        dir,
        "--smith",
        "smith-root",
        "--",
        common::SMITHFS,
        "umount",
        dir,
    ]);
    assert_ne!(r.code, Some(0), "{r:?}");
    assert!(
        r.stderr
            .contains("umount refused: this process is smith-root"),
        "{}",
        r.stderr
    );
    // Still mounted and served.
    assert!(m.path().join("smiths/smith-root/smith.md").exists());
    // The operator still unmounts (the guard, on drop).
}
