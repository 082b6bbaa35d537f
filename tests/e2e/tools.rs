//! Everyday tools inside a mount (issue 2, "Done when"): git, tar, python venv, SQLite and an
//! editor-style atomic save, each run as real processes against a real mount.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::*;

const GIT: &str =
    "git -c user.name=Test -c user.email=test@example.com -c init.defaultBranch=main \
                   -c commit.gpgsign=false";

#[test]
fn git_init_add_commit_log() {
    let m = TestMount::new();
    m.sh_ok(&format!(
        "mkdir repo && cd repo && {GIT} init -q && \
         mkdir -p src/deep && echo 'fn main() {{}}' > src/main.rs && seq 1 1000 > src/deep/numbers && \
         ln -s main.rs src/link && chmod +x src/main.rs && \
         {GIT} add -A && {GIT} commit -qm first && \
         echo change >> src/deep/numbers && git mv src/main.rs src/lib.rs && \
         {GIT} commit -qam second && {GIT} tag v1 && \
         {GIT} checkout -q -b side HEAD~1 && echo side > side.txt && {GIT} add side.txt && \
         {GIT} commit -qm side && {GIT} checkout -q main && {GIT} merge -q --no-edit side"
    ));
    // Commits made in the same second have no defined order: compare as a set.
    let log = m.sh_ok("cd repo && git log --format=%s | sort");
    assert_eq!(
        log, "Merge branch 'side'\nfirst\nsecond\nside\n",
        "git log: {log}"
    );
    assert_eq!(m.sh_ok("cd repo && git status --porcelain"), "");
    m.sh_ok("cd repo && git fsck --strict --no-progress 2>&1");
    assert_eq!(
        m.sh_ok("cd repo && git ls-files -s src/link | cut -c1-6"),
        "120000\n"
    );
    assert_eq!(
        m.sh_ok("cd repo && git show v1:src/lib.rs"),
        "fn main() {}\n"
    );
    // gc repacks (renames, hard links, fsync of packs) and the repository stays whole.
    m.sh_ok("cd repo && git gc -q && git fsck --no-progress 2>&1 && git count-objects -v | grep -q '^count: 0'");
    // A clone from inside the mount to inside the mount.
    m.sh_ok(&format!(
        "{GIT} clone -q repo clone && cd clone && test \"$(git log --format=%s | wc -l)\" = 4"
    ));
}

#[test]
fn tar_extracts_nested_dirs_and_symlinks() {
    let m = TestMount::new();
    let scratch = m.scratch().to_path_buf();
    // Build the tarball outside the mount.
    sh_in(
        &scratch,
        "mkdir -p src/a/b/c/d src/empty src/x && cd src && \
         echo top > top.txt && head -c 200000 /dev/urandom > a/b/c/d/blob && \
         for i in $(seq 1 50); do echo $i > a/b/f$i; done && \
         ln -s ../top.txt a/up && ln -s b/c/d a/shortcut && ln -s /nonexistent x/dangling && \
         ln top.txt x/hardlink && chmod 700 a/b/c && chmod 4755 a/b/f1 && mkfifo x/fifo && \
         touch -h -d '2000-01-01 00:00:00 UTC' a/up && touch -d '1999-12-31 12:00:00 UTC' top.txt && \
         cd .. && tar --numeric-owner -cf t.tar -C src .",
    )
    .expect_ok("make tarball");
    m.sh_ok(&format!(
        "mkdir out && tar --numeric-owner -xpf {}/t.tar -C out",
        scratch.display()
    ));
    // tar -d compares contents, modes, mtimes, symlink targets and hard links with the archive.
    m.sh_ok(&format!(
        "tar --numeric-owner -df {}/t.tar -C out",
        scratch.display()
    ));
    // And the tree matches an extraction to a plain directory.
    sh_in(
        &scratch,
        "mkdir plain && tar --numeric-owner -xpf t.tar -C plain",
    )
    .expect_ok("plain extraction");
    assert_eq!(
        snapshot(&m.path().join("out")),
        snapshot(&scratch.join("plain"))
    );
    assert_eq!(m.sh_ok("cat out/a/up"), "top\n");
    assert_eq!(m.sh_ok("ls out/a/shortcut"), "blob\n");
    assert_eq!(
        m.sh_ok("stat -c %i out/top.txt out/x/hardlink | uniq | wc -l")
            .trim(),
        "1"
    );
    // And back out again: tar of the mounted tree round-trips to the same bytes.
    m.sh_ok(&format!(
        "tar --numeric-owner -cf {0}/again.tar -C out . && mkdir {0}/again && tar -xpf {0}/again.tar -C {0}/again",
        scratch.display()
    ));
    assert_eq!(
        snapshot(&scratch.join("again")),
        snapshot(&scratch.join("plain"))
    );
}

#[test]
fn python_venv_without_pip() {
    let m = TestMount::new();
    m.sh_ok("python3 -m venv --without-pip venv");
    let out = m.sh_ok(
        "venv/bin/python -c 'import sys, os; print(sys.prefix == os.path.abspath(\"venv\"), sys.prefix != sys.base_prefix)'",
    );
    assert_eq!(out, "True True\n");
    // The venv's python can write and import a module placed in its site-packages.
    m.sh_ok(
        "sp=$(venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])') && \
         echo 'VALUE = 42' > \"$sp/smithfs_probe.py\" && \
         test \"$(venv/bin/python -c 'import smithfs_probe; print(smithfs_probe.VALUE)')\" = 42",
    );
    assert!(m.sh("test -L venv/bin/python -o -f venv/bin/python").ok());
}

const SQLITE_WRITER: &str = r#"
import sqlite3, sys
mode = sys.argv[1]
db = sqlite3.connect("db.sqlite", isolation_level=None, timeout=30)
db.execute(f"PRAGMA journal_mode={mode}")
db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, name TEXT, blob BLOB)")
db.execute("BEGIN")
for i in range(1000):
    db.execute("INSERT INTO t (name, blob) VALUES (?, ?)", (f"row {i}", bytes([i % 256]) * 500))
print("inserted", flush=True)
sys.stdin.readline()
db.execute("COMMIT")
print("committed", flush=True)
sys.stdin.readline()
"#;

const SQLITE_READER: &str = r#"
import sqlite3
db = sqlite3.connect("db.sqlite", timeout=30)
try:
    print(db.execute("SELECT count(*) FROM t").fetchone()[0])
except sqlite3.OperationalError as e:
    print("busy" if "locked" in str(e) else str(e))
"#;

fn sqlite_roundtrip(m: &TestMount, mode: &str) {
    let mut w = Command::new("python3")
        .args(["-c", SQLITE_WRITER, mode])
        .current_dir(m.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(w.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "inserted\n");
    // The uncommitted transaction is invisible to a concurrent reader (WAL: it reads the last
    // commit; rollback journal: the writer holds only a RESERVED lock, readers may read).
    let seen = m.py_ok(SQLITE_READER, &[]);
    assert!(seen == "0\n" || seen == "busy\n", "{mode}: {seen}");
    writeln!(w.stdin.as_mut().unwrap()).unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "committed\n");
    // While the writer still has the database open, another process sees the commit.
    assert_eq!(m.py_ok(SQLITE_READER, &[]), "1000\n", "{mode}");
    writeln!(w.stdin.as_mut().unwrap()).unwrap();
    assert!(w.wait().unwrap().success());
    let check = m.py_ok(
        r#"
import sqlite3
db = sqlite3.connect("db.sqlite")
print(db.execute("PRAGMA integrity_check").fetchone()[0],
      db.execute("SELECT count(*), sum(length(blob)) FROM t").fetchone())
"#,
        &[],
    );
    assert_eq!(check, "ok (1000, 500000)\n", "{mode}");
}

#[test]
fn sqlite_rollback_journal_with_concurrent_reader() {
    let m = TestMount::new();
    sqlite_roundtrip(&m, "DELETE");
}

#[test]
fn sqlite_wal_with_concurrent_reader() {
    let m = TestMount::new();
    sqlite_roundtrip(&m, "WAL");
    // Many concurrent writers through the lock protocol: no lost update.
    let r = m.sh_ok(
        r#"for i in 1 2 3 4; do python3 -c '
import sqlite3
db = sqlite3.connect("db.sqlite", timeout=60, isolation_level=None)
for _ in range(50):
    db.execute("BEGIN IMMEDIATE"); n = db.execute("SELECT count(*) FROM t").fetchone()[0]
    db.execute("INSERT INTO t (name) VALUES (?)", (str(n),)); db.execute("COMMIT")
' & done; wait; python3 -c 'import sqlite3; print(sqlite3.connect("db.sqlite").execute("SELECT count(*), count(DISTINCT name) FROM t WHERE blob IS NULL").fetchone())'"#,
    );
    assert_eq!(r, "(200, 200)\n");
}

#[test]
fn editor_style_atomic_save() {
    let m = TestMount::new();
    m.sh_ok("printf 'version 1\\n' > doc.txt && chmod 640 doc.txt");
    let out = m.py_ok(
        r#"
import os, tempfile
before = os.stat("doc.txt")
reader = open("doc.txt")                      # a process that still has the old file open
fd, tmp = tempfile.mkstemp(dir=".", prefix=".doc.txt.", suffix=".swp")
os.write(fd, b"version 2\n" * 1000)
os.fchmod(fd, before.st_mode & 0o7777)
os.fsync(fd)
os.close(fd)
os.rename(tmp, "doc.txt")
dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY); os.fsync(dfd); os.close(dfd)
after = os.stat("doc.txt")
print(after.st_ino != before.st_ino, oct(after.st_mode & 0o777), after.st_size)
print(reader.read() == "version 1\n", open("doc.txt").read() == "version 2\n" * 1000)
print([n for n in os.listdir(".") if n.startswith(".doc")])
"#,
        &[],
    );
    assert_eq!(out, "True 0o640 10000\nTrue True\n[]\n");
    // The same with shell tools (sed -i writes a temp file and renames it over the original).
    let ino = m.sh_ok("stat -c %i doc.txt");
    m.sh_ok("sed -i 's/version 2/version 3/' doc.txt");
    assert_ne!(m.sh_ok("stat -c %i doc.txt"), ino);
    assert_eq!(m.sh_ok("sort -u doc.txt"), "version 3\n");
    // And a backup-then-write editor (vim's default with `backupcopy=no`): rename, write new.
    m.sh_ok("mv doc.txt doc.txt~ && printf 'version 4\\n' > doc.txt && rm doc.txt~");
    assert_eq!(m.sh_ok("cat doc.txt"), "version 4\n");
}
