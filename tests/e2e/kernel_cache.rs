//! The kernel cache we can trust (issue 14; docs/PROTOCOL-NOTES.md C4, U4): store entries and
//! attributes are cached for a day, so every change that does not come through the kernel's own
//! requests must show through the mount at once anyway. Each out-of-band path is driven by a real
//! run on a real mount, on both transports (`/dev/fuse`, and io_uring when the kernel has it: the
//! mount takes `UringSwitch` during its INIT):
//! - a run's `messages.log` grows through the descriptor the daemon handed it: a reader holding
//!   it open through the mount (`tail -f`'s way: read past the end, `fstat`) sees each line within
//!   1 s, and `stat` of the path follows the size;
//! - the daemon's own writes: the new run directory in `conversations/` (lookup and readdir after
//!   a cached listing), `meta.json` rewritten at the run's end, `results/final.md` replaced by a
//!   longer result after the old one was read and stat'ed through the mount.

use crate::common;

use std::io::Read;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::msched::*;
use common::{poll_until, MountOpts, UringSwitch};
use serde_json::json;

const LOG: &str = "smiths/smith-root/conversations/run-0001/messages.log";
const TICKS: usize = 12;

fn sm(transport: &'static str) -> Sm {
    Sm::with(
        MountOpts {
            allow_other: true,
            extra: vec!["--transport", transport],
            ..MountOpts::default()
        },
        json!({}),
    )
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn out_of_band_changes_show_at_once(transport: &'static str) {
    let s = sm(transport);
    let conv = s.p("smiths/smith-root/conversations");
    // Cache what the daemon is about to change: the empty listing and the directory's attributes.
    assert_eq!(std::fs::read_dir(&conv).unwrap().count(), 0);

    s.task(&format!("ticks {TICKS}\n"));
    // The run directory and its log are made by the daemon: a lookup finds them at once.
    poll_until(
        Duration::from_secs(20),
        "messages.log through the mount",
        || s.p(LOG).exists(),
    );
    assert!(
        std::fs::read_dir(&conv)
            .unwrap()
            .filter_map(Result::ok)
            .any(|e| e.file_name() == "run-0001"),
        "readdir of conversations/ shows the new run"
    );

    // tail -f: one descriptor held open through the mount, read past its end, fstat'ed.
    let mut f = std::fs::File::open(s.p(LOG)).expect("open messages.log");
    let mut text = String::new();
    let mut lags: Vec<f64> = Vec::new();
    let mut seen = 0usize;
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen < TICKS && Instant::now() < deadline {
        let mut buf = String::new();
        f.read_to_string(&mut buf).expect("read messages.log");
        if buf.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let t = now();
        text.push_str(&buf);
        let ticks: Vec<f64> = text
            .lines()
            .filter_map(|l| l.strip_prefix("tick "))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
            .collect();
        lags.extend(ticks[seen..].iter().map(|written| t - written));
        seen = ticks.len();
        let fsize = f.metadata().expect("fstat").len();
        let psize = std::fs::metadata(s.p(LOG)).expect("stat").len();
        assert!(
            fsize >= text.len() as u64 && psize >= text.len() as u64,
            "fstat {fsize} and stat {psize} follow the {} bytes read",
            text.len()
        );
    }
    assert_eq!(seen, TICKS, "every line reached the reader:\n{text}");
    // Within 1 s; one line late is the loaded machine (2 shared cores, load ~10), not the
    // cache, which would keep a line out for a day.
    let late = lags.iter().filter(|&&l| l >= 1.0).count();
    assert!(
        late <= 1 && lags.iter().all(|&l| l < 3.0),
        "lines took {lags:.3?} s to show through the mount ({transport})"
    );

    // The daemon's own writes: final.md, meta.json.
    let fin = s.p("results/final.md");
    assert_eq!(s.wait_file(20, "results/final.md"), "ticked smith-root\n");
    s.wait_state(10, "smith-root", "done");
    assert_eq!(std::fs::metadata(&fin).unwrap().len(), 18);
    let metas = s.metas("smith-root");
    assert!(
        metas[0]["end"].is_string(),
        "meta.json rewritten: {}",
        metas[0]
    );

    let second = "a second, longer result\n";
    s.write(
        "smiths/smith-root/inbox/task-2.md",
        &format!("say {}", second.trim_end()),
    );
    poll_until(Duration::from_secs(20), "final.md to be replaced", || {
        std::fs::read_to_string(&fin).is_ok_and(|t| t == second)
    });
    assert_eq!(
        std::fs::metadata(&fin).unwrap().len(),
        second.len() as u64,
        "stat of final.md follows its new content"
    );
    assert!(
        s.p("smiths/smith-root/conversations/run-0002/meta.json")
            .exists(),
        "the second run's directory is found"
    );
}

#[test]
fn out_of_band_changes_show_at_once_over_dev_fuse() {
    out_of_band_changes_show_at_once("dev-fuse");
}

#[test]
fn out_of_band_changes_show_at_once_over_io_uring() {
    if !UringSwitch::usable() {
        return;
    }
    out_of_band_changes_show_at_once("io-uring");
}

/// A missing name is remembered by the kernel as long as the directory's entries (a negative
/// entry, docs/PROTOCOL-NOTES.md U13), so a name the daemon makes behind the kernel must drop
/// it: `conversations/` re-made for a run after its smith removed it (its smith dir is cached
/// for a day), found at once by the path that missed it before.
fn names_made_by_the_daemon_replace_negative_entries(transport: &'static str) {
    let s = sm(transport);
    let conv = s.p("smiths/smith-root/conversations");
    std::fs::remove_dir(&conv).expect("rmdir conversations (empty)");
    for _ in 0..3 {
        assert!(!conv.exists(), "conversations/ is gone");
    }
    s.task("ticks 1\n");
    poll_until(
        Duration::from_secs(20),
        "the re-made conversations/ through the mount",
        || conv.join("run-0001").exists(),
    );
    assert_eq!(s.wait_file(20, "results/final.md"), "ticked smith-root\n");
}

#[test]
fn names_made_by_the_daemon_replace_negative_entries_over_dev_fuse() {
    names_made_by_the_daemon_replace_negative_entries("dev-fuse");
}

#[test]
fn names_made_by_the_daemon_replace_negative_entries_over_io_uring() {
    if !UringSwitch::usable() {
        return;
    }
    names_made_by_the_daemon_replace_negative_entries("io-uring");
}

/// A mount (unsandboxed) whose runs are loopback runs of agent script `agent` (each on its own
/// remote mount, notes R10), with `private/data` holding `one\n`; `None` (said) when not root:
/// `smithfs attach` mounts as root only (notes R11).
fn loopback_with(agent: &str) -> Option<Sm> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: smithfs attach mounts as root only (notes R11)");
        return None;
    }
    let s = Sm::with(
        MountOpts {
            allow_other: true,
            unsandboxed: true,
            ..MountOpts::default()
        },
        json!({"launcher": {"kind": "loopback"}, "agent": {"retries": 0}}),
    );
    s.write("agents/agent.sh", agent);
    s.write("smiths/smith-root/private/data", "one\n");
    Some(s)
}

/// The agent of [`a_local_change_reaches_a_remote_mounts_cache_at_once`]: on its remote mount it
/// stats `private/data` and looks up the missing `private/new` (its kernel now caches both, for
/// a day), says `private/ready`, then polls for 10 s (`stat`, answered from the cache while it is
/// valid) until it sees the operator's changes.
const WATCHER: &str = r#"
stat -c %s private/data > /dev/null
test -e private/new && { echo early > private/seen; exit 0; }
echo ready > private/ready
start=$(date +%s%N)
for i in $(seq 1 200); do
  if [ "$(stat -c %s private/data)" = 8 ] && [ -e private/new ]; then
    echo "seen $(( ($(date +%s%N) - start) / 1000000 ))" > private/seen
    exit 0
  fi
  sleep 0.05
done
echo "stale: size $(stat -c %s private/data), new $(test -e private/new && echo found || echo missing)" > private/seen
"#;

/// docs/PROTOCOL-NOTES.md R40: what a local process changes through the daemon's own mount is
/// pushed to every remote connection, so a node's kernel, which keeps entries and attributes as
/// long as the daemon's own (a day), sees it at once: a file rewritten in place (a truncating
/// open, passthrough writes, the close) and a name made where a lookup had found nothing. Without
/// the pushes the node would go on reading the old size and the cached miss.
#[test]
fn a_local_change_reaches_a_remote_mounts_cache_at_once() {
    let Some(s) = loopback_with(WATCHER) else {
        return;
    };
    s.task("watch\n");
    s.wait_file(60, "smiths/smith-root/private/ready");
    let t = Instant::now();
    s.write("smiths/smith-root/private/data", "two two\n");
    s.write("smiths/smith-root/private/new", "");
    let seen = s.wait_file(30, "smiths/smith-root/private/seen");
    assert!(seen.starts_with("seen "), "{seen:?}");
    eprintln!(
        "the node saw the local changes {seen} ms after its start ({:?} after the writes began)",
        t.elapsed()
    );
}

/// The agent of [`a_remote_change_reaches_the_daemons_own_cache_at_once`]: on its remote mount
/// it rewrites `private/data` in place, makes `private/new`, then says `private/ready`.
const WRITER: &str = r#"
printf 'two two\n' > private/data
: > private/new
echo ready > private/ready
"#;

/// docs/PROTOCOL-NOTES.md R9, the other way from
/// [`a_local_change_reaches_a_remote_mounts_cache_at_once`]: what a run changes over its remote
/// mount is told to the daemon's own kernel (the one sink every framing's dispatcher tells,
/// skipping only the connection it came from) before the request is answered, so once the run
/// said it is done the operator's kernel, which had cached the file's old size and the miss of
/// the new name for a day, answers with the new ones at once (no polling).
#[test]
fn a_remote_change_reaches_the_daemons_own_cache_at_once() {
    let Some(s) = loopback_with(WRITER) else {
        return;
    };
    // Cache the old size and the miss, in this mount's kernel.
    assert_eq!(
        std::fs::metadata(s.p("smiths/smith-root/private/data"))
            .unwrap()
            .len(),
        4
    );
    assert!(!s.p("smiths/smith-root/private/new").exists());
    s.task("write\n");
    s.wait_file(60, "smiths/smith-root/private/ready");
    assert_eq!(
        std::fs::metadata(s.p("smiths/smith-root/private/data"))
            .unwrap()
            .len(),
        8,
        "the operator's kernel still has the old size"
    );
    assert!(
        s.p("smiths/smith-root/private/new").exists(),
        "the operator's kernel still has the miss"
    );
}
