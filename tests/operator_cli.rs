//! The operator's command line (issue 11, PROTOCOL.md §6), driven as a user would drive the
//! real binary: the mount type `fuse.smithfs`, `mount -o`, the `mount.fuse.smithfs` helper
//! under mount(8), completions, the man page, `--version`, `--help` examples, `doctor --json`.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// The targets `findmnt -t fuse.smithfs` lists.
fn findmnt_smithfs() -> Vec<String> {
    let r = run(Command::new("findmnt").args(["-n", "-r", "-o", "TARGET", "-t", "fuse.smithfs"]));
    r.stdout.lines().map(str::to_owned).collect()
}

fn listed(dir: &Path) -> bool {
    findmnt_smithfs().iter().any(|t| Path::new(t) == dir)
}

/// PROTOCOL.md §6: a root mount has the type `fuse.smithfs` (daemon and foreground).
#[test]
fn root_mounts_have_type_fuse_smithfs() {
    let m = TestMount::new();
    assert_eq!(
        mount_at(m.path()),
        Some(("fuse.smithfs".into(), "smithfs".into()))
    );
    assert!(
        listed(m.path()),
        "findmnt -t fuse.smithfs: {:?}",
        findmnt_smithfs()
    );
    let f = TestMount::with(MountOpts {
        foreground: true,
        ..MountOpts::default()
    });
    assert!(
        listed(f.path()),
        "findmnt -t fuse.smithfs: {:?}",
        findmnt_smithfs()
    );
    // And the mount works: the operator writes through it.
    m.sh_ok("echo hi > smiths/smith-root/private/x && cat smiths/smith-root/private/x");
    drop(f);
    drop(m);
}

/// `doctor --json` is the same checks as the text form, as `[{"check","status","detail"}]`,
/// and the exit code is 1 exactly when one failed.
#[test]
fn doctor_json_matches_the_text_form() {
    let text = smithfs(["doctor"]);
    let json = smithfs(["doctor", "--json"]);
    assert_eq!(text.code, json.code, "{text:?} {json:?}");
    let checks: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    let checks = checks.as_array().expect("a list");
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(checks.len(), lines.len(), "{checks:?}\n{lines:?}");
    let mut failed = false;
    for (c, line) in checks.iter().zip(&lines) {
        let obj = c.as_object().unwrap();
        assert_eq!(obj.len(), 3, "{c}");
        let (check, status, detail) = (
            c["check"].as_str().unwrap(),
            c["status"].as_str().unwrap(),
            c["detail"].as_str().unwrap(),
        );
        let tag = match status {
            "ok" => "ok  ",
            "warn" => "warn",
            "fail" => {
                failed = true;
                "FAIL"
            }
            other => panic!("status {other}"),
        };
        assert_eq!(*line, format!("{tag}  {check:<14} {detail}"));
    }
    assert_eq!(json.code, Some(if failed { 1 } else { 0 }));
    for want in [
        "/dev/fuse",
        "fusermount3",
        "kernel",
        "cgroups",
        "privileges",
    ] {
        assert!(checks.iter().any(|c| c["check"] == want), "{want}");
    }
}
