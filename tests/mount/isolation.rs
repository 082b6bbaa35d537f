//! The isolation suite (issue 3, docs/SPEC.md §2–§4 and §7): real processes — bash, coreutils,
//! python3, git — bound to the smiths of a 4-level tree with `smithfs run`, under both identity
//! mechanisms (`--identity cgroup` and `--identity ancestry`), each attempt checked for its exact
//! errno. Every scenario is one module with a `cgroup` and an `ancestry` test, each on its own
//! `TestMount`.
//!
//! The tree every scenario starts from (operator-made; `smith-root/smith-001` is `A` …):
//!
//! ```text
//! ROOT  smith-root                                   level 0
//! A     smith-root/smith-001                         level 1
//! B     smith-root/smith-002                         level 1, A's sibling
//! AA    smith-root/smith-001/smith-001               level 2
//! AB    smith-root/smith-001/smith-002               level 2, AA's sibling
//! AAA   smith-root/smith-001/smith-001/smith-001     level 3
//! AAB   smith-root/smith-001/smith-001/smith-002     level 3, AAA's sibling
//! ```
//!
//! Each smith dir is seeded by the operator with `private/f`, `private/sub/` (empty),
//! `outbox/f`, `inbox/note.md` and `CLAUDE.md`, whose contents name the smith.
//!
//! Attempts are Python expressions run in one `python3` process per identity; each prints `ok`
//! or the errno's name, and all mismatches of a batch are reported together.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::*;

const ROOT: &str = "smith-root";
const A: &str = "smith-root/smith-001";
const B: &str = "smith-root/smith-002";
const AA: &str = "smith-root/smith-001/smith-001";
const AB: &str = "smith-root/smith-001/smith-002";
const AAA: &str = "smith-root/smith-001/smith-001/smith-001";
const AAB: &str = "smith-root/smith-001/smith-001/smith-002";
const TREE: [&str; 7] = [ROOT, A, B, AA, AB, AAA, AAB];

/// Python names for the smith dirs (mount-relative), in `TREE` order.
const PY_NAMES: [&str; 7] = ["ROOT", "A", "B", "AA", "AB", "AAA", "AAB"];

/// Identity mechanism of a mount (docs/SPEC.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Cgroup,
    Ancestry,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Mode::Cgroup => "cgroup",
            Mode::Ancestry => "ancestry",
        }
    }
}

/// Who performs an attempt: the operator (this unbound test process's children) or a smith.
type Who<'a> = Option<&'a str>;
const OPERATOR: Who<'static> = None;

/// The smith dir of `full_id`, relative to the mount root.
fn smith_dir(full_id: &str) -> String {
    let mut parts = full_id.split('/');
    let mut d = format!("smiths/{}", parts.next().unwrap());
    for p in parts {
        d.push_str("/children/");
        d.push_str(p);
    }
    d
}

/// The real python3 executable (the one on PATH may be a slow pyenv shim).
fn python() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| {
        // The system's python first: a sandboxed run sees the system directories, not an
        // operator's own install such as pyenv's under a 0700 home (§12).
        if Path::new("/usr/bin/python3").exists() {
            return "/usr/bin/python3".into();
        }
        let r = run(Command::new("python3").args(["-c", "import sys; print(sys.executable)"]));
        let p = r.expect_ok("python3 sys.executable").trim().to_string();
        assert!(!p.is_empty(), "python3 has no sys.executable");
        p
    })
}

/// Helpers available to every attempt. Paths are relative to the mount root (the cwd) unless
/// the code changes directory; `M` is the mount's absolute path.
const PRELUDE: &str = r#"
import ctypes, errno, os, socket, stat, sys, threading, time
def E(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def _close(fd):
    os.close(fd)
def rd(p):
    fd = os.open(p, os.O_RDONLY)
    try: os.read(fd, 64)
    finally: _close(fd)
def wr(p, data=b"overwritten"):
    fd = os.open(p, os.O_WRONLY)
    try: os.write(fd, data)
    finally: _close(fd)
def ap(p, data=b"appended"):
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    try: os.write(fd, data)
    finally: _close(fd)
def rw(p):
    _close(os.open(p, os.O_RDWR))
def cr(p, data=b"new"):
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try: os.write(fd, data)
    finally: _close(fd)
def put(p, data=b"put"):
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try: os.write(fd, data if isinstance(data, bytes) else data.encode())
    finally: _close(fd)
def get(p):
    with open(p, "rb") as f: return f.read().decode()
def rotrunc(p):
    _close(os.open(p, os.O_RDONLY | os.O_TRUNC))
def ls(p):
    os.listdir(p)
def setx(p):
    os.setxattr(p, "user.iso", b"1")
def getx(p):
    os.getxattr(p, "user.iso")
def lsx(p):
    os.listxattr(p)
def rmx(p):
    os.removexattr(p, "user.iso")
def chardev(p):
    os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 3))
def blockdev(p):
    os.mknod(p, stat.S_IFBLK | 0o600, os.makedev(7, 0))
def sock(p):
    s = socket.socket(socket.AF_UNIX)
    try: s.bind(p)
    finally: s.close()
def opath_reopen(p, flags):
    fd = os.open(p, os.O_PATH)
    try: _close(os.open("/proc/self/fd/%d" % fd, flags))
    finally: os.close(fd)
def exchange(a, b):
    _rename2(a, b, 2)
def noreplace(a, b):
    _rename2(a, b, 1)
def whiteout(a, b):
    _rename2(a, b, 4)
def _rename2(a, b, flags):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), ctypes.c_uint(flags)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
libc = ctypes.CDLL(None, use_errno=True)
def ctl(line):
    fd = os.open(".smithfs/ctl", os.O_WRONLY)
    try: os.write(fd, (line + "\n").encode())
    finally: os.close(fd)
def in_thread(f):
    box = []
    def body():
        try: f()
        except BaseException as e: box.append(e)
    t = threading.Thread(target=body); t.start(); t.join()
    if box: raise box[0]
def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f: s = f.read()
    except OSError:
        return False
    return s[s.rindex(")") + 2] not in "ZXx"
M = os.getcwd()
"#;

/// A mounted smithfs with the 7-smith tree, seeded.
struct Tree {
    m: TestMount,
    mode: Mode,
}

impl Tree {
    fn new(mode: Mode) -> Self {
        Self::with(mode, &[])
    }

    /// [`Tree::new`] with the sandbox off (`sandbox.enabled: false`, docs/SPEC.md §12): for what
    /// only unsandboxed runs do — root runs, orphans that outlive their command (a sandboxed
    /// run's pid namespace ends with it).
    fn unsandboxed(mode: Mode) -> Self {
        Self::with_sandbox(mode, &[], Some(serde_json::json!({"enabled": false})))
    }

    /// Mount with `--identity MODE` and `extra` arguments, build and seed the tree as the
    /// operator (unless `extra` makes the operator read-only: then only the mount).
    fn with(mode: Mode, extra: &[&'static str]) -> Self {
        Self::with_sandbox(mode, extra, None)
    }

    /// [`Tree::with`], with the mount-wide `sandbox` section set to `sandbox` first (docs/SPEC.md
    /// §12) when given.
    fn with_sandbox(
        mode: Mode,
        extra: &[&'static str],
        sandbox: Option<serde_json::Value>,
    ) -> Self {
        let mut args = vec!["--identity", mode.arg()];
        args.extend_from_slice(extra);
        let mut m = TestMount::with(MountOpts {
            allow_other: true,
            foreground: false,
            extra: args,
            env: Vec::new(),
            unsandboxed: false,
        });
        if let Some(s) = sandbox {
            m.set_sandbox(s);
        }
        let t = Tree { m, mode };
        let who = std::fs::read_to_string(t.abs(".smithfs/whoami")).expect("operator whoami");
        assert!(
            who.lines()
                .any(|l| l == format!("identity mode: {}", mode.arg())),
            "mounted with --identity {} but whoami says:\n{who}",
            mode.arg()
        );
        if !extra.contains(&"read-only") {
            for id in &TREE[1..] {
                std::fs::create_dir(t.abs(&smith_dir(id)))
                    .unwrap_or_else(|e| panic!("operator mkdir {id}: {e}"));
            }
            for id in TREE {
                let d = smith_dir(id);
                t.write(&format!("{d}/private/f"), &format!("private of {id}\n"));
                t.write(&format!("{d}/outbox/f"), &format!("outbox of {id}\n"));
                t.write(&format!("{d}/inbox/note.md"), &format!("note for {id}\n"));
                t.write(&format!("{d}/CLAUDE.md"), &format!("claude of {id}\n"));
                std::fs::create_dir(t.abs(&format!("{d}/private/sub"))).unwrap();
                std::fs::create_dir(t.abs(&format!("{d}/outbox/sub"))).unwrap();
                for area in ["private", "outbox"] {
                    std::os::unix::fs::symlink("f", t.abs(&format!("{d}/{area}/lnk"))).unwrap();
                }
            }
        }
        t
    }

    fn abs(&self, rel: &str) -> PathBuf {
        self.m.path().join(rel)
    }

    /// Write a file as the operator (this test process).
    fn write(&self, rel: &str, content: &str) {
        std::fs::write(self.abs(rel), content).unwrap_or_else(|e| panic!("write {rel}: {e}"));
    }

    /// Read a file as the operator.
    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.abs(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
    }

    /// `CMD…` in `cwd` (mount-relative), bound to `who` with `smithfs run`, or as the operator.
    fn cmd(&self, who: Who, cwd: &str, argv: &[&str]) -> Run {
        let mut c = match who {
            Some(id) => {
                let mut c = Command::new(SMITHFS);
                c.arg("run")
                    .arg("--mount")
                    .arg(self.m.path())
                    .arg("--smith")
                    .arg(id)
                    .arg("--")
                    .args(argv);
                c
            }
            None => {
                let mut c = Command::new(argv[0]);
                c.args(&argv[1..]);
                c
            }
        };
        c.current_dir(self.abs(cwd));
        run(&mut c)
    }

    /// Python with the prelude and the smith-dir names, in the mount root.
    fn py(&self, who: Who, code: &str) -> Run {
        self.py_in(who, "", code)
    }

    fn py_in(&self, who: Who, cwd: &str, code: &str) -> Run {
        let mut full = String::from(PRELUDE);
        for (name, id) in PY_NAMES.iter().zip(TREE) {
            full.push_str(&format!("{name} = {:?}\n", smith_dir(id)));
        }
        full.push_str(code);
        self.cmd(who, cwd, &[python(), "-c", &full])
    }

    #[track_caller]
    fn py_ok(&self, who: Who, code: &str) -> String {
        self.py(who, code)
            .expect_ok(&format!("[{:?}] python as {}", self.mode, name(who)))
    }

    /// `bash -c SCRIPT` in `cwd` (mount-relative) as `who`.
    fn sh_in(&self, who: Who, cwd: &str, script: &str) -> Run {
        self.cmd(who, cwd, &["bash", "-euo", "pipefail", "-c", script])
    }

    #[track_caller]
    fn sh_ok(&self, who: Who, cwd: &str, script: &str) -> String {
        self.sh_in(who, cwd, script).expect_ok(&format!(
            "[{:?}] bash as {}: {script}",
            self.mode,
            name(who)
        ))
    }

    /// Run every `(python expression, expected)` as `who`, in order, in one process; panic
    /// listing every attempt whose outcome (`ok` or the errno's name) differs.
    #[track_caller]
    fn expect(&self, who: Who, cases: &[(&str, &str)]) {
        let mut code = String::from("for c in [\n");
        for (e, _) in cases {
            code.push_str(&format!("    lambda: {e},\n"));
        }
        code.push_str("]:\n    print(E(c), flush=True)\n");
        let out = self.py_ok(who, &code);
        let got: Vec<&str> = out.lines().collect();
        let bad: Vec<String> = cases
            .iter()
            .enumerate()
            .filter_map(|(i, (e, want))| {
                let g = got.get(i).copied().unwrap_or("<missing>");
                (g != *want).then(|| format!("    {e}: got {g}, want {want}"))
            })
            .collect();
        assert!(
            bad.is_empty(),
            "[{:?}] as {}: {} of {} attempts differ:\n{}",
            self.mode,
            name(who),
            bad.len(),
            cases.len(),
            bad.join("\n")
        );
    }

    /// `.smithfs/why` as read by a fresh process of `who`.
    fn why(&self, who: Who) -> String {
        self.cmd(who, "", &["cat", ".smithfs/why"])
            .expect_ok("cat .smithfs/why")
    }

    /// `.smithfs/whoami` as read by a fresh process of `who`.
    fn whoami(&self, who: Who) -> String {
        self.cmd(who, "", &["cat", ".smithfs/whoami"])
            .expect_ok("cat .smithfs/whoami")
    }
}

fn name<'a>(who: Who<'a>) -> &'a str {
    who.unwrap_or("operator")
}

/// The `key: value` line `key` of a `whoami`/`why` text.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(": ")))
}

/// One module per scenario with a test per identity mode; attributes in `cgroup: [..]` and
/// `ancestry: [..]` (e.g. `#[ignore = "bug: …"]`) go on that mode's test only.
macro_rules! both_modes {
    ($name:ident, cgroup: [$(#[$ca:meta])*], ancestry: [$(#[$aa:meta])*], |$mode:ident| $body:block) => {
        mod $name {
            use super::*;
            fn scenario($mode: Mode) $body
            #[test]
            $(#[$ca])*
            fn cgroup() {
                scenario(Mode::Cgroup)
            }
            #[test]
            $(#[$aa])*
            fn ancestry() {
                scenario(Mode::Ancestry)
            }
        }
    };
    ($name:ident, |$mode:ident| $body:block) => {
        both_modes!($name, cgroup: [], ancestry: [], |$mode| $body);
    };
}

// ---------------------------------------------------------------------------------------------
// Identity: whoami in a bound shell
// ---------------------------------------------------------------------------------------------

both_modes!(whoami_in_bound_shell, |mode| {
    let t = Tree::new(mode);
    for id in TREE {
        let level = id.matches('/').count();
        let out = t.sh_ok(Some(id), "", r#"cat "$SMITH_MOUNT/.smithfs/whoami""#);
        assert_eq!(field(&out, "identity"), Some("smith"), "{id}:\n{out}");
        assert_eq!(field(&out, "full id"), Some(id), "{id}:\n{out}");
        assert_eq!(
            field(&out, "level"),
            Some(level.to_string().as_str()),
            "{id}:\n{out}"
        );
        assert_eq!(
            field(&out, "identity mode"),
            Some(mode.arg()),
            "{id}:\n{out}"
        );
        // A grandchild process (bash → bash → cat) is the same smith.
        let nested = t.sh_ok(
            Some(id),
            "",
            r#"bash -c 'bash -c "cat \"\$SMITH_MOUNT/.smithfs/whoami\""'"#,
        );
        assert_eq!(
            field(&nested, "full id"),
            Some(id),
            "{id} nested:\n{nested}"
        );
    }
    let op = t.whoami(OPERATOR);
    assert_eq!(field(&op, "identity"), Some("operator"), "{op}");
});

// ---------------------------------------------------------------------------------------------
// Siblings and cousins: every operation class on private/, outbox/ and the rest
// ---------------------------------------------------------------------------------------------

/// Every attempt of `other` on `X`'s private/, outbox/, inbox/, smith.md and CLAUDE.md, each
/// expected EACCES (the table's "—"); lookup and stat stay allowed.
fn other_smith_cases(x: &str) -> Vec<(String, &'static str)> {
    let mut v: Vec<(String, &'static str)> = Vec::new();
    for area in ["private", "outbox"] {
        let f = format!("{x}+'/{area}/f'");
        let d = format!("{x}+'/{area}'");
        let sub = format!("{x}+'/{area}/sub'");
        v.extend([
            (format!("os.stat({f})"), "ok"),
            (format!("os.stat({d})"), "ok"),
            (format!("rd({f})"), "EACCES"),
            (format!("wr({f})"), "EACCES"),
            (format!("ap({f})"), "EACCES"),
            (format!("rw({f})"), "EACCES"),
            (format!("put({f})"), "EACCES"),
            (format!("rotrunc({f})"), "EACCES"),
            (format!("os.truncate({f}, 0)"), "EACCES"),
            (format!("os.chmod({f}, 0o600)"), "EACCES"),
            (format!("os.chown({f}, 1, 1)"), "EACCES"),
            (format!("os.utime({f})"), "EACCES"),
            (format!("os.utime({f}, (1, 1))"), "EACCES"),
            (format!("setx({f})"), "EACCES"),
            (format!("getx({f})"), "EACCES"),
            (format!("lsx({f})"), "EACCES"),
            (format!("rmx({f})"), "EACCES"),
            (format!("ls({d})"), "EACCES"),
            (format!("os.readlink({x}+'/{area}/lnk')"), "EACCES"),
            (format!("os.lstat({x}+'/{area}/lnk')"), "ok"),
            (format!("os.chmod({d}, 0o700)"), "EACCES"),
            (format!("os.utime({d})"), "EACCES"),
            (format!("setx({d})"), "EACCES"),
            (format!("cr({x}+'/{area}/new')"), "EACCES"),
            (format!("os.mkdir({x}+'/{area}/newdir')"), "EACCES"),
            (format!("os.symlink('f', {x}+'/{area}/newlink')"), "EACCES"),
            (format!("os.mkfifo({x}+'/{area}/newfifo')"), "EACCES"),
            (format!("os.unlink({f})"), "EACCES"),
            (format!("os.rmdir({sub})"), "EACCES"),
            (format!("os.rename({f}, {x}+'/{area}/renamed')"), "EACCES"),
            (format!("os.rename({sub}, {x}+'/{area}/sub2')"), "EACCES"),
        ]);
    }
    v.extend([
        (format!("rd({x}+'/inbox/note.md')"), "EACCES"),
        (format!("ls({x}+'/inbox')"), "EACCES"),
        (format!("rd({x}+'/smith.md')"), "EACCES"),
        (format!("rd({x}+'/CLAUDE.md')"), "EACCES"),
        (format!("wr({x}+'/CLAUDE.md')"), "EACCES"),
        (format!("cr({x}+'/AGENTS.md')"), "EACCES"),
        (format!("ls({x}+'/.claude')"), "EACCES"),
        (format!("rd({x}+'/private/START_HERE.md')"), "EACCES"),
        // The smith dir itself and children/ are readable by every smith.
        (format!("ls({x})"), "ok"),
        (format!("ls({x}+'/children')"), "ok"),
        (format!("os.stat({x}+'/smith.md')"), "ok"),
    ]);
    v
}

#[track_caller]
fn expect_owned(t: &Tree, who: Who, cases: &[(String, &'static str)]) {
    let refs: Vec<(&str, &str)> = cases.iter().map(|(e, w)| (e.as_str(), *w)).collect();
    t.expect(who, &refs);
}

/// Snapshot of `X`'s private/ and outbox/ as the operator sees them (must not change).
fn areas_of(t: &Tree, x: &str) -> Vec<(String, SnapEntry)> {
    let d = smith_dir(x);
    ["private", "outbox", "inbox"]
        .iter()
        .flat_map(|a| {
            let p = t.abs(&format!("{d}/{a}"));
            snapshot(&p)
                .into_iter()
                .map(move |(k, v)| (format!("{a}/{k}"), v))
        })
        .collect()
}

both_modes!(sibling_private_and_outbox, |mode| {
    // Unsandboxed: §3's errnos as the daemon gives them. In the sandbox the kernel answers
    // some of these first — the mode bits (`default_permissions`, §3), Landlock's create rights
    // (§12) — with EACCES, never with success (tests/e2e/sandbox.rs, notes XT19).
    let t = Tree::unsandboxed(mode);
    let before = areas_of(&t, A);
    // B against its sibling A, level 1.
    expect_owned(&t, Some(B), &other_smith_cases("A"));
    // AB against its sibling AA (level 2) and the level-3 cousins against each other.
    expect_owned(&t, Some(AB), &other_smith_cases("AA"));
    expect_owned(&t, Some(AAB), &other_smith_cases("AAA"));
    assert_eq!(areas_of(&t, A), before, "A's areas changed");
    // The owner itself still has every right on its private/ and outbox/.
    t.expect(
        Some(A),
        &[
            ("rd(A+'/private/f')", "ok"),
            ("rotrunc(A+'/private/f')", "ok"),
            ("wr(A+'/private/f')", "ok"),
            ("os.chmod(A+'/private/f', 0o600)", "ok"),
            ("os.utime(A+'/private/f')", "ok"),
            ("setx(A+'/private/f')", "ok"),
            ("getx(A+'/private/f')", "ok"),
            ("rmx(A+'/private/f')", "ok"),
            ("ls(A+'/outbox')", "ok"),
            ("cr(A+'/outbox/new')", "ok"),
            ("os.rename(A+'/outbox/new', A+'/outbox/new2')", "ok"),
            ("os.unlink(A+'/outbox/new2')", "ok"),
            ("os.rmdir(A+'/private/sub')", "ok"),
        ],
    );
});

// ---------------------------------------------------------------------------------------------
// A smith's own read-only parts: inbox, smith.md, config.json, .claude, conversations, children
// ---------------------------------------------------------------------------------------------

both_modes!(own_inbox_smith_md_config, |mode| {
    let t = Tree::new(mode);
    // The parent gives A a config.json and a skill; AB gets none.
    t.write(&format!("{}/config.json", smith_dir(A)), "{}\n");
    t.expect(
        Some(A),
        &[
            // inbox/: read only.
            ("rd(A+'/inbox/note.md')", "ok"),
            ("ls(A+'/inbox')", "ok"),
            ("wr(A+'/inbox/note.md')", "EACCES"),
            ("ap(A+'/inbox/note.md')", "EACCES"),
            ("rotrunc(A+'/inbox/note.md')", "EACCES"),
            ("os.truncate(A+'/inbox/note.md', 0)", "EACCES"),
            ("os.chmod(A+'/inbox/note.md', 0o600)", "EACCES"),
            ("os.utime(A+'/inbox/note.md')", "EACCES"),
            ("setx(A+'/inbox/note.md')", "EACCES"),
            ("cr(A+'/inbox/task-2.md')", "EACCES"),
            ("os.unlink(A+'/inbox/note.md')", "EACCES"),
            (
                "os.rename(A+'/inbox/note.md', A+'/private/note.md')",
                "EACCES",
            ),
            ("os.rename(A+'/private/f', A+'/inbox/task-3.md')", "EACCES"),
            ("os.chmod(A+'/inbox', 0o700)", "EACCES"),
            // smith.md: read only.
            ("rd(A+'/smith.md')", "ok"),
            ("wr(A+'/smith.md')", "EACCES"),
            ("rotrunc(A+'/smith.md')", "EACCES"),
            ("os.truncate(A+'/smith.md', 0)", "EACCES"),
            ("os.chmod(A+'/smith.md', 0o600)", "EACCES"),
            ("os.utime(A+'/smith.md')", "EACCES"),
            // Replacing or removing smith.md is structure: EPERM.
            ("os.unlink(A+'/smith.md')", "EPERM"),
            ("os.rename(A+'/private/f', A+'/smith.md')", "EPERM"),
            // config.json: read only (existing and absent).
            ("rd(A+'/config.json')", "ok"),
            ("wr(A+'/config.json')", "EACCES"),
            ("rotrunc(A+'/config.json')", "EACCES"),
            ("os.unlink(A+'/config.json')", "EACCES"),
            ("os.rename(A+'/private/f', A+'/config.json')", "EACCES"),
            // .claude/: read only.
            ("ls(A+'/.claude/skills')", "ok"),
            ("cr(A+'/.claude/skills/mine.md')", "EACCES"),
            ("os.mkdir(A+'/.claude/skills/mine')", "EACCES"),
            // conversations/: written by smithfs only.
            ("ls(A+'/conversations')", "ok"),
            ("cr(A+'/conversations/fake.log')", "EACCES"),
            ("os.mkdir(A+'/conversations/run-x')", "EACCES"),
            // children/: only the scaffold creates there.
            ("ls(A+'/children')", "ok"),
            ("cr(A+'/children/notes.md')", "EPERM"),
            // The smith dir itself: read only (but other names in it are its own).
            ("ls(A)", "ok"),
            ("os.chmod(A, 0o700)", "EACCES"),
        ],
    );
    t.expect(
        Some(AB),
        &[
            ("cr(AB+'/config.json')", "EACCES"),
            ("put(AB+'/config.json')", "EACCES"),
            ("os.symlink('private/f', AB+'/config.json')", "EACCES"),
        ],
    );
    assert_eq!(
        t.read(&format!("{}/inbox/note.md", smith_dir(A))),
        format!("note for {A}\n")
    );
    assert!(!t.abs(&format!("{}/config.json", smith_dir(AB))).exists());
});

// ---------------------------------------------------------------------------------------------
// Up and down the tree: a parent's outbox, a grandparent and its grandchild
// ---------------------------------------------------------------------------------------------

both_modes!(parent_outbox_and_grandparent, |mode| {
    let t = Tree::new(mode);
    // A child cannot touch its parent's outbox (nor anything private of its parent).
    t.expect(
        Some(AA),
        &[
            ("rd(A+'/outbox/f')", "EACCES"),
            ("ls(A+'/outbox')", "EACCES"),
            ("wr(A+'/outbox/f')", "EACCES"),
            ("cr(A+'/outbox/result.md')", "EACCES"),
            ("put(A+'/outbox/result.md')", "EACCES"),
            ("os.rename(AA+'/private/f', A+'/outbox/result.md')", "EACCES"),
            ("os.unlink(A+'/outbox/f')", "EACCES"),
            ("rd(A+'/private/f')", "EACCES"),
            ("cr(A+'/inbox/task-up.md')", "EACCES"),
            ("wr(A+'/CLAUDE.md')", "EACCES"),
            // Nor its own children's parent-only rights: a sibling's inbox.
            ("cr(AB+'/inbox/task-x.md')", "EACCES"),
            ("wr(AB+'/config.json') if os.path.exists(AB+'/config.json') else cr(AB+'/config.json')", "EACCES"),
        ],
    );
    // A grandparent is "other smiths" for its grandchild: no parent rights skip a level.
    t.expect(
        Some(ROOT),
        &[
            ("ls(AA)", "ok"),
            ("ls(AA+'/children')", "ok"),
            ("rd(AA+'/outbox/f')", "EACCES"),
            ("ls(AA+'/outbox')", "EACCES"),
            ("rd(AA+'/private/f')", "EACCES"),
            ("rd(AA+'/inbox/note.md')", "EACCES"),
            ("cr(AA+'/inbox/task-1.md')", "EACCES"),
            ("cr(AA+'/config.json')", "EACCES"),
            ("cr(AA+'/.claude/skills/x.md')", "EACCES"),
            ("rd(AA+'/smith.md')", "EACCES"),
            ("os.mkdir(AA+'/children/smith-007')", "EACCES"),
            ("rd(AAA+'/outbox/f')", "EACCES"),
            ("cr(AAA+'/inbox/task-1.md')", "EACCES"),
            // … while its own child A is within reach.
            ("rd(A+'/outbox/f')", "ok"),
            ("cr(A+'/inbox/task-1.md')", "ok"),
        ],
    );
    // A level-1 smith reaching its level-3 grandchild, and the level-3 smith reaching up.
    t.expect(
        Some(A),
        &[
            ("rd(AAA+'/outbox/f')", "EACCES"),
            ("wr(AAA+'/inbox/note.md')", "EACCES"),
            ("os.mkdir(AA+'/children/smith-009')", "EACCES"),
        ],
    );
    t.expect(
        Some(AAA),
        &[
            ("rd(AA+'/outbox/f')", "EACCES"),
            ("rd(A+'/outbox/f')", "EACCES"),
            ("rd(ROOT+'/private/f')", "EACCES"),
            ("cr(ROOT+'/outbox/result.md')", "EACCES"),
        ],
    );
});

// ---------------------------------------------------------------------------------------------
// Tricks: symlinks, hard links, O_PATH reopen, threads, orphans, setsid
// ---------------------------------------------------------------------------------------------

both_modes!(symlink_tricks, |mode| {
    let t = Tree::new(mode);
    t.expect(
        Some(A),
        &[
            // Symlinks in A's private/ pointing into B's private/: creating them is A's right …
            ("os.symlink(M+'/'+B+'/private/f', A+'/private/abs')", "ok"),
            (
                "os.symlink('../../smith-002/private/f', A+'/private/rel')",
                "ok",
            ),
            ("os.symlink(M+'/'+B+'/private', A+'/private/dir')", "ok"),
            ("os.readlink(A+'/private/abs')", "ok"),
            // … following them reaches B's inodes, judged as B's.
            ("rd(A+'/private/abs')", "EACCES"),
            ("wr(A+'/private/abs')", "EACCES"),
            ("wr(A+'/private/rel')", "EACCES"),
            ("put(A+'/private/rel')", "EACCES"),
            ("os.truncate(A+'/private/abs', 0)", "EACCES"),
            ("os.chmod(A+'/private/abs', 0o666)", "EACCES"),
            ("ls(A+'/private/dir')", "EACCES"),
            ("cr(A+'/private/dir/planted')", "EACCES"),
            ("os.unlink(A+'/private/dir/f')", "EACCES"),
            // A dangling link to a new name in B's private/: O_CREAT through it is a create there.
            (
                "os.symlink(M+'/'+B+'/private/fresh', A+'/private/dangling')",
                "ok",
            ),
            ("put(A+'/private/dangling')", "EACCES"),
            // Removing the link itself is A's business.
            ("os.unlink(A+'/private/abs')", "ok"),
            // A symlink published in A's outbox pointing at A's private/: the parent may read
            // the link, but not the private file through it.
            ("os.symlink('../private/f', A+'/outbox/peek')", "ok"),
        ],
    );
    t.expect(
        Some(ROOT),
        &[
            ("os.readlink(A+'/outbox/peek')", "ok"),
            ("rd(A+'/outbox/peek')", "EACCES"),
        ],
    );
    assert_eq!(
        t.read(&format!("{}/private/f", smith_dir(B))),
        format!("private of {B}\n")
    );
    assert!(!t.abs(&format!("{}/private/fresh", smith_dir(B))).exists());
    assert!(!t.abs(&format!("{}/private/planted", smith_dir(B))).exists());
});

both_modes!(cwd_and_rename_exchange_tricks, |mode| {
    let t = Tree::new(mode);
    t.expect(
        Some(A),
        &[
            // chdir needs only lookup (and mode bits); what follows is still judged by zone.
            ("os.chdir(M+'/'+B+'/private')", "ok"),
            ("ls('.')", "EACCES"),
            ("rd('f')", "EACCES"),
            ("wr('f')", "EACCES"),
            ("cr('planted')", "EACCES"),
            ("os.chdir(M)", "ok"),
            // renameat2(RENAME_EXCHANGE) needs delete and create on both sides.
            ("exchange(A+'/private/f', B+'/private/f')", "EACCES"),
            ("exchange(A+'/outbox/f', B+'/outbox/f')", "EACCES"),
            ("exchange(A+'/private/f', A+'/inbox/note.md')", "EACCES"),
            ("exchange(A+'/private/f', A+'/smith.md')", "EPERM"),
            ("exchange(A+'/private/f', A+'/outbox/f')", "ok"),
            // A plain rename over a sibling's file, and RENAME_NOREPLACE onto one.
            ("os.rename(A+'/private/f', B+'/outbox/f')", "EACCES"),
            ("noreplace(A+'/private/f', B+'/private/new')", "EACCES"),
            ("noreplace(A+'/private/f', A+'/outbox/fresh')", "ok"),
        ],
    );
    assert_eq!(
        t.read(&format!("{}/outbox/fresh", smith_dir(A))),
        format!("outbox of {A}\n")
    );
    assert_eq!(
        t.read(&format!("{}/private/f", smith_dir(B))),
        format!("private of {B}\n")
    );
});

both_modes!(outside_smiths_and_ctl, |mode| {
    // Unsandboxed: §3's errnos as the daemon gives them. In the sandbox the kernel answers
    // some of these first — the mode bits (`default_permissions`, §3), Landlock's create rights
    // (§12) — with EACCES, never with success (tests/e2e/sandbox.rs, notes XT19).
    let t = Tree::unsandboxed(mode);
    t.expect(
        Some(A),
        &[
            ("rd('config.json')", "ok"),
            ("ls('templates')", "ok"),
            ("ls('agents')", "ok"),
            ("ls('results')", "ok"),
            ("wr('config.json')", "EACCES"),
            ("cr('templates/smith.md')", "EACCES"),
            ("cr('results/final.md')", "EACCES"),
            ("cr('elsewhere')", "EACCES"),
            ("os.mkdir('smiths/smith-x')", "EPERM"),
            ("os.stat('.smithfs-state')", "ENOENT"),
            ("cr('.smithfs/new')", "EPERM"),
            // ctl: `bind` is the operator's; `cancel` is the operator's or an ancestor's.
            ("ctl('bind smith-root/smith-002')", "EACCES"),
            ("ctl('bind smith-root/smith-001')", "EACCES"),
            ("ctl('cancel smith-root/smith-002')", "EACCES"),
            ("ctl('cancel smith-root')", "EACCES"),
            ("ctl('cancel smith-root/smith-001/smith-001')", "ok"),
        ],
    );
    t.expect(
        Some(ROOT),
        &[
            ("cr('results/notes.md')", "ok"),
            ("wr('results/notes.md')", "ok"),
            ("wr('config.json')", "EACCES"),
        ],
    );
    t.expect(
        Some(AA),
        &[("ctl('cancel smith-root/smith-001')", "EACCES")],
    );
    // `smithfs run` from inside a smith cannot re-bind anything (it is for the operator only).
    let inner = t.sh_in(
        Some(A),
        "",
        &format!(
            "{SMITHFS} run --mount \"$SMITH_MOUNT\" --smith {B} -- cat \"$SMITH_MOUNT/.smithfs/whoami\""
        ),
    );
    assert!(!inner.ok(), "a smith re-bound itself: {inner:?}");
    assert!(!inner.stdout.contains(B), "{inner:?}");
    let who = t.whoami(Some(A));
    assert_eq!(field(&who, "full id"), Some(A), "{who}");
});

both_modes!(hard_links_across_zones, |mode| {
    let t = Tree::new(mode);
    t.expect(
        Some(A),
        &[
            // Within one zone (same smith, same area): allowed.
            ("os.link(A+'/private/f', A+'/private/g')", "ok"),
            ("os.link(A+'/private/f', A+'/private/sub/h')", "ok"),
            ("os.link(A+'/CLAUDE.md', A+'/AGENTS.md')", "ok"),
            // Across areas of A's own dir, into a sibling, out of a sibling: EXDEV.
            ("os.link(A+'/private/f', A+'/outbox/f2')", "EXDEV"),
            ("os.link(A+'/outbox/f', A+'/private/f3')", "EXDEV"),
            ("os.link(A+'/private/f', A+'/CLAUDE2.md')", "EXDEV"),
            ("os.link(A+'/inbox/note.md', A+'/private/note.md')", "EXDEV"),
            ("os.link(B+'/private/f', A+'/private/stolen')", "EXDEV"),
            ("os.link(B+'/outbox/f', A+'/outbox/stolen')", "EXDEV"),
            ("os.link(A+'/private/f', AA+'/inbox/task-9.md')", "EXDEV"),
        ],
    );
    // What `ln` and `cp -l` report, and that `cp` (the fallback) works.
    let r = t.sh_in(Some(A), &smith_dir(A), "ln private/f outbox/f4");
    assert!(!r.ok() && r.stderr.contains("cross-device"), "{r:?}");
    t.sh_ok(
        Some(A),
        &smith_dir(A),
        "cp private/f outbox/f4 && cat outbox/f4 >/dev/null",
    );
    // The operator, who has every right on both sides, is held to one zone too.
    t.expect(
        OPERATOR,
        &[
            ("os.link(A+'/private/f', A+'/outbox/op-link')", "EXDEV"),
            ("os.link(A+'/outbox/f', B+'/outbox/op-link')", "EXDEV"),
            ("os.link(A+'/private/f', A+'/private/op-link')", "ok"),
        ],
    );
    t.expect(
        Some(ROOT),
        &[
            (
                "os.link(A+'/outbox/f', ROOT+'/private/from-child')",
                "EXDEV",
            ),
            ("os.link(ROOT+'/private/f', A+'/inbox/task-ln.md')", "EXDEV"),
        ],
    );
    // The sibling's file was not linked anywhere.
    let md = std::fs::metadata(t.abs(&format!("{}/private/f", smith_dir(B)))).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::nlink(&md), 1);
});

both_modes!(opath_proc_fd_reopen, |mode| {
    let t = Tree::new(mode);
    t.expect(
        Some(B),
        &[
            ("_close(os.open(A+'/private/f', os.O_PATH))", "ok"),
            ("opath_reopen(A+'/private/f', os.O_WRONLY)", "EACCES"),
            ("opath_reopen(A+'/private/f', os.O_RDWR)", "EACCES"),
            ("opath_reopen(A+'/private/f', os.O_RDONLY)", "EACCES"),
            (
                "opath_reopen(A+'/private/f', os.O_RDONLY | os.O_TRUNC)",
                "EACCES",
            ),
            (
                "opath_reopen(A+'/outbox/f', os.O_WRONLY | os.O_APPEND)",
                "EACCES",
            ),
            (
                "opath_reopen(A+'/private', os.O_RDONLY | os.O_DIRECTORY)",
                "EACCES",
            ),
            // Its own files reopen fine.
            ("opath_reopen(B+'/private/f', os.O_RDWR)", "ok"),
            ("opath_reopen(B+'/inbox/note.md', os.O_RDONLY)", "ok"),
            ("opath_reopen(B+'/inbox/note.md', os.O_WRONLY)", "EACCES"),
        ],
    );
    // And through the shell's /dev/fd: `exec {fd}<` on an O_PATH-like open is not possible in
    // bash, but `cat /proc/self/fd/N` after a plain read-open is the same path for the owner.
    assert_eq!(
        t.sh_ok(
            Some(A),
            "",
            &format!("exec 3<{}/private/f; cat /proc/self/fd/3", smith_dir(A))
        ),
        format!("private of {A}\n")
    );
    assert_eq!(
        t.read(&format!("{}/private/f", smith_dir(A))),
        format!("private of {A}\n")
    );
});

both_modes!(denied_from_second_thread, |mode| {
    let t = Tree::new(mode);
    t.expect(
        Some(A),
        &[
            ("in_thread(lambda: wr(B+'/private/f'))", "EACCES"),
            ("in_thread(lambda: rd(B+'/outbox/f'))", "EACCES"),
            ("in_thread(lambda: cr(A+'/inbox/task-t.md'))", "EACCES"),
            ("in_thread(lambda: put(A+'/private/from-thread'))", "ok"),
            (
                "in_thread(lambda: in_thread(lambda: wr(B+'/private/f')))",
                "EACCES",
            ),
        ],
    );
    // The last denial (a thread's) is explained to A's next process.
    let why = t.why(Some(A));
    assert_eq!(field(&why, "identity"), Some(A), "{why}");
    assert!(
        field(&why, "path").is_some_and(|p| p.ends_with("smith-002/private/f")),
        "{why}"
    );
    assert_eq!(field(&why, "errno"), Some("EACCES"), "{why}");
    assert_eq!(
        t.read(&format!("{}/private/f", smith_dir(B))),
        format!("private of {B}\n")
    );
});

both_modes!(double_forked_orphan, |mode| {
    // Unsandboxed: in the sandbox an orphan ends with its run's pid namespace (§12).
    let t = Tree::unsandboxed(mode);
    // The command forks, the child forks again and exits: the grandchild is an orphan. It waits
    // until it has been re-parented and the command itself is gone, then acts and reports into
    // A's private/ (tmp + rename, so a reader sees all or nothing).
    t.py_ok(
        Some(A),
        r#"
top = os.getpid()
pid = os.fork()
if pid == 0:
    mid = os.getpid()
    if os.fork() > 0:
        os._exit(0)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2): os.dup2(null, fd)
    deadline = time.time() + 15
    while (os.getppid() == mid or alive(top)) and time.time() < deadline:
        time.sleep(0.01)
    lines = ["reparented %s" % (os.getppid() != mid), "top gone %s" % (not alive(top))]
    lines.append("sibling write " + E(lambda: wr(B+'/private/f')))
    lines.append("sibling read " + E(lambda: rd(B+'/outbox/f')))
    lines.append("own inbox " + E(lambda: cr(A+'/inbox/task-o.md')))
    lines.append("own private " + E(lambda: put(A+'/private/orphan-own')))
    lines.append(get(".smithfs/whoami"))
    put(A+'/private/.orphan.tmp', "\n".join(lines))
    os.rename(A+'/private/.orphan.tmp', A+'/private/orphan.txt')
    os._exit(0)
os.waitpid(pid, 0)
"#,
    );
    let report = t.abs(&format!("{}/private/orphan.txt", smith_dir(A)));
    poll_until(Duration::from_secs(20), "the orphan's report", || {
        report.exists()
    });
    let rep = std::fs::read_to_string(&report).unwrap();
    for want in [
        "reparented True",
        "top gone True",
        "sibling write EACCES",
        "sibling read EACCES",
        "own inbox EACCES",
        "own private ok",
        "identity: smith",
    ] {
        assert!(rep.lines().any(|l| l == want), "no {want:?} in:\n{rep}");
    }
    assert_eq!(field(&rep, "full id"), Some(A), "{rep}");
    assert_eq!(
        t.read(&format!("{}/private/f", smith_dir(B))),
        format!("private of {B}\n")
    );
});

both_modes!(setsid_background_writer, |mode| {
    // Unsandboxed: in the sandbox the writer ends with its run's pid namespace (§12).
    let t = Tree::unsandboxed(mode);
    // `bash` starts a `setsid` writer in the background and exits at once; the writer waits for
    // that bash to be gone, then records whoami and tries the sibling's private file.
    let script = r#"
outer=$$
setsid bash -c '
  while [ -e /proc/'"$outer"' ] && ! grep -q "^State:[[:space:]]*[ZX]" /proc/'"$outer"'/status 2>/dev/null; do sleep 0.02; done
  read -r -a st < /proc/$$/stat
  { echo "sid ${st[5]} pid $$"
    cat "$SMITH_MOUNT/.smithfs/whoami"
    if echo pwned > ../smith-002/private/f 2>/dev/null; then echo "sibling write: ok"; else echo "sibling write: denied"; fi
    if echo mine > private/bg-own 2>/dev/null; then echo "own write: ok"; else echo "own write: denied"; fi
  } > private/.bg.tmp
  mv private/.bg.tmp private/bg-whoami.txt
' </dev/null >/dev/null 2>&1 &
echo "started $!"
"#;
    let out = t.sh_ok(Some(A), &smith_dir(A), script);
    assert!(out.starts_with("started "), "{out}");
    let report = t.abs(&format!("{}/private/bg-whoami.txt", smith_dir(A)));
    poll_until(
        Duration::from_secs(20),
        "the setsid writer's report",
        || report.exists(),
    );
    let rep = std::fs::read_to_string(&report).unwrap();
    assert_eq!(field(&rep, "identity"), Some("smith"), "{rep}");
    assert_eq!(field(&rep, "full id"), Some(A), "{rep}");
    assert!(rep.lines().any(|l| l == "sibling write: denied"), "{rep}");
    assert!(rep.lines().any(|l| l == "own write: ok"), "{rep}");
    // It really was a session leader of its own.
    let first = rep.lines().next().unwrap_or("");
    let w: Vec<&str> = first.split_whitespace().collect();
    assert!(
        w.len() == 4 && w[1] == w[3],
        "not a session leader: {first}"
    );
    assert_eq!(
        t.read(&format!("{}/private/f", smith_dir(B))),
        format!("private of {B}\n")
    );
    // Its denial is A's, not the operator's.
    assert!(
        field(&t.why(Some(A)), "path").is_some_and(|p| p.ends_with("smith-002/private/f")),
        "{}",
        t.why(Some(A))
    );
    assert!(
        t.why(OPERATOR).starts_with("no denial recorded"),
        "{}",
        t.why(OPERATOR)
    );
});

// ---------------------------------------------------------------------------------------------
// Structure: areas and smith dirs, device nodes
// ---------------------------------------------------------------------------------------------

both_modes!(structure_is_smithfs_only, |mode| {
    let t = Tree::new(mode);
    // `me` is the caller's Python name: the source of the replacing rename is its own.
    let structure = |x: &str, me: &str| -> Vec<(String, &'static str)> {
        vec![
            (format!("os.rmdir({x}+'/conversations')"), "EPERM"),
            (format!("os.rmdir({x}+'/outbox')"), "EPERM"),
            (format!("os.rmdir({x}+'/inbox')"), "EPERM"),
            (format!("os.rmdir({x}+'/private')"), "EPERM"),
            (format!("os.rmdir({x}+'/.claude')"), "EPERM"),
            (format!("os.rmdir({x}+'/children')"), "EPERM"),
            (format!("os.rename({x}+'/outbox', {x}+'/outbox2')"), "EPERM"),
            (
                format!("os.rename({x}+'/private', {x}+'/outbox/private')"),
                "EPERM",
            ),
            (
                format!("os.rename({x}+'/inbox', {x}+'/private/inbox')"),
                "EPERM",
            ),
            (
                format!("os.rename({me}+'/private/sub', {x}+'/outbox')"),
                "EPERM",
            ),
            (format!("os.unlink({x}+'/smith.md')"), "EPERM"),
            (
                format!("os.rename({x}+'/smith.md', {x}+'/smith2.md')"),
                "EPERM",
            ),
            (format!("os.rmdir({x})"), "EPERM"),
            (format!("os.rename({x}, {x}+'-moved')"), "EPERM"),
            (
                format!("os.rename({x}, ROOT+'/private/moved-smith')"),
                "EPERM",
            ),
        ]
    };
    // A on its own structure, A on its child's, B on its sibling's, ROOT on a grandchild's.
    expect_owned(&t, Some(A), &structure("A", "A"));
    expect_owned(&t, Some(A), &structure("AA", "A"));
    expect_owned(&t, Some(B), &structure("A", "B"));
    expect_owned(&t, Some(ROOT), &structure("AAA", "ROOT"));
    // A smith dir cannot be made by renaming a directory into children/ either.
    t.expect(
        Some(A),
        &[
            (
                "os.rename(A+'/private/sub', A+'/children/smith-010')",
                "EPERM",
            ),
            (
                "os.rename(A+'/children/smith-001', A+'/private/stolen')",
                "EPERM",
            ),
        ],
    );
    for id in TREE {
        let d = smith_dir(id);
        for area in [
            "inbox",
            "private",
            "outbox",
            "conversations",
            "children",
            ".claude",
        ] {
            assert!(t.abs(&format!("{d}/{area}")).is_dir(), "{d}/{area} gone");
        }
        assert!(
            t.abs(&format!("{d}/smith.md")).is_file(),
            "{d}/smith.md gone"
        );
    }
});

both_modes!(device_nodes_fifos_sockets, |mode| {
    // Unsandboxed: §3's errnos as the daemon gives them. In the sandbox the kernel answers
    // some of these first — the mode bits (`default_permissions`, §3), Landlock's create rights
    // (§12) — with EACCES, never with success (tests/e2e/sandbox.rs, notes XT19).
    let t = Tree::unsandboxed(mode);
    t.expect(
        Some(A),
        &[
            ("chardev(A+'/private/null')", "EPERM"),
            ("blockdev(A+'/private/loop')", "EPERM"),
            ("chardev(A+'/outbox/null')", "EPERM"),
            ("chardev(B+'/private/null')", "EPERM"),
            ("chardev(A+'/inbox/null')", "EPERM"),
            // FIFOs and sockets: wherever A may create.
            ("os.mkfifo(A+'/private/fifo')", "ok"),
            ("sock(A+'/private/sock')", "ok"),
            ("os.mkfifo(A+'/outbox/fifo')", "ok"),
            ("os.mkfifo(A+'/inbox/fifo')", "EACCES"),
            ("sock(A+'/inbox/sock')", "EACCES"),
            ("os.mkfifo(B+'/private/fifo')", "EACCES"),
            // RENAME_WHITEOUT leaves a character device (0, 0) at the source.
            ("put(A+'/private/wo', 'x')", "ok"),
            ("whiteout(A+'/private/wo', A+'/private/wo2')", "EPERM"),
        ],
    );
    // The operator may make device nodes; the mount is nodev, so they cannot be opened.
    t.expect(
        OPERATOR,
        &[
            ("chardev(A+'/private/opnull')", "ok"),
            ("wr(A+'/private/opnull')", "EACCES"),
        ],
    );
    // coreutils mknod as a smith.
    let r = t.sh_in(Some(A), &smith_dir(A), "mknod private/zero c 1 5");
    assert!(
        !r.ok() && r.stderr.contains("Operation not permitted"),
        "{r:?}"
    );
});

// ---------------------------------------------------------------------------------------------
// The scaffold's checks (§4)
// ---------------------------------------------------------------------------------------------

both_modes!(sixth_child_is_edquot, |mode| {
    let t = Tree::new(mode);
    // `mkdir -p children/NAME/inbox` works: the scaffold made inbox/ before mkdir returned.
    t.sh_ok(
        Some(B),
        &smith_dir(B),
        "mkdir -p children/smith-001/inbox && test -f children/smith-001/smith.md",
    );
    t.expect(
        Some(B),
        &[
            ("os.mkdir(B+'/children/smith-002')", "ok"),
            ("os.mkdir(B+'/children/smith-004')", "ok"),
            ("os.mkdir(B+'/children/smith-005')", "ok"),
            ("os.mkdir(B+'/children/smith-009')", "ok"),
            ("os.mkdir(B+'/children/smith-010')", "EDQUOT"),
            ("os.mkdir(B+'/children/smith-011')", "EDQUOT"),
        ],
    );
    t.expect(
        OPERATOR,
        &[
            ("os.mkdir(B+'/children/smith-012')", "EDQUOT"),
            // A bad or non-increasing name is EINVAL even when full (§4: step 3 before 4).
            ("os.mkdir(B+'/children/smith-003')", "EINVAL"),
            ("os.mkdir(B+'/children/nope')", "EINVAL"),
        ],
    );
    t.expect(Some(B), &[("os.mkdir(B+'/children/smith-013')", "EDQUOT")]);
    let why = t.why(Some(B));
    assert_eq!(field(&why, "errno"), Some("EDQUOT"), "{why}");
    assert_eq!(
        t.sh_ok(OPERATOR, &smith_dir(B), "ls children | tr '\\n' ' '"),
        "smith-001 smith-002 smith-004 smith-005 smith-009 "
    );
});

both_modes!(seven_concurrent_mkdirs, |mode| {
    let t = Tree::new(mode);
    // Seven processes of B, released together, each mkdir a child; a worker that gets EINVAL
    // (its number is no longer greater than every used one) tries a larger number, as an agent
    // would; EDQUOT ends it. Exactly five succeed, whatever the interleaving.
    let out = t.py_ok(
        Some(B),
        r#"
N = 7
r, w = os.pipe()
kids = []
for i in range(N):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        n, tries = i + 1, []
        while True:
            c = E(lambda: os.mkdir(B + "/children/smith-%03d" % n))
            tries.append(c)
            if c == "EINVAL":
                n += N
                continue
            break
        os.write(1, ("%d %s\n" % (i, ",".join(tries))).encode())
        os._exit(0)
    kids.append(pid)
os.close(r); os.close(w)
for p in kids: os.waitpid(p, 0)
"#,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 7, "{out}");
    let finals: Vec<&str> = lines
        .iter()
        .map(|l| l.rsplit([',', ' ']).next().unwrap())
        .collect();
    assert_eq!(finals.iter().filter(|f| **f == "ok").count(), 5, "{out}");
    assert_eq!(
        finals.iter().filter(|f| **f == "EDQUOT").count(),
        2,
        "{out}"
    );
    for l in &lines {
        let tries = l.split_once(' ').unwrap().1;
        assert!(
            tries
                .split(',')
                .all(|c| ["ok", "EINVAL", "EDQUOT"].contains(&c)),
            "{out}"
        );
    }
    let children = t.abs(&format!("{}/children", smith_dir(B)));
    let names: Vec<String> = std::fs::read_dir(&children)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 5, "{names:?}");
    for n in &names {
        let d = children.join(n);
        for area in [
            "inbox",
            "private",
            "outbox",
            "children",
            "conversations",
            ".claude/skills",
        ] {
            assert!(d.join(area).is_dir(), "{n}/{area} missing");
        }
        assert!(d.join("smith.md").is_file(), "{n}/smith.md missing");
        assert!(
            d.join("private/START_HERE.md").is_file(),
            "{n}/START_HERE.md missing"
        );
        let id = format!("{B}/{n}");
        let who = t.whoami(Some(&id));
        assert_eq!(field(&who, "level"), Some("2"), "{who}");
    }
});

both_modes!(level3_smith_has_no_children, |mode| {
    let t = Tree::new(mode);
    t.expect(
        Some(AAA),
        &[("os.mkdir(AAA+'/children/smith-001')", "EPERM")],
    );
    let why = t.why(Some(AAA));
    assert_eq!(field(&why, "errno"), Some("EPERM"), "{why}");
    assert_eq!(field(&why, "rule"), Some("scaffold-max-level"), "{why}");
    t.expect(
        OPERATOR,
        &[("os.mkdir(AAB+'/children/smith-001')", "EPERM")],
    );
    // Order of §4's checks: EACCES (not S) before EPERM (depth) before EINVAL (name).
    t.expect(
        Some(B),
        &[("os.mkdir(AAA+'/children/smith-001')", "EACCES")],
    );
    t.expect(
        Some(AAA),
        &[
            ("os.mkdir(AAA+'/children/bad-name')", "EPERM"),
            ("os.mkdir(AAA+'/children/smith-000')", "EPERM"),
        ],
    );
    // `mkdir -p` from coreutils says so too.
    let r = t.sh_in(
        Some(AAA),
        &smith_dir(AAA),
        "mkdir -p children/smith-002/inbox",
    );
    assert!(
        !r.ok() && r.stderr.contains("Operation not permitted"),
        "{r:?}"
    );
    assert_eq!(
        std::fs::read_dir(t.abs(&format!("{}/children", smith_dir(AAA))))
            .unwrap()
            .count(),
        0
    );
});

both_modes!(child_names_and_increasing_numbers, |mode| {
    let mut t = Tree::new(mode);
    t.expect(
        Some(B),
        &[
            ("os.mkdir(B+'/children/foo')", "EINVAL"),
            ("os.mkdir(B+'/children/smith-01')", "EINVAL"),
            ("os.mkdir(B+'/children/smith-abc')", "EINVAL"),
            ("os.mkdir(B+'/children/Smith-001')", "EINVAL"),
            ("os.mkdir(B+'/children/smith-003')", "ok"),
            ("os.mkdir(B+'/children/smith-003')", "EEXIST"),
            ("os.mkdir(B+'/children/smith-002')", "EINVAL"),
        ],
    );
    let why = t.why(Some(B));
    assert!(
        why.contains("smith-004"),
        "why does not name the next id:\n{why}"
    );
    assert_eq!(field(&why, "errno"), Some("EINVAL"), "{why}");
    // Gaps are allowed; after smith-010, smith-004 is refused and smith-011 is next.
    t.expect(
        Some(B),
        &[
            ("os.mkdir(B+'/children/smith-010')", "ok"),
            ("os.mkdir(B+'/children/smith-004')", "EINVAL"),
        ],
    );
    assert!(t.why(Some(B)).contains("smith-011"), "{}", t.why(Some(B)));
    // Only B or the operator make B's children: a sibling, B's own child and a grandparent
    // may not (EACCES before any other check).
    t.expect(Some(A), &[("os.mkdir(B+'/children/smith-020')", "EACCES")]);
    t.expect(
        Some(ROOT),
        &[("os.mkdir(AA+'/children/smith-020')", "EACCES")],
    );
    t.expect(Some(AA), &[("os.mkdir(A+'/children/smith-020')", "EACCES")]);
    // The numbers used are remembered across a restart, even when the child is gone.
    t.m.remount();
    t.expect(
        Some(B),
        &[
            ("os.mkdir(B+'/children/smith-005')", "EINVAL"),
            ("os.mkdir(B+'/children/smith-011')", "ok"),
        ],
    );
    // The operator on B's behalf follows the same numbering.
    t.expect(
        OPERATOR,
        &[
            ("os.mkdir(B+'/children/smith-011')", "EEXIST"),
            ("os.mkdir(B+'/children/smith-006')", "EINVAL"),
            ("os.mkdir(B+'/children/smith-012')", "ok"),
        ],
    );
    assert!(t.why(OPERATOR).contains("smith-012") || t.why(OPERATOR).contains("smith-013"));
});

// ---------------------------------------------------------------------------------------------
// The operator moves idle smith dirs (docs/SPEC.md §3 structure bullet, docs/PROTOCOL-NOTES.md
// C35)
// ---------------------------------------------------------------------------------------------

/// `smithfs run --smith FULL_ID -- true` fails: no such smith any more.
#[track_caller]
fn assert_unknown_smith(t: &Tree, full_id: &str) {
    let r = t.cmd(Some(full_id), "", &["true"]);
    assert!(
        !r.ok() && r.stderr.contains("no such smith"),
        "[{:?}] {full_id} should be unknown: {r:?}",
        t.mode
    );
}

/// The full ids in `.smithfs/status.json`.
fn status_ids(t: &Tree) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(&t.read(".smithfs/status.json")).unwrap();
    v["smiths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["full_id"].as_str().unwrap().to_string())
        .collect()
}

/// The smith cgroups under the daemon's `smithfs-PID` cgroup (`smith-root.smith-001` …);
/// empty in ancestry mode.
fn smith_cgroups(t: &Tree) -> Vec<String> {
    let Some(pid) = t.m.daemon_pid() else {
        return Vec::new();
    };
    daemon_cgroup_names(pid)
        .into_iter()
        .filter(|n| n.starts_with("smith-root"))
        .collect()
}

both_modes!(operator_moves_a_smith_dir_out_of_the_tree, |mode| {
    let mut t = Tree::new(mode);
    // B (smith-root/smith-002) goes into the root's private/: it is data from now on.
    t.expect(OPERATOR, &[("os.rename(B, ROOT+'/private/old-b')", "ok")]);
    assert!(!t.abs(&smith_dir(B)).exists());
    assert_unknown_smith(&t, B);
    if mode == Mode::Cgroup {
        // The identity resolver was told, as for rmdir: B's cgroup is gone (it was empty).
        let cgroups = smith_cgroups(&t);
        assert!(
            cgroups.contains(&"smith-root.smith-001".to_string()),
            "{cgroups:?}"
        );
        assert!(
            !cgroups.contains(&"smith-root.smith-002".to_string()),
            "{cgroups:?}"
        );
    }
    assert!(
        !status_ids(&t).contains(&B.to_string()),
        "{:?}",
        status_ids(&t)
    );
    // Its files are readable in the new place, by the operator and by the zone's owner (the
    // root: everything below private/old-b is the root's private/**), by nobody else.
    assert_eq!(
        t.read("smiths/smith-root/private/old-b/private/f"),
        format!("private of {B}\n")
    );
    t.expect(
        Some(ROOT),
        &[
            ("get(ROOT+'/private/old-b/outbox/f')", "ok"),
            ("put(ROOT+'/private/old-b/inbox/note.md', 'mine now')", "ok"),
            ("os.mkdir(ROOT+'/private/old-b/children/smith-009')", "ok"),
            (
                "os.rename(ROOT+'/private/old-b/smith.md', ROOT+'/private/old-b/smith.txt')",
                "ok",
            ),
        ],
    );
    t.expect(
        Some(A),
        &[
            ("rd(ROOT+'/private/old-b/private/f')", "EACCES"),
            ("ls(ROOT+'/private/old-b')", "EACCES"),
        ],
    );
    // The root's next child still numbers above every number it used (smith-002 included),
    // after a restart too.
    t.expect(
        OPERATOR,
        &[
            ("os.mkdir(ROOT+'/children/smith-002')", "EINVAL"),
            ("os.mkdir(ROOT+'/children/smith-003')", "ok"),
        ],
    );
    t.m.remount();
    assert_unknown_smith(&t, B);
    t.expect(
        Some(ROOT),
        &[
            ("os.mkdir(ROOT+'/children/smith-002')", "EINVAL"),
            ("os.mkdir(ROOT+'/children/smith-004')", "ok"),
            ("get(ROOT+'/private/old-b/private/f')", "ok"),
        ],
    );
    // A whole subtree goes the same way, into results/ this time: AA and its two children.
    t.expect(OPERATOR, &[("os.rename(AA, 'results/old-aa')", "ok")]);
    for id in [AA, AAA, AAB] {
        assert_unknown_smith(&t, id);
    }
    assert_eq!(
        t.read("results/old-aa/children/smith-001/private/f"),
        format!("private of {AAA}\n")
    );
    t.expect(
        Some(ROOT),
        &[
            // results/** is written and created by the root, never deleted by it.
            (
                "put('results/old-aa/children/smith-002/outbox/f', 'x')",
                "ok",
            ),
            ("os.unlink('results/old-aa/CLAUDE.md')", "EACCES"),
        ],
    );
    t.expect(Some(A), &[("os.mkdir(A+'/children/smith-001')", "EINVAL")]);
});

both_modes!(operator_moves_a_smith_dir_into_children, |mode| {
    let t = Tree::new(mode);
    // AA (level 2, with AAA and AAB below) becomes the root's child smith-010: level 1, and its
    // children level 2, under new full ids.
    const NEW: &str = "smith-root/smith-010";
    const NEW_A: &str = "smith-root/smith-010/smith-001";
    t.expect(
        OPERATOR,
        &[("os.rename(AA, ROOT+'/children/smith-010')", "ok")],
    );
    for id in [AA, AAA, AAB] {
        assert_unknown_smith(&t, id);
    }
    if mode == Mode::Cgroup {
        let cgroups = smith_cgroups(&t);
        for (gone, made) in [
            ("smith-root.smith-001.smith-001", "smith-root.smith-010"),
            (
                "smith-root.smith-001.smith-001.smith-001",
                "smith-root.smith-010.smith-001",
            ),
            (
                "smith-root.smith-001.smith-001.smith-002",
                "smith-root.smith-010.smith-002",
            ),
        ] {
            assert!(!cgroups.contains(&gone.to_string()), "{gone}: {cgroups:?}");
            assert!(cgroups.contains(&made.to_string()), "{made}: {cgroups:?}");
        }
    }
    let out = t.sh_ok(
        Some(NEW),
        "",
        r#"echo x > "$SMITH_DIR/private/f2" && cat "$SMITH_DIR/private/f" "$SMITH_MOUNT/.smithfs/whoami""#,
    );
    assert!(out.starts_with(&format!("private of {AA}\n")), "{out}");
    assert_eq!(field(&out, "full id"), Some(NEW), "{out}");
    assert_eq!(field(&out, "level"), Some("1"), "{out}");
    assert_eq!(t.read(&format!("{}/private/f2", smith_dir(NEW))), "x\n");
    let out = t.sh_ok(
        Some(NEW_A),
        "",
        r#"echo y > "$SMITH_DIR/private/g" && cat "$SMITH_MOUNT/.smithfs/whoami""#,
    );
    assert_eq!(field(&out, "level"), Some("2"), "{out}");
    assert_eq!(field(&out, "parent"), Some(NEW), "{out}");
    let ids = status_ids(&t);
    for id in [NEW, NEW_A, "smith-root/smith-010/smith-002"] {
        assert!(ids.contains(&id.to_string()), "{id} not in {ids:?}");
    }
    // The new parent writes its inbox; the old parent no longer may, nor a sibling its private/.
    t.expect(
        Some(ROOT),
        &[(
            "put(ROOT+'/children/smith-010/inbox/task-1.md', 'hi')",
            "ok",
        )],
    );
    t.expect(
        Some(A),
        &[
            (
                "put(ROOT+'/children/smith-010/inbox/task-2.md', 'hi')",
                "EACCES",
            ),
            ("rd(ROOT+'/children/smith-010/outbox/f')", "EACCES"),
        ],
    );
    t.expect(
        Some(NEW_A),
        &[("rd(ROOT+'/children/smith-010/private/f')", "EACCES")],
    );
    // The moved smith's own children still number above the ones it used (smith-002).
    t.expect(
        Some(NEW),
        &[
            (
                "os.mkdir(ROOT+'/children/smith-010/children/smith-000')",
                "EINVAL",
            ),
            (
                "os.mkdir(ROOT+'/children/smith-010/children/smith-003')",
                "ok",
            ),
        ],
    );
    // Renumbering within one children/: AB (smith-root/smith-001/smith-002) → smith-005.
    t.expect(
        OPERATOR,
        &[("os.rename(AB, A+'/children/smith-005')", "ok")],
    );
    assert_unknown_smith(&t, AB);
    t.sh_ok(
        Some("smith-root/smith-001/smith-005"),
        "",
        r#"echo z > "$SMITH_DIR/outbox/r""#,
    );
    // A's next child numbers above smith-005, the root's above smith-010.
    t.expect(
        OPERATOR,
        &[
            ("os.mkdir(A+'/children/smith-004')", "EINVAL"),
            ("os.mkdir(ROOT+'/children/smith-009')", "EINVAL"),
            ("os.mkdir(ROOT+'/children/smith-011')", "ok"),
        ],
    );
});

both_modes!(
    moving_a_smith_dir_into_children_is_checked_like_mkdir,
    |mode| {
        let t = Tree::new(mode);
        // Names: smith-NNN above every number the destination used (the root used 1 and 2).
        t.expect(
            OPERATOR,
            &[
                ("os.rename(AB, ROOT+'/children/smith-002x')", "EINVAL"),
                ("os.rename(AB, ROOT+'/children/foo')", "EINVAL"),
                ("os.rename(AB, ROOT+'/children/smith-01')", "EINVAL"),
                ("os.rename(AB, ROOT+'/children/Smith-003')", "EINVAL"),
                ("os.rename(AAA, A+'/children/smith-000')", "EINVAL"),
            ],
        );
        let why = t.why(OPERATOR);
        assert_eq!(field(&why, "rule"), Some("scaffold-child-name"), "{why}");
        assert!(why.contains("smith-003"), "why names the next id:\n{why}");
        // Replacing a smith dir, exchanging one, moving the root: EPERM.
        t.expect(
            OPERATOR,
            &[
                ("os.rename(AAB, A+'/children/smith-002')", "EPERM"),
                ("exchange(AB, B)", "EPERM"),
                ("exchange(AB, A+'/private/sub')", "EPERM"),
                ("exchange(A+'/private/sub', AB)", "EPERM"),
                ("os.rename(ROOT, 'results/root')", "EPERM"),
                ("os.rename(ROOT, 'smiths/smith-root2')", "EPERM"),
            ],
        );
        assert_eq!(
            field(&t.why(OPERATOR), "rule"),
            Some("structure-root-smith")
        );
        // Depth: AA brings a level below it; under AB (level 2) it would reach level 4.
        t.expect(
            OPERATOR,
            &[("os.rename(AA, AB+'/children/smith-001')", "EPERM")],
        );
        assert_eq!(field(&t.why(OPERATOR), "rule"), Some("scaffold-max-level"));
        // Nowhere the operator may not create: directly in smiths/, below a name in children/,
        // conversations/.
        t.expect(
            OPERATOR,
            &[
                ("os.rename(AB, 'smiths/ab')", "EPERM"),
                ("os.rename(AB, AA+'/conversations/ab')", "EACCES"),
            ],
        );
        // Count: the root has 2 children, at most 5; a move within one children/ does not count
        // the mover twice.
        for n in ["smith-003", "smith-004", "smith-005"] {
            std::fs::create_dir(t.abs(&format!("{}/children/{n}", smith_dir(ROOT)))).unwrap();
        }
        t.expect(
            OPERATOR,
            &[
                ("os.rename(AB, ROOT+'/children/smith-006')", "EDQUOT"),
                (
                    "os.rename(ROOT+'/children/smith-005', ROOT+'/children/smith-009')",
                    "ok",
                ),
            ],
        );
        // Everything refused left the tree as it was.
        for id in [A, B, AA, AB, AAA, AAB] {
            t.sh_ok(Some(id), "", r#"test -d "$SMITH_DIR/private""#);
        }
    }
);

both_modes!(only_the_operator_moves_smith_dirs, |mode| {
    let t = Tree::new(mode);
    // The owner, its parent, the root and a sibling: EPERM, into a children/ with a valid name
    // or into a private/ (the caller's own, but for the owner, which cannot move into itself).
    for (who, me) in [(AB, "A"), (A, "A"), (ROOT, "ROOT"), (AA, "AA")] {
        t.expect(
            Some(who),
            &[
                ("os.rename(AB, A+'/children/smith-009')", "EPERM"),
                ("os.rename(AB, ROOT+'/children/smith-009')", "EPERM"),
                (&format!("os.rename(AB, {me}+'/private/ab')"), "EPERM"),
            ],
        );
        let why = t.why(Some(who));
        assert_eq!(field(&why, "rule"), Some("structure-smithfs-only"), "{why}");
    }
    t.sh_ok(Some(AB), "", r#"test -d "$SMITH_DIR/private""#);
    assert!(t.abs(&format!("{}/smith.md", smith_dir(AB))).is_file());
});

// ---------------------------------------------------------------------------------------------
// The legitimate paths
// ---------------------------------------------------------------------------------------------

both_modes!(atomic_publish, |mode| {
    let t = Tree::new(mode);
    let d = smith_dir(A);
    t.sh_ok(
        Some(A),
        &d,
        "printf 'the answer\\n' > private/result.md.tmp && mv private/result.md.tmp outbox/result.md",
    );
    assert_eq!(t.read(&format!("{d}/outbox/result.md")), "the answer\n");
    // The parent reads it, a sibling cannot; the child may replace it atomically again.
    t.expect(Some(ROOT), &[("rd(A+'/outbox/result.md')", "ok")]);
    t.expect(Some(B), &[("rd(A+'/outbox/result.md')", "EACCES")]);
    t.expect(
        Some(A),
        &[
            ("put(A+'/private/r2', 'v2')", "ok"),
            ("os.rename(A+'/private/r2', A+'/outbox/result.md')", "ok"),
            ("os.rename(A+'/outbox/f', A+'/private/f-back')", "ok"),
        ],
    );
    assert_eq!(t.read(&format!("{d}/outbox/result.md")), "v2");
    assert_eq!(
        t.sh_ok(Some(ROOT), "", &format!("cat {d}/outbox/result.md")),
        "v2"
    );
});

both_modes!(parent_moves_task_into_child_inbox, |mode| {
    let t = Tree::new(mode);
    let (r, a) = (smith_dir(ROOT), smith_dir(A));
    t.sh_ok(
        Some(ROOT),
        &r,
        "printf 'do it\\n' > private/task-smith-001.md && mv private/task-smith-001.md children/smith-001/inbox/task-smith-001.md",
    );
    assert_eq!(t.read(&format!("{a}/inbox/task-smith-001.md")), "do it\n");
    assert!(!t.abs(&format!("{r}/private/task-smith-001.md")).exists());
    t.expect(
        Some(A),
        &[
            ("rd(A+'/inbox/task-smith-001.md')", "ok"),
            ("os.unlink(A+'/inbox/task-smith-001.md')", "EACCES"),
            ("wr(A+'/inbox/task-smith-001.md')", "EACCES"),
        ],
    );
    t.expect(Some(B), &[("rd(A+'/inbox/task-smith-001.md')", "EACCES")]);
    // The parent may also write, replace and remove in the child's inbox directly.
    t.expect(
        Some(ROOT),
        &[
            ("put(A+'/inbox/task-smith-001-2.md', 'more')", "ok"),
            ("wr(A+'/inbox/note.md')", "ok"),
            ("os.unlink(A+'/inbox/note.md')", "ok"),
            // … but not move the task back out of the child's inbox into its own outbox? It may:
            // delete in the child's inbox, create in its own private/.
            (
                "os.rename(A+'/inbox/task-smith-001-2.md', ROOT+'/private/back.md')",
                "ok",
            ),
        ],
    );
});

both_modes!(directory_moved_to_outbox_and_back, |mode| {
    let t = Tree::new(mode);
    t.expect(
        Some(A),
        &[
            ("os.makedirs(A+'/private/report/deep')", "ok"),
            ("put(A+'/private/report/deep/data.txt', 'data')", "ok"),
            ("rd(A+'/private/report/deep/data.txt')", "ok"),
        ],
    );
    t.expect(
        Some(ROOT),
        &[
            ("rd(A+'/private/report/deep/data.txt')", "EACCES"),
            ("ls(A+'/private/report')", "EACCES"),
        ],
    );
    t.expect(
        Some(A),
        &[("os.rename(A+'/private/report', A+'/outbox/report')", "ok")],
    );
    t.expect(
        Some(ROOT),
        &[
            ("ls(A+'/outbox/report')", "ok"),
            ("ls(A+'/outbox/report/deep')", "ok"),
            ("rd(A+'/outbox/report/deep/data.txt')", "ok"),
            ("wr(A+'/outbox/report/deep/data.txt')", "EACCES"),
            ("cr(A+'/outbox/report/deep/extra')", "EACCES"),
        ],
    );
    t.expect(
        Some(B),
        &[("rd(A+'/outbox/report/deep/data.txt')", "EACCES")],
    );
    // Moved back: unreadable to the parent again, also by a process that read it before.
    t.expect(
        Some(ROOT),
        &[(
            "_close(os.open(A+'/outbox/report/deep/data.txt', os.O_RDONLY))",
            "ok",
        )],
    );
    t.expect(
        Some(A),
        &[("os.rename(A+'/outbox/report', A+'/private/report')", "ok")],
    );
    t.expect(
        Some(ROOT),
        &[
            ("rd(A+'/private/report/deep/data.txt')", "EACCES"),
            ("ls(A+'/private/report/deep')", "EACCES"),
            ("rd(A+'/outbox/report/deep/data.txt')", "ENOENT"),
        ],
    );
    // The owner still has every right inside it.
    t.expect(
        Some(A),
        &[
            ("wr(A+'/private/report/deep/data.txt')", "ok"),
            ("os.unlink(A+'/private/report/deep/data.txt')", "ok"),
        ],
    );
});

both_modes!(agent_cli_files_in_smith_dir, |mode| {
    // Smiths run here as root (`smithfs run` by this root test): without the sandbox, so that
    // the tree is root's too and git's ownership check passes. With it, runs are the agents'
    // uid and the tree theirs (tests/mount/sandbox_tree.rs).
    let t = Tree::unsandboxed(mode);
    let d = smith_dir(A);
    // What an agent CLI started with cwd = its smith dir writes there.
    t.sh_ok(
        Some(A),
        &d,
        "echo '# memory' > CLAUDE.md && echo x >> CLAUDE.md && printf 'model: x\\n' > .aider.conf.yml \
         && mkdir -p .cache/tool && echo 1 > .cache/tool/state && rm .cache/tool/state",
    );
    t.sh_ok(
        Some(A),
        &d,
        "git init -q . && git -c user.name=smith -c user.email=s@x add CLAUDE.md \
         && git -c user.name=smith -c user.email=s@x commit -q -m memory && git log --oneline | wc -l",
    );
    assert!(t.abs(&format!("{d}/.git/HEAD")).is_file());
    assert_eq!(t.sh_ok(Some(A), &d, "git log --format=%s"), "memory\n");
    // Those files are the smith's own: neither the parent nor a sibling reads them.
    t.expect(
        Some(ROOT),
        &[
            ("rd(A+'/CLAUDE.md')", "EACCES"),
            ("rd(A+'/.git/HEAD')", "EACCES"),
            ("wr(A+'/.aider.conf.yml')", "EACCES"),
        ],
    );
    t.expect(
        Some(B),
        &[
            ("rd(A+'/.git/HEAD')", "EACCES"),
            ("ls(A+'/.git')", "EACCES"),
            ("cr(A+'/.git/hooks/post-commit')", "EACCES"),
        ],
    );
});

both_modes!(git_commit_in_private, |mode| {
    let t = Tree::new(mode);
    let d = format!("{}/private", smith_dir(A));
    let out = t.sh_ok(
        Some(A),
        &d,
        "mkdir repo && cd repo && git init -q && echo hello > a.txt && mkdir src && echo 'fn main(){}' > src/main.rs \
         && git add -A && git -c user.name=smith -c user.email=s@x commit -q -m first \
         && echo more >> a.txt && git -c user.name=smith -c user.email=s@x commit -qam second \
         && git gc -q && git log --format=%s && git status --porcelain | wc -l",
    );
    assert_eq!(out, "second\nfirst\n0\n");
    t.expect(Some(ROOT), &[("rd(A+'/private/repo/.git/HEAD')", "EACCES")]);
});

both_modes!(parent_reads_result_writes_config, |mode| {
    let t = Tree::new(mode);
    t.sh_ok(
        Some(A),
        &smith_dir(A),
        "echo done > private/r && mv private/r outbox/result.md",
    );
    t.expect(
        Some(ROOT),
        &[
            ("rd(A+'/outbox/result.md')", "ok"),
            ("ls(A+'/outbox')", "ok"),
            ("rd(A+'/smith.md')", "ok"),
            ("ls(A+'/conversations')", "ok"),
            ("cr(A+'/config.json', b'{}')", "ok"),
            (
                "put(A+'/config.json', '{\"agent\": {\"timeout_secs\": 60}}')",
                "ok",
            ),
            ("os.chmod(A+'/config.json', 0o644)", "ok"),
            ("os.makedirs(A+'/.claude/skills/extra')", "ok"),
            ("put(A+'/.claude/skills/extra/SKILL.md', 'skill')", "ok"),
            ("put(A+'/private/f')", "EACCES"),
            ("wr(A+'/outbox/result.md')", "EACCES"),
            ("rotrunc(A+'/outbox/result.md')", "EACCES"),
            ("os.truncate(A+'/outbox/result.md', 0)", "EACCES"),
            ("os.unlink(A+'/outbox/result.md')", "EACCES"),
            (
                "os.rename(A+'/outbox/result.md', ROOT+'/private/taken.md')",
                "EACCES",
            ),
            ("wr(A+'/smith.md')", "EACCES"),
            ("cr(A+'/conversations/x')", "EACCES"),
        ],
    );
    t.expect(
        Some(A),
        &[
            ("rd(A+'/config.json')", "ok"),
            ("rd(A+'/.claude/skills/extra/SKILL.md')", "ok"),
        ],
    );
    assert_eq!(
        t.read(&format!("{}/config.json", smith_dir(A))),
        "{\"agent\": {\"timeout_secs\": 60}}"
    );
});

// ---------------------------------------------------------------------------------------------
// Area directories themselves, other names, the operator's limits, private "children"
// ---------------------------------------------------------------------------------------------

both_modes!(area_dirs_and_other_names, |mode| {
    let t = Tree::new(mode);
    // An area directory is listed under its area's read right and changed under its write right.
    t.expect(
        Some(A),
        &[
            ("os.chmod(A+'/private', 0o755)", "ok"),
            ("os.utime(A+'/outbox')", "ok"),
            ("setx(A+'/outbox')", "ok"),
            ("os.utime(A+'/inbox')", "EACCES"),
            ("setx(A+'/inbox')", "EACCES"),
            ("os.utime(A+'/.claude')", "EACCES"),
            ("cr(A+'/NOTES.md')", "ok"),
            ("os.mkdir(A+'/.aider.cache')", "ok"),
        ],
    );
    t.expect(
        Some(ROOT),
        &[
            ("os.chmod(A+'/inbox', 0o755)", "ok"),
            ("os.utime(A+'/.claude')", "ok"),
            ("ls(A+'/outbox')", "ok"),
            ("getx(A+'/outbox')", "ok"),
            ("getx(A+'/outbox/f')", "ENODATA"),
            ("lsx(A+'/outbox/f')", "ok"),
            ("os.utime(A+'/outbox')", "EACCES"),
            ("setx(A+'/outbox/f')", "EACCES"),
            ("os.chmod(A+'/private', 0o777)", "EACCES"),
            ("ls(A+'/private')", "EACCES"),
            // Other names directly in a child's dir are the child's alone.
            ("rd(A+'/NOTES.md')", "EACCES"),
            ("cr(A+'/PARENT.md')", "EACCES"),
            ("ls(A+'/.aider.cache')", "EACCES"),
            ("os.unlink(A+'/NOTES.md')", "EACCES"),
        ],
    );
    // The operator: all on private/ and outbox/, read on conversations/, structure is smithfs's.
    t.expect(
        OPERATOR,
        &[
            ("wr(A+'/private/f')", "ok"),
            ("put(A+'/outbox/op')", "ok"),
            ("wr(A+'/smith.md', get(A+'/smith.md').encode())", "ok"),
            ("ls(A+'/conversations')", "ok"),
            ("cr(A+'/conversations/x.log')", "EACCES"),
            ("os.mkdir(A+'/conversations/run-1')", "EACCES"),
            ("os.mkdir(A+'/extra-area')", "ok"),
            ("os.rename(A+'/private/sub', A+'/inbox')", "EPERM"),
            ("os.mkdir('smiths/smith-other')", "EPERM"),
        ],
    );
});

both_modes!(children_named_dirs_in_private_are_data, |mode| {
    let t = Tree::new(mode);
    // A directory is a smith dir because smithfs made it in children/, never because of its name.
    t.sh_ok(
        Some(A),
        &smith_dir(A),
        "mkdir -p private/children/smith-009/inbox private/children/smith-009/private \
         && echo mine > private/children/smith-009/private/f && mv private/children outbox/children",
    );
    let r = t.cmd(Some(&format!("{A}/smith-009")), "", &["true"]);
    assert!(!r.ok(), "a name-only smith dir was bindable: {r:?}");
    t.expect(
        Some(ROOT),
        &[
            ("rd(A+'/outbox/children/smith-009/private/f')", "ok"),
            (
                "cr(A+'/outbox/children/smith-009/inbox/task-1.md')",
                "EACCES",
            ),
        ],
    );
    t.expect(
        Some(A),
        &[
            ("os.rmdir(A+'/outbox/children/smith-009/inbox')", "ok"),
            (
                "os.rename(A+'/outbox/children/smith-009', A+'/outbox/children/x')",
                "ok",
            ),
        ],
    );
});

both_modes!(o_creat_on_an_existing_file_is_an_open, |mode| {
    let mut t = Tree::new(mode);
    // After a remount nothing is in the kernel's dentry cache, so `open(O_CREAT)` on an
    // existing name reaches the daemon as FUSE_CREATE: it is still an open of that file.
    t.m.remount();
    t.expect(
        Some(A),
        &[
            (
                "_close(os.open(A+'/inbox/note.md', os.O_RDONLY | os.O_CREAT, 0o644))",
                "ok",
            ),
            (
                "_close(os.open(A+'/smith.md', os.O_RDONLY | os.O_CREAT, 0o644))",
                "ok",
            ),
            (
                "_close(os.open(B+'/outbox/f', os.O_RDONLY | os.O_CREAT, 0o644))",
                "EACCES",
            ),
            (
                "_close(os.open(B+'/private/f', os.O_WRONLY | os.O_CREAT, 0o644))",
                "EACCES",
            ),
            (
                "_close(os.open(A+'/config.json', os.O_RDONLY | os.O_CREAT, 0o644))",
                "EACCES",
            ),
        ],
    );
    t.expect(
        Some(ROOT),
        &[(
            "_close(os.open(A+'/outbox/f', os.O_RDONLY | os.O_CREAT, 0o644))",
            "ok",
        )],
    );
    assert!(!t.abs(&format!("{}/config.json", smith_dir(A))).exists());
});

// ---------------------------------------------------------------------------------------------
// Handles (§2): judged by their opener; setattr through an fd by the caller
// ---------------------------------------------------------------------------------------------

both_modes!(handles_carry_opener_rights, |mode| {
    // Unsandboxed: the descriptor comes over a unix socket in a host directory, which a
    // sandboxed run's view does not show (§12).
    let sock_dir = tempfile::tempdir().expect("tempdir");
    let t = Tree::unsandboxed(mode);
    let g = format!("{}/private/g", smith_dir(B));
    t.write(&g, "B secret\n");
    // The operator opens B's file and hands the descriptor to a process of A over a unix socket
    // (SCM_RIGHTS; `smithfs run` passes on no descriptor but 0–2, H14), which makes it fd 3.
    let code = format!(
        "{PRELUDE}\n_c = socket.socket(socket.AF_UNIX)\n_c.connect(sys.argv[1])\n\
         _m, _fds, _f, _a = socket.recv_fds(_c, 1, 1)\nos.dup2(_fds[0], 3)\n\
         for c in [lambda: os.write(3, b'via handle\\n'), lambda: os.ftruncate(3, 3), \
         lambda: os.fchmod(3, 0o600), lambda: os.utime(3), lambda: os.setxattr(3, 'user.q', b'1'), \
         lambda: os.fchown(3, 1, 1), lambda: rd('{g}'), lambda: wr('{g}')]:\n    print(E(c))\n"
    );
    let sock = sock_dir.path().join("s");
    let operator = "import os, socket, subprocess, sys\n\
         g, sock, smithfs, who, py, code = sys.argv[1:]\n\
         fd = os.open(g, os.O_WRONLY | os.O_APPEND)\n\
         s = socket.socket(socket.AF_UNIX)\ns.bind(sock)\ns.listen(1)\n\
         p = subprocess.Popen([smithfs, 'run', '--mount', '.', '--smith', who, '--', py, '-c', code, sock])\n\
         c, _ = s.accept()\nsocket.send_fds(c, [b'x'], [fd])\nc.close()\nos.close(fd)\n\
         sys.exit(p.wait())\n";
    let r = run(Command::new(python())
        .args(["-c", operator, &g])
        .arg(&sock)
        .args([SMITHFS, A, python(), &code])
        .current_dir(t.m.path()));
    let out = r.expect_ok("handle passed to A");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["ok", "ok", "EACCES", "EACCES", "EACCES", "EACCES", "EACCES", "EACCES"],
        "write, ftruncate | fchmod, futimens, fsetxattr, fchown | open by path"
    );
    assert_eq!(t.read(&g), "B s");
    let md = std::fs::metadata(t.abs(&g)).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o777,
        0o644
    );
});

both_modes!(dirfd_follows_a_moved_subtree, |mode| {
    let t = Tree::new(mode);
    t.sh_ok(
        Some(A),
        &smith_dir(A),
        "mkdir -p outbox/rep/deep && echo data > outbox/rep/deep/x",
    );
    // The parent holds descriptors on the published directory while the child moves it back
    // to private/: lookups below the held directory are then judged by the new zone.
    let code = format!(
        "{PRELUDE}\nd = os.open(sys.argv[1], os.O_PATH)\n\
         def at(p): _close(os.open(p, os.O_RDONLY, dir_fd=d))\n\
         print(E(lambda: at('deep/x')), E(lambda: at('deep')), flush=True)\n\
         sys.stdin.readline()\n\
         print(E(lambda: at('deep/x')), E(lambda: at('deep')), E(lambda: os.stat('deep/x', dir_fd=d)), \
         E(lambda: _close(os.open('/proc/self/fd/%d' % d, os.O_RDONLY))), flush=True)\n"
    );
    let mut child = Command::new(SMITHFS)
        .args([
            "run",
            "--mount",
            ".",
            "--smith",
            ROOT,
            "--",
            python(),
            "-c",
            &code,
        ])
        .arg(format!("{}/outbox/rep", smith_dir(A)))
        .current_dir(t.m.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the parent's process");
    use std::io::{BufRead, Write};
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ok ok\n", "before the move");
    t.sh_ok(Some(A), &smith_dir(A), "mv outbox/rep private/rep");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(
        line, "EACCES EACCES ok EACCES\n",
        "after the move to private/"
    );
});

// ---------------------------------------------------------------------------------------------
// Odd callers: a descendant pid namespace, a thread whose leader has exited
// ---------------------------------------------------------------------------------------------

both_modes!(pid_namespace_and_zombie_leader, |mode| {
    // `unshare -U` by a root-run smith maps root: the tree must be root's, so without the
    // sandbox (whose runs are the agents' uid, and the tree theirs).
    let t = Tree::unsandboxed(mode);
    // `unshare -Urp`: callers in a descendant pid namespace are resolved normally (§2). In a
    // user namespace of its own, as unprivileged sandboxes do: a confined smith has no
    // CAP_SYS_ADMIN for a bare `unshare -p` (docs/PROTOCOL-NOTES.md H13).
    let out = t.sh_ok(
        Some(A),
        "",
        &format!(
            "unshare -Urpf bash -c 'echo \"ns pid $$\"; grep \"^full id\" \"$SMITH_MOUNT/.smithfs/whoami\"; \
             (echo x > {b}/private/f) 2>/dev/null && echo sibling ok || echo sibling denied; \
             echo y > {a}/private/ns && echo own ok'",
            a = smith_dir(A),
            b = smith_dir(B)
        ),
    );
    assert_eq!(
        out,
        format!("ns pid 1\nfull id: {A}\nsibling denied\nown ok\n")
    );
    // A thread that outlives its thread-group leader (a zombie) is still the smith.
    t.py_ok(
        Some(A),
        r#"
libc = ctypes.CDLL(None, use_errno=True)
def body():
    while alive(os.getpid()):
        time.sleep(0.01)
    res = ["own " + E(lambda: put(A + "/private/zl")), "sibling " + E(lambda: wr(B + "/private/f"))]
    res.append(get(".smithfs/whoami"))
    put(A + "/private/.zl.tmp", "\n".join(res))
    os.rename(A + "/private/.zl.tmp", A + "/private/zombie-leader.txt")
    os._exit(0)
threading.Thread(target=body).start()
libc.syscall(60, 0)  # SYS_exit: only the main thread exits
"#,
    );
    let report = t.abs(&format!("{}/private/zombie-leader.txt", smith_dir(A)));
    poll_until(Duration::from_secs(20), "the thread's report", || {
        report.exists()
    });
    let rep = std::fs::read_to_string(&report).unwrap();
    assert!(rep.starts_with("own ok\nsibling EACCES\n"), "{rep}");
    assert_eq!(field(&rep, "full id"), Some(A), "{rep}");
});

// ---------------------------------------------------------------------------------------------
// An inode with names in several zones (made outside the mount) gets the intersection
// ---------------------------------------------------------------------------------------------

both_modes!(multi_zone_inode_gets_intersection, |mode| {
    let mut t = Tree::new(mode);
    t.m.umount();
    let d = t.m.path().join(smith_dir(A));
    std::fs::write(d.join("outbox/both"), "two names\n").unwrap();
    std::fs::hard_link(d.join("outbox/both"), d.join("private/both")).unwrap();
    // Two names in one zone (outbox/ and outbox/sub/), and two in one directory.
    std::fs::write(d.join("outbox/pair"), "published twice\n").unwrap();
    std::fs::hard_link(d.join("outbox/pair"), d.join("outbox/pair2")).unwrap();
    std::fs::write(d.join("outbox/deep"), "published deeper\n").unwrap();
    std::fs::hard_link(d.join("outbox/deep"), d.join("outbox/sub/deep")).unwrap();
    t.m.mount();
    // Nobody has looked up private/both yet: the daemon sees a file with more links than names
    // and fails closed, so the parent reads it neither now nor after the private name is seen
    // (then by the intersection of outbox/ (parent: read) and private/ (parent: none)).
    t.expect(
        Some(ROOT),
        &[
            ("os.stat(A+'/outbox/both')", "ok"),
            ("rd(A+'/outbox/both')", "EACCES"),
        ],
    );
    let why = t.why(Some(ROOT));
    assert!(why.contains("rule: links-unseen"), "{why}");
    // The owner keeps its rights on both names; a sibling has none.
    t.expect(
        Some(A),
        &[
            ("rd(A+'/outbox/both')", "ok"),
            ("rd(A+'/private/both')", "ok"),
            ("ls(A+'/private')", "ok"),
        ],
    );
    t.expect(Some(B), &[("rd(A+'/outbox/both')", "EACCES")]);
    t.expect(
        Some(ROOT),
        &[
            ("rd(A+'/outbox/both')", "EACCES"),
            ("os.stat(A+'/private/both')", "ok"),
            ("rd(A+'/outbox/both')", "EACCES"),
        ],
    );
    // A second name in the same directory is found by looking there: the parent reads it. One
    // in another directory of the same zone is unseen until looked up, then its rights apply.
    t.expect(
        Some(ROOT),
        &[
            ("rd(A+'/outbox/pair')", "ok"),
            ("rd(A+'/outbox/pair2')", "ok"),
            ("rd(A+'/outbox/deep')", "EACCES"),
            ("os.stat(A+'/outbox/sub/deep')", "ok"),
            ("rd(A+'/outbox/deep')", "ok"),
        ],
    );
    // The operator keeps every right.
    assert_eq!(
        t.read(&format!("{}/outbox/both", smith_dir(A))),
        "two names\n"
    );
});

// ---------------------------------------------------------------------------------------------
// `.smithfs/why`
// ---------------------------------------------------------------------------------------------

both_modes!(why_explains_denial_to_next_process, |mode| {
    // uid 4242 is the agents' user, so an Operator besides root (docs/SPEC.md §2, §12).
    let t = Tree::with_sandbox(mode, &[], Some(serde_json::json!({"uid": 4242})));
    assert!(
        t.why(Some(A)).starts_with("no denial recorded"),
        "{}",
        t.why(Some(A))
    );
    let r = t.sh_in(Some(A), "", &format!("echo x > {}/private/f", smith_dir(B)));
    assert!(!r.ok() && r.stderr.contains("Permission denied"), "{r:?}");
    let why = t.why(Some(A));
    let first = why.lines().next().unwrap_or("");
    assert!(
        !first.contains(": ") || first.len() > 20,
        "one sentence first:\n{why}"
    );
    assert_eq!(field(&why, "identity"), Some(A), "{why}");
    assert_eq!(field(&why, "errno"), Some("EACCES"), "{why}");
    assert_eq!(field(&why, "rule"), Some("private-owner-only"), "{why}");
    assert!(
        field(&why, "path")
            .is_some_and(|p| p.ends_with("smiths/smith-root/children/smith-002/private/f")),
        "{why}"
    );
    for k in ["pid", "time", "operation", "alternative"] {
        assert!(
            field(&why, k).is_some_and(|v| !v.is_empty()),
            "no {k}:\n{why}"
        );
    }
    // Per identity: B and the operator have their own (empty) records.
    assert!(
        t.why(Some(B)).starts_with("no denial recorded"),
        "{}",
        t.why(Some(B))
    );
    assert!(
        t.why(OPERATOR).starts_with("no denial recorded"),
        "{}",
        t.why(OPERATOR)
    );
    // The operator's record is per uid: root's denial is not shown to uid 4242.
    t.expect(OPERATOR, &[("cr(A+'/conversations/forged.log')", "EACCES")]);
    let root_why = t.why(OPERATOR);
    assert!(
        field(&root_why, "path").is_some_and(|p| p.ends_with("conversations/forged.log")),
        "{root_why}"
    );
    let other = sh_as(4242, 4242, t.m.path(), "cat .smithfs/why").expect_ok("why as uid 4242");
    assert!(other.starts_with("no denial recorded"), "{other}");
    // A smith reads the journal and the status too (§7).
    t.expect(
        Some(B),
        &[
            ("rd('.smithfs/status.json')", "ok"),
            ("rd('.smithfs/events.jsonl')", "ok"),
        ],
    );
    // The journal has it too.
    let ev = t.read(".smithfs/events.jsonl");
    assert!(
        ev.lines().any(|l| l.contains("\"access.denied\"")
            && l.contains(A)
            && l.contains("smith-002/private/f")),
        "{ev}"
    );
});

// ---------------------------------------------------------------------------------------------
// Operator in read-only mode
// ---------------------------------------------------------------------------------------------

both_modes!(operator_read_only, |mode| {
    let t = Tree::with(mode, &["--operator", "read-only"]);
    let who = t.whoami(OPERATOR);
    assert_eq!(field(&who, "operator mode"), Some("read-only"), "{who}");
    // The root smith makes its own child and files (a smith is unaffected by the mode).
    t.expect(
        Some(ROOT),
        &[
            ("os.mkdir(ROOT+'/children/smith-001')", "ok"),
            ("put(ROOT+'/private/f', 'root private')", "ok"),
            ("put(ROOT+'/outbox/f', 'root outbox')", "ok"),
            ("put(A+'/inbox/task-1.md', 'child task')", "ok"),
        ],
    );
    t.expect(
        OPERATOR,
        &[
            // Reading everything is fine.
            ("rd(ROOT+'/private/f')", "ok"),
            ("rd(ROOT+'/outbox/f')", "ok"),
            ("rd(A+'/inbox/task-1.md')", "ok"),
            ("rd('config.json')", "ok"),
            ("ls(ROOT+'/private')", "ok"),
            // Writable: the root's inbox, config.json.
            ("put(ROOT+'/inbox/task-op.md', 'from the operator')", "ok"),
            (
                "os.rename(ROOT+'/inbox/task-op.md', ROOT+'/inbox/task-op2.md')",
                "ok",
            ),
            ("os.unlink(ROOT+'/inbox/task-op2.md')", "ok"),
            ("wr('config.json', get('config.json').encode())", "ok"),
            // Everything else: EACCES.
            ("wr(ROOT+'/private/f')", "EACCES"),
            ("cr(ROOT+'/private/new')", "EACCES"),
            ("os.unlink(ROOT+'/private/f')", "EACCES"),
            ("wr(ROOT+'/outbox/f')", "EACCES"),
            ("rotrunc(ROOT+'/outbox/f')", "EACCES"),
            ("os.chmod(ROOT+'/outbox/f', 0o600)", "EACCES"),
            ("wr(ROOT+'/smith.md')", "EACCES"),
            ("cr(ROOT+'/config.json')", "EACCES"),
            ("put(A+'/inbox/task-2.md')", "EACCES"),
            ("wr(A+'/inbox/task-1.md')", "EACCES"),
            ("cr(ROOT+'/CLAUDE.md')", "EACCES"),
            ("cr('templates/smith.md')", "EACCES"),
            ("cr('results/final.md')", "EACCES"),
            ("cr('new-top-level')", "EACCES"),
            ("os.mkdir(ROOT+'/children/smith-002')", "EACCES"),
            ("os.mkdir(A+'/children/smith-001')", "EACCES"),
            ("os.rename(A, ROOT+'/children/smith-005')", "EACCES"),
            ("os.rename(A, ROOT+'/private/a')", "EACCES"),
        ],
    );
    // `.smithfs/ctl` stays writable: `smithfs run` binds through it.
    let out = t.whoami(Some(A));
    assert_eq!(field(&out, "full id"), Some(A), "{out}");
    let why = t.why(OPERATOR);
    assert_eq!(field(&why, "rule"), Some("operator-read-only"), "{why}");
});

// ---------------------------------------------------------------------------------------------
// Root agents cannot leave their smith (docs/PROTOCOL-NOTES.md H13, F-iso-1/F-iso-2)
// ---------------------------------------------------------------------------------------------

/// The escape attempts (tests/fixtures/escapes.sh): each prints `ESCAPED: …` if it succeeds.
const ESCAPES: &str = include_str!("../fixtures/escapes.sh");

both_modes!(root_agents_cannot_leave_their_smith, |mode| {
    let t = Tree::new(mode);
    let daemon = t.m.daemon_pid().expect("daemon pid");
    let script = format!("DAEMON={daemon}\n{ESCAPES}");
    let out = t.sh_ok(Some(A), &smith_dir(A), &script);
    assert!(
        !out.contains("ESCAPED") && !out.contains("MISSING"),
        "[{mode:?}] a root smith left its smith:\n{out}"
    );
    assert_eq!(field(&out, "full id"), Some(A), "[{mode:?}]\n{out}");
    // CAP_SYS_ADMIN (bit 21) and CAP_SYS_PTRACE (bit 19) are gone from the effective set.
    let eff = field(&out, "CapEff")
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .expect("CapEff line");
    assert_eq!(eff & ((1 << 21) | (1 << 19)), 0, "{out}");
    // The sibling's and the parent's private files stay closed, and the smith's own open.
    t.expect(
        Some(A),
        &[
            ("get(B+'/private/f')", "EACCES"),
            ("get(ROOT+'/private/f')", "EACCES"),
            ("wr(A+'/private/f')", "ok"),
        ],
    );
});

// ---------------------------------------------------------------------------------------------
// Through a remote mount (docs/SPEC.md §13, docs/PROTOCOL-NOTES.md R30): a `loopback` run's
// attempts answer exactly as the same attempts of a local `smithfs run`
// ---------------------------------------------------------------------------------------------

/// The battery a remote and a local run of `A` both run (`python3 battery.py TAG`, in the
/// mount root): every attempt of [`other_smith_cases`] on its sibling `B` and its parent `ROOT`,
/// and what a smith does in its own areas (names suffixed with `TAG`, so that the two runs do
/// not meet); one outcome per line, then `WHO <full id>` and `DEV <the mount's st_dev>`.
fn remote_battery() -> (String, Vec<(String, &'static str)>) {
    let mut cases = other_smith_cases("B");
    cases.extend(other_smith_cases("ROOT"));
    let own: Vec<(String, &'static str)> = [
        "rd(A+'/private/f')",
        "ls(A+'/private')",
        "cr(A+'/private/n'+T)",
        "put(A+'/outbox/o'+T)",
        "get(A+'/outbox/o'+T)",
        "os.mkdir(A+'/private/d'+T)",
        "os.chmod(A+'/private/d'+T, 0o700)",
        "os.rename(A+'/private/n'+T, A+'/outbox/n'+T)",
        "os.rename(A+'/outbox/n'+T, A+'/private/n'+T)",
        "os.symlink('f', A+'/private/s'+T)",
        "os.readlink(A+'/private/s'+T)",
        "os.unlink(A+'/private/s'+T)",
        "os.link(A+'/private/n'+T, A+'/private/h'+T)",
        "os.truncate(A+'/private/h'+T, 0)",
        "setx(A+'/private/n'+T)",
        "getx(A+'/private/n'+T)",
        "rmx(A+'/private/n'+T)",
        "os.mkfifo(A+'/private/p'+T)",
        "chardev(A+'/private/c'+T)",
        "blockdev(A+'/private/b'+T)",
        "exchange(A+'/private/n'+T, A+'/private/h'+T)",
        "noreplace(A+'/private/n'+T, A+'/private/h'+T)",
        "os.rmdir(A+'/private/d'+T)",
        "rd('.smithfs/whoami')",
        "cr(A+'/inbox/task-9'+T)",
        "cr(A+'/smith.md.'+T)",
    ]
    .iter()
    .map(|c| (c.to_string(), "?"))
    .collect();
    cases.extend(own);
    let mut code =
        String::from("import os, sys\nos.chdir(os.environ['SMITH_MOUNT'])\nT = sys.argv[1]\n");
    code.push_str(PRELUDE);
    for (name, id) in PY_NAMES.iter().zip(TREE) {
        code.push_str(&format!("{name} = {:?}\n", smith_dir(id)));
    }
    code.push_str("for c in [\n");
    for (e, _) in &cases {
        code.push_str(&format!("    lambda: {e},\n"));
    }
    code.push_str("]:\n    print(E(c), flush=True)\n");
    code.push_str(
        "w = get('.smithfs/whoami')\nprint('WHO ' + w.split('full id: ')[1].split('\\n')[0])\n",
    );
    code.push_str("print('DEV %d' % os.stat('.').st_dev)\n");
    (code, cases)
}

/// A loopback run of `A` (its agent `attach`'s command, through the run's own remote mount) — or,
/// with `cluster`, a Slurm job of that cluster (`attach` on its node) — and a local `smithfs run
/// --smith A` run the same battery ([`remote_battery`]) on one tree, the §12 sandbox on or off
/// (`sandboxed`): every outcome is the same errno, nothing of the sibling changed, no attempt on
/// another smith's area got through where the table says EACCES, the remote run is `A` and
/// worked on another device (its own mount).
fn remote_runs_meet_the_same_rules(
    mode: Mode,
    sandboxed: bool,
    cluster: Option<&crate::slurm_cluster::Cluster>,
) {
    let mut t = if sandboxed {
        Tree::new(mode)
    } else {
        Tree::unsandboxed(mode)
    };
    let (code, cases) = remote_battery();
    t.write("agents/battery.py", &code);
    let py = python();
    t.m.umount();
    let cfg_path = t.m.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).expect("config.json"))
            .expect("config.json is JSON");
    cfg["launcher"] = match cluster {
        None => serde_json::json!({"kind": "loopback"}),
        Some(c) => {
            let conf: &'static str =
                Box::leak(c.conf().to_string_lossy().into_owned().into_boxed_str());
            t.m.set_env(vec![("SLURM_CONF", conf)]);
            serde_json::json!({"kind": "slurm", "listen": "127.0.0.1:0"})
        }
    };
    cfg["agent"]["command"] = serde_json::json!([py, "{mount}/agents/battery.py", "R"]);
    cfg["agent"]["retries"] = serde_json::json!(0);
    std::fs::write(&cfg_path, cfg.to_string()).expect("config.json");
    t.m.mount();
    let before = areas_of(&t, B);
    let battery = t.abs("agents/battery.py");
    let local = t
        .cmd(Some(A), "", &[py, battery.to_str().expect("utf-8"), "L"])
        .expect_ok(&format!("[{mode:?}] the battery as A, locally"));
    t.write(&format!("{}/inbox/task-1.md", smith_dir(A)), "battery\n");
    let (remote, meta) = ended_run(&t.m, &smith_dir(A), 1, 90);
    assert!(
        meta["error"].is_null() && meta["exit_code"] == 0,
        "[{mode:?}] {meta}\n{remote}"
    );
    assert_eq!(
        meta["job_id"].is_string(),
        cluster.is_some(),
        "[{mode:?}] a Slurm job exactly when a cluster is given: {meta}"
    );
    let lines = |s: &str| -> Vec<String> { s.lines().map(str::to_owned).collect() };
    let (l, r) = (lines(&local), lines(&remote));
    assert_eq!(
        r.len(),
        cases.len() + 2,
        "[{mode:?}] remote:\n{remote}\nlocal:\n{local}"
    );
    let differ: Vec<String> = cases
        .iter()
        .enumerate()
        .filter(|(i, _)| l.get(*i) != r.get(*i))
        .map(|(i, (e, _))| format!("    {e}: local {:?}, remote {:?}", l.get(i), r.get(i)))
        .collect();
    assert!(
        differ.is_empty(),
        "[{mode:?}, sandboxed {sandboxed}] {} of {} attempts answer differently through the remote mount:\n{}",
        differ.len(),
        cases.len(),
        differ.join("\n")
    );
    let escaped: Vec<&String> = cases
        .iter()
        .zip(&r)
        .filter(|((_, want), got)| *want == "EACCES" && got.as_str() == "ok")
        .map(|((e, _), _)| e)
        .collect();
    assert!(
        escaped.is_empty(),
        "[{mode:?}] got through remotely: {escaped:?}"
    );
    assert_eq!(r[cases.len()], format!("WHO {A}"), "[{mode:?}]");
    assert_ne!(
        r[cases.len() + 1],
        l[cases.len() + 1],
        "[{mode:?}] the remote run worked on the daemon's own mount"
    );
    assert_eq!(
        areas_of(&t, B),
        before,
        "[{mode:?}] the sibling's areas changed"
    );
    let own: Vec<String> = cases
        .iter()
        .zip(&r)
        .filter(|((_, want), _)| *want == "?")
        .map(|((e, _), got)| format!("{e} {got}"))
        .collect();
    eprintln!(
        "[{mode:?}, sandboxed {sandboxed}] {} attempts answer the same remotely; own areas:\n{}",
        cases.len(),
        own.join("\n")
    );
}

both_modes!(remote_runs_meet_the_same_rules_sandboxed, |mode| {
    remote_runs_meet_the_same_rules(mode, true, None);
});

both_modes!(remote_runs_meet_the_same_rules_unsandboxed, |mode| {
    remote_runs_meet_the_same_rules(mode, false, None);
});

/// The one-node cluster the Slurm variants run on (root only: the cluster and `attach` need it;
/// Slurm missing is a failure, as in tests/e2e/slurm.rs).
fn slurm_cluster() -> Option<crate::slurm_cluster::Cluster> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the throwaway cluster and smithfs attach need root");
        return None;
    }
    Some(crate::slurm_cluster::Cluster::start(1).expect(
        "Slurm is not installed (scripts/install-deps.sh installs munge, slurmctld, slurmd)",
    ))
}

both_modes!(slurm_jobs_meet_the_same_rules_sandboxed, |mode| {
    if let Some(c) = slurm_cluster() {
        remote_runs_meet_the_same_rules(mode, true, Some(&c));
    }
});

both_modes!(slurm_jobs_meet_the_same_rules_unsandboxed, |mode| {
    if let Some(c) = slurm_cluster() {
        remote_runs_meet_the_same_rules(mode, false, Some(&c));
    }
});
