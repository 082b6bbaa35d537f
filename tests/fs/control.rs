//! `.smithfs/`: whoami, why, status.json, and `ctl` commands (docs/SPEC.md §6, §7).

use std::ffi::OsStr;

use nix::errno::Errno;
use smithfs::fs::Caller;
use smithfs::trigger::Trigger;

use crate::world::*;

fn control(w: &World, name: &str) -> NodeId {
    let dir = w.node(".smithfs");
    w.fs.lookup(dir, OsStr::new(name)).unwrap().0.node()
}

fn read(w: &World, who: &Caller, name: &str) -> Result<String, Errno> {
    let ino = control(w, name);
    let (fh, _) = w.fs.open(who, ino, libc::O_RDONLY).map_err(|e| e.errno())?;
    let data = w.fs.read(ino, fh, 0, 1 << 16).unwrap();
    w.fs.release(ino, fh).unwrap();
    Ok(String::from_utf8(data).unwrap())
}

fn ctl(w: &World, who: &Caller, line: &str) -> Result<(), Errno> {
    let ino = control(w, "ctl");
    let (fh, _) = w.fs.open(who, ino, libc::O_WRONLY).map_err(|e| e.errno())?;
    let r = w.fs.write(who, ino, fh, 0, line.as_bytes(), false);
    w.fs.release(ino, fh).unwrap();
    r.map(drop).map_err(|e| e.errno())
}

#[test]
fn control_files_open_for_identified_callers_and_only_ctl_is_written() {
    let w = World::new();
    let whoami = read(&w, &CHILD, "whoami").unwrap();
    assert!(whoami.contains("smith-root/smith-001"), "{whoami}");
    assert_eq!(
        read(&w, &OPERATOR, "status.json").unwrap(),
        "{\"test\": true}\n"
    );
    assert_eq!(read(&w, &UNKNOWN, "whoami"), Err(Errno::EACCES));
    let status = control(&w, "status.json");
    assert_eq!(
        errno(w.fs.open(&OPERATOR, status, libc::O_WRONLY)),
        Errno::EACCES
    );
    assert!(read(&w, &OPERATOR, "why")
        .unwrap()
        .contains("control-read-only"));
}

#[test]
fn ctl_commands_by_identity_and_ancestry() {
    let w = World::new();
    w.take_triggers();
    assert_eq!(ctl(&w, &ROOT, "bogus smith-root\n"), Err(Errno::EINVAL));
    assert!(w.why(&ROOT).contains("ctl-syntax"), "{}", w.why(&ROOT));
    assert_eq!(
        ctl(&w, &ROOT, "cancel smith-root/smith-009\n"),
        Err(Errno::ENOENT)
    );
    // Cancel: the operator or an ancestor.
    assert_eq!(ctl(&w, &CHILD, "cancel smith-root\n"), Err(Errno::EACCES));
    ctl(&w, &ROOT, "cancel smith-root/smith-001\n").unwrap();
    let rules: Vec<String> = w
        .take_triggers()
        .into_iter()
        .map(|t| match t {
            Trigger::AccessDenied { rule, .. } => rule,
            Trigger::Cancel { smith } if smith == w.child => "cancelled".into(),
            other => panic!("{other:?}"),
        })
        .collect();
    // Each denial also went to the journal.
    assert_eq!(
        rules,
        [
            "ctl-syntax",
            "ctl-no-such-smith",
            "ctl-cancel-ancestor-only",
            "cancelled"
        ]
    );
    // Bind: the operator's; a failed bind returns the resolver's errno.
    assert_eq!(
        ctl(&w, &ROOT, "bind smith-root/smith-001\n"),
        Err(Errno::EACCES)
    );
    ctl(&w, &OPERATOR, "bind smith-root/smith-001\n").unwrap();
    assert_eq!(*w.ids.bound.lock().unwrap(), [(OPERATOR.pid, w.child)]);
    let gone = Caller {
        pid: 99,
        ..OPERATOR
    };
    assert_eq!(
        ctl(&w, &gone, "bind smith-root/smith-001\n"),
        Err(Errno::ESRCH)
    );
    assert!(w.why(&gone).contains("ctl-bind-failed"), "{}", w.why(&gone));
}
