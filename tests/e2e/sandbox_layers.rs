//! One layer holds where another is missing (issue 27, docs/SPEC.md §12, docs/RELIABILITY.md
//! "The sandbox's layers"): tests/fixtures/escapes.sh, part one's attacks and the layers'
//! (`SANDBOXED=1 LAYERS=1`), from a run the scheduler started and from `smithfs run --smith`, on
//! real mounts in both identity modes whose daemon removed one layer (`SMITHFS_SANDBOX_WITHOUT`,
//! docs/PROTOCOL-NOTES.md SB14): the run's view, its Landlock domain, its seccomp filter. Each
//! case asserts which attacks now succeed and that every other one still fails.
//!
//! Without the view a run sees the host's tree: the probes only read, or write into this test's
//! own directories (and open a host device for append, writing nothing).

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;

/// The agents' uid of these mounts (`sandbox.uid`).
const AGENTS_UID: u32 = 65534;

/// A process of another smith (`sleep` through `smithfs run`, so in the same reduced sandbox);
/// ended and reaped on drop: SIGTERM first, which the keeper forwards to its command, SIGKILL
/// after 10 s (which takes the run with it too: docs/PROTOCOL-NOTES.md XT16).
struct Sibling(Child);

impl Drop for Sibling {
    fn drop(&mut self) {
        // SAFETY: a signal to our own unreaped child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while matches!(self.0.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process outside every run; killed and reaped on drop.
struct Outside(Child);

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A sandboxed mount in identity `mode` whose daemon runs with `SMITHFS_SANDBOX_WITHOUT=without`.
fn mount_without(
    config: &serde_json::Value,
    mode: &'static str,
    without: &'static str,
) -> TestMount {
    TestMount::with_config(config, mode, vec![("SMITHFS_SANDBOX_WITHOUT", without)])
}

/// The paths the probes are pointed at.
struct Targets {
    /// A world-readable file in a world-searchable host directory outside the view.
    outside: String,
    /// A 0777 directory in the host's /tmp.
    host_tmp: String,
    /// A 0777 directory outside the view and outside /tmp.
    open_dir: String,
}

/// A host directory beneath none of the places a run without its view may write (`/tmp`,
/// `/var/tmp`, `/dev/shm`: notes SB14): the build's own temporary directory, unless the checkout
/// itself lies beneath one of them (a clone in `/tmp`), then `/run`.
fn outside_the_scratch_dirs() -> &'static Path {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let scratch = ["/tmp", "/var/tmp", "/dev/shm"];
    if scratch.iter().any(|d| target.starts_with(d)) {
        Path::new("/run")
    } else {
        target
    }
}

/// The attack an `ESCAPED`/`MISSING` line of escapes.sh reports, by name; an unknown line as
/// itself. `DEV` lines (a host device read) carry the device.
fn attack(line: &str, t: &Targets) -> String {
    let l = line
        .strip_prefix("ESCAPED: ")
        .or_else(|| line.strip_prefix("MISSING: "))
        .unwrap_or(line);
    let named = [
        ("device node ", "host device nodes visible"),
        ("sees ", "host processes visible"),
        ("test -e ", "the smithfs binary visible"),
        ("echo escaped > /proc/self/comm", "write its own comm"),
        ("perl -MSocket", "connect to an abstract socket"),
        ("unshare -U true", "unshare -U"),
        ("TIOCSTI", "TIOCSTI"),
        ("x32 getpid", "x32 call"),
    ];
    if let Some(dev) = l.strip_prefix("timeout 2 dd if=") {
        return format!("DEV {}", dev.split_whitespace().next().unwrap_or(""));
    }
    if l == format!("cat {}", t.outside) {
        return "read a host file outside the view".into();
    }
    if l == format!("touch {}/escaped", t.host_tmp) {
        return "write the host's /tmp".into();
    }
    if l == format!("touch {}/escaped", t.open_dir) {
        return "write a 0777 host dir".into();
    }
    if let Some(call) = l.strip_prefix("perl -e $r = syscall(") {
        return format!("syscall {}", call.split(',').next().unwrap_or(""));
    }
    named
        .iter()
        .find(|(p, _)| l.contains(p))
        .map_or_else(|| line.to_string(), |(_, n)| (*n).to_string())
}

/// Whether the agents' uid may read host device `dev` by its mode bits (it is in no group of
/// the device: the other bits).
fn others_may_read(dev: &str) -> bool {
    std::fs::metadata(dev).is_ok_and(|m| m.permissions().mode() & 0o004 != 0)
}

/// What one run of escapes.sh shows with `without` removed: the attacks that got through are
/// exactly `must` plus, of `may`, any (`DEV` ones only where the mode bits let the agents' uid
/// read); the run is the agents' uid without capabilities, `no_new_privs`, the smith.
fn check(out: &str, without: &str, what: &str, t: &Targets, must: &[&str], may: &[&str]) {
    let got: BTreeSet<String> = out
        .lines()
        .filter(|l| l.starts_with("ESCAPED") || l.starts_with("MISSING"))
        .map(|l| attack(l, t))
        .collect();
    eprintln!("[{what}, without {without}] got through: {got:?}");
    for m in must {
        assert!(
            got.contains(*m),
            "[{what}, without {without}] {m:?} should succeed:\n{out}"
        );
    }
    for g in &got {
        let ok = must.contains(&g.as_str())
            || may.contains(&g.as_str())
            || g.strip_prefix("DEV ")
                .is_some_and(|d| may.contains(&"DEV") && others_may_read(d));
        assert!(
            ok,
            "[{what}, without {without}] {g:?} got through, another layer should stop it:\n{out}"
        );
    }
    check_unprivileged(out, AGENTS_UID, &format!("{what}, without {without}"));
    assert!(
        out.contains("full id: smith-root\n"),
        "[{what}, without {without}]\n{out}"
    );
    let seccomp = if without == "seccomp" {
        "Seccomp: 0\n"
    } else {
        "Seccomp: 2\n"
    };
    assert!(
        out.contains(seccomp),
        "[{what}, without {without}] not {seccomp:?}:\n{out}"
    );
}

/// Which attacks succeed when `without` is removed (docs/RELIABILITY.md's table, "When that
/// layer is absent"): those that must, and those that may (the kernel's own answer, or a read
/// the mode bits allow).
fn expected(without: &str) -> (Vec<&'static str>, Vec<&'static str>) {
    match without {
        // The host's tree shows: what the view hid is seen and read, and the writable set's
        // /tmp is the host's. Writes elsewhere, devices, signals, other processes' /proc and
        // the filter's calls stay refused (Landlock, the uid, the pid namespace, seccomp).
        "view" => (
            vec![
                "host device nodes visible",
                "host processes visible",
                "the smithfs binary visible",
                "read a host file outside the view",
                "write the host's /tmp",
            ],
            vec!["DEV"],
        ),
        // The view, the uid and the pid namespace hold; Landlock alone refused the write the
        // mode bits allow to its own /proc/self/comm and the host's abstract sockets.
        "landlock" => (
            vec!["write its own comm", "connect to an abstract socket"],
            vec![],
        ),
        // The filter's own probes report the kernel's answer (not EPERM): what the call then
        // does depends on the host's sysctls; every other attack stays refused.
        _ => {
            let userns = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
                .is_ok_and(|v| v.trim() != "0");
            let must = if userns { vec!["unshare -U"] } else { vec![] };
            (
                must,
                vec![
                    "syscall 248",
                    "syscall 250",
                    "syscall 321",
                    "syscall 298",
                    "syscall 323",
                    "syscall 304",
                    "TIOCSTI",
                    "x32 call",
                    "unshare -U",
                ],
            )
        }
    }
}

/// escapes.sh against each layer removed in turn, in identity `mode`.
fn one_layer_holds(mode: &'static str) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    use std::os::linux::net::SocketAddrExt;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/escapes.sh");
    let scratch = tempfile::Builder::new()
        .prefix("smithfs-layers-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(scratch.path(), PermissionsExt::from_mode(0o755)).expect("chmod");
    let outside = scratch.path().join("outside.txt");
    std::fs::write(&outside, "world-readable, outside the view\n").expect("outside");
    let host_tmp = scratch.path().join("host-tmp");
    let share = scratch.path().join("share");
    let open = tempfile::Builder::new()
        .prefix("smithfs-layers-open-")
        .tempdir_in(outside_the_scratch_dirs())
        .expect("tempdir outside /tmp");
    for d in [&host_tmp, &share] {
        std::fs::create_dir(d).expect("mkdir");
    }
    for d in [host_tmp.as_path(), share.as_path(), open.path()] {
        std::fs::set_permissions(d, PermissionsExt::from_mode(0o777)).expect("chmod");
    }
    let t = Targets {
        outside: outside.to_string_lossy().into_owned(),
        host_tmp: host_tmp.to_string_lossy().into_owned(),
        open_dir: open.path().to_string_lossy().into_owned(),
    };
    let victim = Outside(
        Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("spawn sleep"),
    );
    let pidfile = share.join("victim.pid");
    std::fs::write(&pidfile, victim.0.id().to_string()).expect("pid file");
    let name = format!("smithfs-layers2-{}-{mode}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .expect("abstract address");
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let vars = [
        ("SANDBOXED", "1".to_string()),
        ("LAYERS", "1".to_string()),
        ("OUTSIDE", t.outside.clone()),
        ("HOST_TMP_DIR", t.host_tmp.clone()),
        ("OPEN_DIR", t.open_dir.clone()),
        ("SMITHFS_BIN", SMITHFS.to_string()),
        ("AGENT_PROG", script.to_string_lossy().into_owned()),
        ("ABSTRACT", name.clone()),
        ("PIDFILE", pidfile.to_string_lossy().into_owned()),
    ];
    let env: serde_json::Map<String, serde_json::Value> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(v.as_str())))
        .collect();
    let config = serde_json::json!({
        "agent": { "command": ["/bin/bash", script], "env": env, "retries": 0 },
        "sandbox": { "uid": AGENTS_UID, "writable": [share] },
    });
    for without in ["view", "landlock", "seccomp"] {
        let m = mount_without(&config, mode, without);
        let who = std::fs::read_to_string(m.path().join(".smithfs/whoami")).expect("whoami");
        assert!(
            who.contains(&format!("\nsandbox without: {without}\n")),
            "[{mode}] whoami does not say it:\n{who}"
        );
        std::fs::create_dir_all(m.path().join("smiths/smith-root/children/smith-001"))
            .expect("mkdir smith-001");
        let sibling = Sibling(
            Command::new(SMITHFS)
                .args(["run", "--mount"])
                .arg(m.path())
                .args(["--smith", "smith-root/smith-001", "--", "sleep", "120"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn the sibling"),
        );
        std::fs::write(
            m.path().join("smiths/smith-root/inbox/task-1.md"),
            format!("escape\nsibling: {}\n", sibling.0.id()),
        )
        .expect("task");
        let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 120);
        assert!(
            meta["error"].is_null(),
            "[{mode}, without {without}] {meta}"
        );
        let mut cmd = Command::new(SMITHFS);
        cmd.args(["run", "--mount"])
            .arg(m.path())
            .args(["--smith", "smith-root", "--", "/bin/bash"])
            .arg(&script)
            .env("SIBLING", sibling.0.id().to_string())
            .current_dir(scratch.path());
        for (k, v) in &vars {
            cmd.env(k, v);
        }
        let out = run(&mut cmd);
        let (must, may) = expected(without);
        check(
            &log,
            without,
            &format!("{mode}, scheduler"),
            &t,
            &must,
            &may,
        );
        check(
            &out.stdout,
            without,
            &format!("{mode}, smithfs run"),
            &t,
            &must,
            &may,
        );
        drop(sibling);
        // The attacks' own traces, for the next layer's runs.
        let _ = std::fs::remove_file(host_tmp.join("escaped"));
    }
    assert!(
        !open.path().join("escaped").exists(),
        "[{mode}] a run wrote the 0777 host dir"
    );
    // SAFETY: signal 0 to our own unreaped child.
    let alive = unsafe { libc::kill(victim.0.id() as i32, 0) } == 0;
    assert!(alive, "[{mode}] the process outside the run died");
}

#[test]
fn one_layer_holds_where_another_is_missing_cgroup() {
    one_layer_holds("cgroup");
}

#[test]
fn one_layer_holds_where_another_is_missing_ancestry() {
    one_layer_holds("ancestry");
}

/// cargo runs unchanged under every layer (docs/SPEC.md §12, docs/RELIABILITY.md): a run the
/// scheduler started makes a crate without dependencies in the smith's `private/`, with
/// `CARGO_HOME` in its `home/`, offline, builds it, runs its tests and its binary. The
/// toolchain is this test's own (`rustc --print sysroot`), made visible by `sandbox.readable`.
#[test]
fn cargo_builds_and_tests_under_every_layer() {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let Some(sysroot) = sysroot.filter(|s| Path::new(s).join("bin/cargo").exists()) else {
        eprintln!("skipped: no cargo beside rustc");
        return;
    };
    let agent = r#"set -e
export CARGO_HOME="$HOME/.cargo" PATH="$TOOLCHAIN/bin:$PATH" CARGO_NET_OFFLINE=true
cd "$SMITH_DIR/private"
cargo new --offline --vcs none --name tiny tiny 2>&1
cd tiny
cat > src/main.rs <<'RS'
fn answer() -> u32 {
    std::thread::spawn(|| 6 * 7).join().unwrap_or(0)
}
fn main() {
    println!("tiny: {}", answer());
}
#[test]
fn it_answers() {
    assert_eq!(answer(), 42);
}
RS
cargo build --offline 2>&1 && echo "cargo build: ok"
cargo test --offline 2>&1 | grep -q "test result: ok. 1 passed" && echo "cargo test: ok"
./target/debug/tiny
awk '$1 == "Seccomp:" { print $1 " " $2 }' /proc/self/status
"#;
    let dir = tempfile::Builder::new()
        .prefix("smithfs-cargo-")
        .tempdir()
        .expect("tempdir");
    let script = dir.path().join("agent.sh");
    std::fs::write(&script, agent).expect("agent.sh");
    let config = serde_json::json!({
        "agent": {
            "command": ["/bin/bash", script],
            "env": { "TOOLCHAIN": sysroot },
            "retries": 0,
        },
        "sandbox": {
            "uid": AGENTS_UID,
            "readable": [sysroot],
            "require": ["namespaces", "landlock", "seccomp"],
        },
    });
    let m = TestMount::with_config(&config, "cgroup", Vec::new());
    let started = std::time::Instant::now();
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "go\n").expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 120);
    eprintln!("cargo new, build, test and run: {:?}", started.elapsed());
    assert!(meta["error"].is_null(), "{meta}\n{log}");
    for want in [
        "cargo build: ok\n",
        "cargo test: ok\n",
        "tiny: 42\n",
        "Seccomp: 2\n",
    ] {
        assert!(log.contains(want), "no {want:?} in:\n{log}");
    }
    assert!(
        m.path().join("smiths/smith-root/home/.cargo").is_dir(),
        "CARGO_HOME was not in home/"
    );
}

/// The knob is the daemon's alone (docs/PROTOCOL-NOTES.md SB14): `SMITHFS_SANDBOX_WITHOUT` in a
/// run's environment (`agent.env` of config.json) or in the environment of `smithfs run
/// --smith` removes nothing from a mount whose daemon was started without it: the run has its
/// view (a host file outside it is not there), its Landlock domain (its own `/proc/self/comm`
/// is not written) and its filter; whoami says nothing of it.
#[test]
fn a_run_cannot_remove_a_layer() {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    let scratch = tempfile::Builder::new()
        .prefix("smithfs-knob-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(scratch.path(), PermissionsExt::from_mode(0o755)).expect("chmod");
    let outside = scratch.path().join("outside.txt");
    std::fs::write(&outside, "outside the view\n").expect("outside");
    let probe = format!(
        r#"cat '{}' >/dev/null 2>&1 && echo "ESCAPED: read outside the view"
echo escaped > /proc/self/comm 2>/dev/null && echo "ESCAPED: wrote its own comm"
awk '$1 == "Seccomp:" {{ print $1 " " $2 }}' /proc/self/status
grep -q '^sandbox without' "$SMITH_MOUNT/.smithfs/whoami" && echo "ESCAPED: whoami names removed layers"
echo done"#,
        outside.display()
    );
    let script = scratch.path().join("probe.sh");
    std::fs::write(&script, probe).expect("probe.sh");
    let config = serde_json::json!({
        "agent": {
            "command": ["/bin/bash", script],
            "env": { "SMITHFS_SANDBOX_WITHOUT": "view,landlock,seccomp" },
            "retries": 0,
        },
        "sandbox": { "uid": AGENTS_UID },
    });
    let m = TestMount::with_config(&config, "cgroup", Vec::new());
    std::fs::write(m.path().join("smiths/smith-root/inbox/task-1.md"), "go\n").expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 120);
    assert!(meta["error"].is_null(), "{meta}\n{log}");
    let out = run(Command::new(SMITHFS)
        .args(["run", "--mount"])
        .arg(m.path())
        .args(["--smith", "smith-root", "--", "/bin/bash"])
        .arg(&script)
        .env("SMITHFS_SANDBOX_WITHOUT", "view,landlock,seccomp")
        .current_dir(scratch.path()));
    for (what, text) in [("scheduler", &log), ("smithfs run", &out.stdout)] {
        assert!(
            text.contains("Seccomp: 2\n") && text.contains("done\n"),
            "[{what}] no filter:\n{text}\n{}",
            out.stderr
        );
        assert!(!text.contains("ESCAPED"), "[{what}] a layer went:\n{text}");
    }
}
