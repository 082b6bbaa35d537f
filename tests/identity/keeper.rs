//! The keeper of ancestry mode (docs/SPEC.md §2) with real commands: it passes the exit status back
//! (code, or 128 + signal; 127 for a missing command) and returns only once its last descendant —
//! including a `setsid` background orphan — is gone.
//!
//! One test function on purpose: the keeper makes this process a subreaper and reaps every child
//! of it, so nothing else may run in this test binary at the same time.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use smithfs::process::keeper::keep;

fn argv(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

#[test]
fn keeper_statuses_and_orphans() {
    assert_eq!(keep(&argv(&["true"])).expect("keep"), 0);
    assert_eq!(keep(&argv(&["sh", "-c", "exit 3"])).expect("keep"), 3);
    assert_eq!(
        keep(&argv(&["sh", "-c", "kill -TERM $$"])).expect("keep"),
        128 + 15
    );
    assert_eq!(
        keep(&argv(&["smithfs-no-such-command-xyz"])).expect("keep"),
        127
    );
    assert_eq!(keep(&argv(&["/etc/hostname"])).expect("keep"), 126);

    // The command exits at once with 5; a double-forked, setsid background writer outlives it and
    // writes a file 300 ms later. The keeper must wait for it.
    let tmp = tempfile::tempdir().expect("tempdir");
    let marker = tmp.path().join("late");
    let script = format!(
        "(setsid sh -c 'sleep 0.3; echo late > \"{}\"' &) ; exit 5",
        marker.display()
    );
    let start = Instant::now();
    assert_eq!(keep(&argv(&["sh", "-c", &script])).expect("keep"), 5);
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "returned after {:?}",
        start.elapsed()
    );
    assert_eq!(
        std::fs::read_to_string(&marker).expect("the orphan finished first"),
        "late\n"
    );
    assert!(keep(&[]).is_err(), "empty argv");
}
