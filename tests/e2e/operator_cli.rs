//! The operator's command line (issue 11, docs/SPEC.md §6), driven as a user would drive the
//! real binary: the mount type `fuse.smithfs`, `mount -o`, the `mount.fuse.smithfs` helper
//! under mount(8), completions, the man page, `--version`, `--help` examples, `doctor --json`.

use crate::common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
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

/// docs/SPEC.md §6: a root mount has the type `fuse.smithfs` (daemon and foreground).
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

/// An init'd smithfs directory in a private temp dir (not mounted); whatever is mounted on it
/// at the end is unmounted (`smithfs umount`, then `umount -l`) and its daemon awaited.
struct Store {
    tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl Store {
    fn new() -> Store {
        skip_unless_fuse_usable();
        let tmp = tempfile::Builder::new()
            .prefix("smithfs-opcli-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().join("m");
        smithfs([OsStr::new("init"), dir.as_os_str()]).expect_ok("init");
        Store { tmp, dir }
    }
}

/// The pid of the daemon serving `dir` (`whoami --json`'s `daemon_pid`): also for a daemon
/// started as `mount.fuse.smithfs`, whose command line `find_daemon` does not know.
fn daemon_of(dir: &Path) -> Option<i32> {
    let r = run(Command::new(SMITHFS)
        .args(["whoami", "--json", "--mount"])
        .arg(dir));
    let v: serde_json::Value = serde_json::from_str(&r.stdout).ok()?;
    v["daemon_pid"].as_i64().map(|p| p as i32)
}

impl Drop for Store {
    fn drop(&mut self) {
        let pid = daemon_of(&self.dir).or_else(|| find_daemon(&self.dir));
        if is_smithfs_mounted(&self.dir) {
            let r = smithfs([OsStr::new("umount"), self.dir.as_os_str()]);
            if !r.ok() {
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
            }
        }
        if let Some(pid) = pid {
            poll_until(MOUNT_DEADLINE, "the daemon to exit", || process_gone(pid));
        }
    }
}

/// The options the kernel shows for the mount at `dir` (mountinfo's super options).
fn super_options(dir: &Path) -> String {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .rfind(|l| l.split(' ').nth(4) == dir.to_str())
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_default()
        .to_owned()
}

/// docs/SPEC.md §6: `-o` takes fstab's options (repeatable), ignores mount(8)'s and systemd's,
/// refuses anything else by name (exit 2, one line), and a flag that contradicts an option is
/// refused too (O40).
#[test]
fn mount_o_applies_options_and_refuses_others_by_name() {
    let s = Store::new();
    let d = s.dir.as_os_str();
    for (args, want) in [
        (
            &["-o", "allow_other,bogus"][..],
            "-o bogus: unknown mount option",
        ),
        (
            &["-o", "defaults", "-o", "uid=0"][..],
            "-o uid=0: unknown mount option",
        ),
        (
            &["-o", "identity=pid"][..],
            "-o identity=pid: expected auto, cgroup or ancestry",
        ),
        (&["-o", "ro"][..], "-o ro: a smithfs mount is read-write"),
        (
            &["--identity", "cgroup", "-o", "identity=ancestry"][..],
            "--identity cgroup conflicts with -o identity=ancestry",
        ),
        (
            &["--transport", "dev-fuse", "-o", "transport=io-uring"][..],
            "--transport dev-fuse conflicts with -o transport=io-uring",
        ),
    ] {
        let mut a = vec![OsStr::new("mount"), d];
        a.extend(args.iter().map(OsStr::new));
        let r = smithfs(&a);
        assert_eq!(r.code, Some(2), "{args:?}: {r:?}");
        assert_eq!(r.stderr.trim().lines().count(), 1, "one line: {r:?}");
        assert!(r.stderr.contains(want), "{args:?}: {r:?}");
        assert!(!is_smithfs_mounted(&s.dir), "{args:?} mounted");
    }
    // The same flag and option agreeing is fine; options repeat; ignored ones are ignored.
    smithfs([
        OsStr::new("mount"),
        d,
        OsStr::new("--transport"),
        OsStr::new("dev-fuse"),
        OsStr::new("-o"),
        OsStr::new("defaults,nofail,noauto,_netdev,x-systemd.automount,x-systemd.idle-timeout=60"),
        OsStr::new("-o"),
        OsStr::new("rw,allow_other,transport=dev-fuse,no_passthrough,identity=ancestry"),
    ])
    .expect_ok("mount -o …");
    assert!(listed(&s.dir));
    let opts = super_options(&s.dir);
    assert!(opts.split(',').any(|o| o == "allow_other"), "{opts}");
    // identity=ancestry took effect: whoami as the operator names the mode.
    let who = run(Command::new(SMITHFS)
        .args(["whoami", "--json"])
        .current_dir(&s.dir));
    assert!(who.stdout.contains("ancestry"), "{who:?}");
    smithfs([OsStr::new("umount"), d]).expect_ok("umount");
    // Without allow_other the kernel has no allow_other — with the sandbox off: a sandboxed
    // mount is always allow_other (§12).
    let cfg = s.dir.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).expect("config")).expect("json");
    c["sandbox"] = serde_json::json!({"enabled": false});
    std::fs::write(&cfg, c.to_string()).expect("config");
    smithfs([
        OsStr::new("mount"),
        d,
        OsStr::new("-o"),
        OsStr::new("defaults"),
    ])
    .expect_ok("mount -o defaults");
    let opts = super_options(&s.dir);
    assert!(!opts.split(',').any(|o| o == "allow_other"), "{opts}");
}

/// The helper is the binary under another name: `mount.fuse.smithfs SOURCE DIR -o OPTS` mounts
/// DIR like `smithfs mount DIR -o OPTS`; SOURCE must be `smithfs` or DIR (O41).
#[test]
fn mount_fuse_smithfs_by_its_name() {
    let s = Store::new();
    let helper = s.tmp.path().join("mount.fuse.smithfs");
    std::os::unix::fs::symlink(SMITHFS, &helper).unwrap();
    let r = run(Command::new(&helper).arg("/elsewhere").arg(&s.dir));
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("is not the mount point"), "{r:?}");
    let r = run(Command::new(&helper)
        .arg("smithfs")
        .arg(&s.dir)
        .args(["-o", "rw,nosuid,nodev,bogus"]));
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("-o bogus"), "{r:?}");
    assert!(!is_smithfs_mounted(&s.dir));
    // docs/SPEC.md §6's exit codes hold for the helper too: 2 for usage, 1 for a failed mount.
    let r = run(Command::new(&helper)
        .arg("smithfs")
        .arg(&s.dir)
        .arg("--bogus"));
    assert_eq!(r.code, Some(2), "{r:?}");
    let not_init = s.tmp.path().join("not-made-by-init");
    std::fs::create_dir(&not_init).unwrap();
    let r = run(Command::new(&helper).arg("smithfs").arg(&not_init));
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("smithfs init"), "{r:?}");
    assert!(!is_smithfs_mounted(&not_init));
    // mount(8)'s fake mount does nothing.
    run(Command::new(&helper).arg("smithfs").arg(&s.dir).arg("-f")).expect_ok("-f");
    assert!(!is_smithfs_mounted(&s.dir));
    run(Command::new(&helper)
        .arg(&s.dir)
        .arg(&s.dir)
        .args(["-o", "rw,allow_other,nofail,_netdev"]))
    .expect_ok("mount.fuse.smithfs DIR DIR");
    assert!(listed(&s.dir));
    assert!(super_options(&s.dir).contains("allow_other"));
}

/// `/sbin/mount.fuse.smithfs` for the test's duration, when nothing is there: mount(8) finds
/// helpers only in /sbin (and /sbin/fs.d, /sbin/fs). Removes exactly the symlink it made, and
/// only while it still points at this build; never replaces an existing file.
struct SbinHelper {
    path: PathBuf,
    _lock: std::fs::File,
}

impl SbinHelper {
    fn install() -> Option<SbinHelper> {
        let lock = lock_file("/tmp/smithfs-tests-sbin-helper.lock");
        let path = PathBuf::from("/sbin/mount.fuse.smithfs");
        if std::fs::symlink_metadata(&path).is_ok() {
            eprintln!(
                "skipped: {} already exists (installed?); the test does not replace it",
                path.display()
            );
            return None;
        }
        if let Err(e) = std::os::unix::fs::symlink(SMITHFS, &path) {
            eprintln!("skipped: cannot create {}: {e}", path.display());
            return None;
        }
        Some(SbinHelper { path, _lock: lock })
    }
}

impl Drop for SbinHelper {
    fn drop(&mut self) {
        if std::fs::read_link(&self.path).is_ok_and(|t| t == Path::new(SMITHFS)) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// docs/SPEC.md §6: an fstab line of type `fuse.smithfs` works with mount(8) — `mount -T` on a
/// private fstab (never /etc/fstab) — and umount(8) ends it; a bad option in the line fails the
/// mount, naming the option, and mounts nothing.
#[test]
fn an_fstab_line_mounts_with_mount8() {
    if !is_root() {
        eprintln!("skipped: mount(8) with a helper in /sbin needs root");
        return;
    }
    let good = Store::new();
    let bad = Store::new();
    let Some(_helper) = SbinHelper::install() else {
        return;
    };
    let fstab = good.tmp.path().join("fstab");
    let plain = good.tmp.path().join("not-made-by-init");
    std::fs::create_dir(&plain).unwrap();
    std::fs::write(
        &fstab,
        format!(
            "# a private fstab\nsmithfs {} fuse.smithfs defaults,nofail,allow_other,x-systemd.automount 0 0\n{} {} fuse.smithfs defaults,bogus 0 0\nsmithfs {} fuse.smithfs defaults 0 0\n",
            good.dir.display(),
            bad.dir.display(),
            bad.dir.display(),
            plain.display()
        ),
    )
    .unwrap();
    run(Command::new("mount").arg("-T").arg(&fstab).arg(&good.dir)).expect_ok("mount -T");
    assert!(listed(&good.dir), "{:?}", findmnt_smithfs());
    assert!(super_options(&good.dir).contains("allow_other"));
    sh_in(
        &good.dir,
        "echo hi > smiths/smith-root/private/n && cat smiths/smith-root/private/n",
    )
    .expect_ok("use the fstab mount");
    let pid = daemon_of(&good.dir).expect("a daemon");
    run(Command::new("umount").arg(&good.dir)).expect_ok("umount(8)");
    assert!(!is_smithfs_mounted(&good.dir));
    poll_until(MOUNT_DEADLINE, "the daemon to exit after umount(8)", || {
        process_gone(pid)
    });
    assert_eq!(
        std::fs::read_to_string(good.dir.join("smiths/smith-root/private/n")).unwrap(),
        "hi\n"
    );

    let r = run(Command::new("mount").arg("-T").arg(&fstab).arg(&bad.dir));
    assert!(!r.ok(), "{r:?}");
    assert!(r.stderr.contains("-o bogus"), "{r:?}");
    assert!(!is_smithfs_mounted(&bad.dir));
    let r = run(Command::new("mount").arg("-T").arg(&fstab).arg(&plain));
    assert!(!r.ok(), "{r:?}");
    assert!(r.stderr.contains("smithfs init"), "{r:?}");
    assert!(!is_smithfs_mounted(&plain));
}

/// `--version` names the version and the commit it was built from (build.rs: `git rev-parse`).
#[test]
fn version_names_the_commit() {
    let v = smithfs(["--version"]).expect_ok("--version");
    let want = format!("smithfs {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(v.starts_with(&want), "{v}");
    let head = run(Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR")));
    if head.ok() {
        assert_eq!(v.trim(), format!("{want}{})", head.stdout.trim()));
    } else {
        assert!(v.trim().ends_with("(commit unknown)"), "{v}");
    }
}

/// `completions bash` is a script bash loads and that completes subcommands and options;
/// zsh and fish get theirs (checked by their shells when installed).
#[test]
fn completions_complete_in_bash() {
    let script = smithfs(["completions", "bash"]).expect_ok("completions bash");
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("smithfs.bash");
    std::fs::write(&f, &script).unwrap();
    let complete = |line: &str| {
        let words: Vec<&str> = line.split(' ').collect();
        let prog = format!(
            "source {}; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; _smithfs smithfs '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            f.display(),
            words.iter().map(|w| format!("'{w}'")).collect::<Vec<_>>().join(" "),
            words.len() - 1,
            words.last().unwrap(),
            words.get(words.len().wrapping_sub(2)).unwrap_or(&""),
        );
        run(Command::new("bash").args(["--norc", "-c", &prog])).expect_ok("bash completion")
    };
    let subs = complete("smithfs mo");
    assert!(subs.lines().any(|l| l == "mount"), "{subs}");
    let opts = complete("smithfs mount --no");
    assert!(opts.lines().any(|l| l == "--no-passthrough"), "{opts}");
    let shells = complete("smithfs completions ");
    for s in ["bash", "zsh", "fish"] {
        assert!(shells.lines().any(|l| l == s), "{shells}");
    }
    let zsh = smithfs(["completions", "zsh"]).expect_ok("completions zsh");
    assert!(zsh.starts_with("#compdef smithfs"), "{}", &zsh[..40]);
    let fish = smithfs(["completions", "fish"]).expect_ok("completions fish");
    assert!(fish.contains("complete -c smithfs"), "{fish}");
    for (shell, text) in [("zsh", &zsh), ("fish", &fish)] {
        if run(Command::new("which").arg(shell)).ok() {
            let p = tmp.path().join(format!("c.{shell}"));
            std::fs::write(&p, text).unwrap();
            run(Command::new(shell).arg("-n").arg(&p)).expect_ok(shell);
        }
    }
    let r = smithfs(["completions", "tcsh"]);
    assert_eq!(r.code, Some(2), "{r:?}");
}

/// The man page renders (groff) and documents the commands; `man --dir` writes a page per
/// command, as `scripts/install.sh` installs them.
#[test]
fn man_pages_render() {
    let page = smithfs(["man"]).expect_ok("man");
    assert!(page.contains(".TH smithfs 1"), "{}", &page[..200]);
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("smithfs.1");
    std::fs::write(&f, &page).unwrap();
    if run(Command::new("which").arg("groff")).ok() {
        let text = run(Command::new("groff")
            .args(["-man", "-Tutf8", "-P-cbou"])
            .arg(&f))
        .expect_ok("groff");
        for want in ["SYNOPSIS", "mount", "doctor", "completions", "Examples:"] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
    }
    let dir = tmp.path().join("man1");
    smithfs([OsStr::new("man"), OsStr::new("--dir"), dir.as_os_str()]).expect_ok("man --dir");
    let mount = std::fs::read_to_string(dir.join("smithfs-mount.1")).unwrap();
    assert!(
        mount.contains("allow_other") && mount.contains("fuse.smithfs"),
        "{mount}"
    );
    assert!(dir.join("smithfs.1").is_file());
}

/// `--help` of every command ends with examples.
#[test]
fn help_shows_examples() {
    for cmd in [
        &["--help"][..],
        &["run", "--help"],
        &["whoami", "--help"],
        &["cancel", "--help"],
        &["reload", "--help"],
        &["diff", "--help"],
        &["accept", "--help"],
        &["completions", "--help"],
        &["init", "--help"],
        &["mount", "--help"],
        &["status", "--help"],
        &["logs", "--help"],
        &["wait", "--help"],
        &["retry", "--help"],
        &["umount", "--help"],
        &["doctor", "--help"],
        &["events", "--help"],
    ] {
        let h = smithfs(cmd).expect_ok("--help");
        let ex = h.split("Examples:\n").nth(1).unwrap_or_default();
        assert!(ex.trim_start().starts_with("smithfs "), "{cmd:?}:\n{h}");
    }
}

/// `scripts/install.sh` (without its build step) puts the binary, the mount(8) helper,
/// completions and man pages under the prefix and says where; it never replaces a helper that
/// is not a smithfs link; a non-root user gets `~/.local` by default.
#[test]
fn install_sh_installs_everything_under_the_prefix() {
    let tmp = tempfile::Builder::new()
        .prefix("smithfs-install-")
        .tempdir()
        .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh");
    let prefix = tmp.path().join("p");
    let sbin = tmp.path().join("sbin");
    let out = run(Command::new(&script)
        .arg("--no-build")
        .arg("--prefix")
        .arg(&prefix)
        .arg("--sbin")
        .arg(&sbin)
        .env("SMITHFS_BIN", SMITHFS))
    .expect_ok("install.sh");
    let bin = prefix.join("bin/smithfs");
    let files = [
        bin.clone(),
        prefix.join("share/bash-completion/completions/smithfs"),
        prefix.join("share/zsh/site-functions/_smithfs"),
        prefix.join("share/fish/vendor_completions.d/smithfs.fish"),
        prefix.join("share/man/man1/smithfs.1"),
        prefix.join("share/man/man1/smithfs-mount.1"),
    ];
    for f in &files {
        assert!(f.is_file(), "{} missing", f.display());
    }
    for f in &files[..5] {
        assert!(
            out.contains(f.to_str().unwrap()),
            "not named: {}\n{out}",
            f.display()
        );
    }
    let version = smithfs(["--version"]).expect_ok("--version");
    assert_eq!(
        run(Command::new(&bin).arg("--version")).expect_ok("installed"),
        version
    );
    let helper = sbin.join("mount.fuse.smithfs");
    assert_eq!(std::fs::read_link(&helper).unwrap(), bin);
    let r = run(Command::new(&helper).arg("only-one"));
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stderr.contains("usage: mount.fuse.smithfs SOURCE DIR"),
        "{r:?}"
    );
    run(Command::new("bash").arg("--norc").arg("-c").arg(format!(
        "source {} && complete -p smithfs",
        files[1].display()
    )))
    .expect_ok("bash loads the installed completion");

    // A helper that is not ours is never replaced.
    let other = tmp.path().join("other-sbin");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("mount.fuse.smithfs"), "#!/bin/sh\n").unwrap();
    let out = run(Command::new(&script)
        .arg("--no-build")
        .arg("--prefix")
        .arg(&prefix)
        .arg("--sbin")
        .arg(&other)
        .env("SMITHFS_BIN", SMITHFS))
    .expect_ok("install.sh over a foreign helper");
    assert!(out.contains("left alone"), "{out}");
    assert_eq!(
        std::fs::read_to_string(other.join("mount.fuse.smithfs")).unwrap(),
        "#!/bin/sh\n"
    );

    // Unprivileged: ~/.local by default.
    if is_root() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let home = tmp.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
        let out = run(Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&script)
            .arg("--no-build")
            .env("HOME", &home)
            .env("SMITHFS_BIN", SMITHFS))
        .expect_ok("install.sh as a user");
        assert!(home.join(".local/bin/smithfs").is_file(), "{out}");
        assert!(
            home.join(".local/sbin/mount.fuse.smithfs").is_symlink(),
            "{out}"
        );
        assert!(
            home.join(".local/share/man/man1/smithfs.1").is_file(),
            "{out}"
        );
    }
}

/// `scripts/build.sh` (what the demo and install.sh build with) is never silent for long: a
/// progress line every BUILD_PROGRESS_SECS while cargo works, then the time; a failed build
/// prints cargo's last lines and exits with cargo's code. Against a stand-in `cargo`.
#[test]
fn build_sh_shows_progress_and_failures() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let cargo = bin.join("cargo");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build.sh");
    let build = |body: &str| {
        std::fs::write(&cargo, format!("#!/bin/sh\n{body}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
        run(Command::new(&script)
            .env("CARGO_HOME", tmp.path())
            .env("BUILD_PROGRESS_SECS", "1"))
    };
    let ok = build(
        "echo '   Compiling libc v0.2.1' >&2; sleep 1; echo '   Compiling smithfs v0.1.0 (/x)' >&2; sleep 3",
    );
    assert_eq!(ok.code, Some(0), "{ok:?}");
    let progress: Vec<&str> = ok
        .stdout
        .lines()
        .filter(|l| l.contains("crates compiled"))
        .collect();
    assert!(progress.len() >= 2, "{ok:?}");
    assert!(
        progress
            .last()
            .unwrap()
            .contains("now compiling smithfs v0.1.0"),
        "{ok:?}"
    );
    assert!(ok.stdout.contains("build: done in"), "{ok:?}");
    let bad = build("echo 'error[E0425]: cannot find value' >&2; exit 101");
    assert_eq!(bad.code, Some(101), "{bad:?}");
    assert!(bad.stderr.contains("error[E0425]"), "{bad:?}");
    assert!(bad.stderr.contains("failed (exit 101)"), "{bad:?}");
}

/// Hostile review 18b, finding 104 (notes O52): a run's log is bounded only by its smith's
/// storage, and `logs` read all of it into memory. A 2 GiB log (sparse here, in a store not
/// mounted: the bytes are what a run that printed them would leave) is printed whole under a
/// 512 MiB address space limit.
#[test]
fn logs_of_a_huge_run_stay_small() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("m");
    smithfs([OsStr::new("init"), dir.as_os_str()]).expect_ok("init");
    let run_dir = dir.join("smiths/smith-root/conversations/run-0001");
    std::fs::create_dir_all(&run_dir).expect("run dir");
    let log = std::fs::File::create(run_dir.join("messages.log")).expect("log");
    log.set_len(2 << 30).expect("2 GiB");
    std::fs::write(
        run_dir.join("meta.json"),
        r#"{"start":"2026-01-01T00:00:00.000000Z","end":"2026-01-01T00:00:01.000000Z"}"#,
    )
    .expect("meta.json");
    let r = run(Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 524288 && exec \"$0\" logs \"$1\" smith-root --run 1 | wc -c")
        .arg(SMITHFS)
        .arg(&dir));
    assert!(r.ok(), "{}", r.stderr);
    assert_eq!(r.stdout.trim(), (2u64 << 30).to_string(), "{}", r.stderr);
}
