//! opendir, readdir(plus), releasedir, fsyncdir, statfs.

use nix::errno::Errno;

use crate::world::*;

fn names(w: &World, who: &smithfs::fs::Caller, ino: NodeId) -> Result<Vec<String>, Errno> {
    let fh = w.fs.opendir(who, ino).map_err(|e| e.errno())?;
    let mut out = Vec::new();
    w.fs.readdir(ino, fh, 0, false, |e| {
        out.push(e.name.to_string_lossy().into_owned());
        false
    })
    .map_err(|e| e.errno())?;
    w.fs.releasedir(ino, fh).map_err(|e| e.errno())?;
    out.sort();
    Ok(out)
}

#[test]
fn listing_follows_the_read_right_and_hides_the_state_dir() {
    let w = World::new();
    let root = names(&w, &OPERATOR, NodeId::ROOT).unwrap();
    assert!(root.contains(&".smithfs".to_string()), "{root:?}");
    assert!(!root.contains(&".smithfs-state".to_string()), "{root:?}");
    let smith = w.node(CHILD_DIR);
    let listed = names(&w, &ROOT, smith).unwrap();
    assert!(listed.contains(&"inbox".to_string()), "{listed:?}");
    let private = w.node(&format!("{CHILD_DIR}/private"));
    assert!(names(&w, &CHILD, private).is_ok());
    assert_eq!(names(&w, &ROOT, private), Err(Errno::EACCES));
    // `.smithfs/` lists its files for identified callers only.
    let ctl = w.node(".smithfs");
    assert!(names(&w, &CHILD, ctl).unwrap().contains(&"ctl".to_string()));
    assert_eq!(errno(w.fs.opendir(&UNKNOWN, ctl)), Errno::EACCES);
    let fh = w.fs.opendir(&CHILD, private).unwrap();
    w.fs.fsyncdir(private, fh, false).unwrap();
    w.fs.releasedir(private, fh).unwrap();
    assert!(w.fs.statfs(NodeId::ROOT).unwrap().f_bsize > 0);
}
