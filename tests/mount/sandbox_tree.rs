//! The tree side of the sandbox on real mounts (docs/SPEC.md §2, §3, §4, §12): the Operator is
//! only root, the daemon's uid or the agents' user; what a run creates is its uid's, in the
//! store too; `home/` in new and old trees, seeded from `templates/home/`, which no smith reads;
//! a parent cannot read its child's `home/`.

use std::os::unix::fs::MetadataExt;

use crate::common::*;

/// The agents' uid the tests name explicitly (no account on a test machine, never root).
const AGENT: u32 = 4242;

fn whoami_as(uid: u32, m: &TestMount) -> Vec<(String, String)> {
    let out = sh_as(uid, uid, m.path(), "cat .smithfs/whoami").expect_ok("whoami");
    smithfs::cli::whoami::parse_pairs(&out)
}

fn get<'a>(pairs: &'a [(String, String)], key: &str) -> &'a str {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key} in {pairs:?}"))
}

/// `smithfs run --smith FULL_ID -- sh -c SCRIPT` in the mount's root, by root: the command runs
/// in the sandbox as the smith's uid (docs/SPEC.md §12).
fn run_sh(m: &TestMount, full_id: &str, script: &str) -> Run {
    run(std::process::Command::new(env!("CARGO_BIN_EXE_smithfs"))
        .args(["run", "--mount"])
        .arg(m.path())
        .args(["--smith", full_id, "--", "sh", "-c", script])
        .current_dir(m.path()))
}

/// A mount with the sandbox on (the default) and `sandbox` as the
/// mount-wide `sandbox` section.
fn sandboxed(sandbox: serde_json::Value) -> TestMount {
    let mut m = TestMount::with(MountOpts {
        allow_other: true,
        ..MountOpts::default()
    });
    m.set_sandbox(sandbox);
    m
}

#[test]
fn another_uid_is_unknown_and_the_agents_uid_is_the_operator() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut m = sandboxed(serde_json::json!({"uid": AGENT}));
    // The agents' user outside a run: the Operator.
    let w = whoami_as(AGENT, &m);
    assert_eq!(get(&w, "identity"), "operator", "{w:?}");
    assert_eq!(get(&w, "uid"), AGENT.to_string());
    // Root: the Operator.
    let w = smithfs::cli::whoami::parse_pairs(&m.sh_ok("cat .smithfs/whoami"));
    assert_eq!(get(&w, "identity"), "operator");
    // Any other uid: Unknown — it may look up and stat, nothing more.
    let r = sh_as(AGENT + 1, AGENT + 1, m.path(), "cat .smithfs/whoami");
    assert!(!r.ok() && r.stderr.contains("Permission denied"), "{r:?}");
    let r = sh_as(AGENT + 1, AGENT + 1, m.path(), "cat config.json");
    assert!(!r.ok() && r.stderr.contains("Permission denied"), "{r:?}");
    sh_as(AGENT + 1, AGENT + 1, m.path(), "stat -c %s config.json").expect_ok("stat");
    // With the sandbox off, every uid may be the Operator again (and the mount is as before).
    m.set_sandbox(serde_json::json!({"enabled": false}));
    let w = whoami_as(AGENT + 1, &m);
    assert_eq!(get(&w, "identity"), "operator", "{w:?}");
}

#[test]
fn what_a_bound_process_creates_belongs_to_its_uid_and_old_trees_are_brought_over() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    // init made a root-owned tree; the mount gives it to the agents' user (but conversations/).
    let mut m = sandboxed(serde_json::json!({"uid": AGENT}));
    let root_dir = "smiths/smith-root";
    for rel in [
        "private", "outbox", "inbox", "home", ".claude", "smith.md", "",
    ] {
        let md = std::fs::metadata(m.path().join(root_dir).join(rel)).expect("stat");
        assert_eq!(md.uid(), AGENT, "{root_dir}/{rel}");
    }
    assert_eq!(
        std::fs::metadata(m.path().join("results"))
            .expect("stat")
            .uid(),
        AGENT
    );
    let conv = std::fs::metadata(m.path().join(root_dir).join("conversations")).expect("stat");
    assert_eq!(conv.uid(), 0, "conversations/ stays the daemon's");
    // A command bound to the root smith runs as the agents' uid and creates as that uid, in
    // every area the smith writes.
    run_sh(
        &m,
        "smith-root",
        "cd smiths/smith-root && echo hi > private/p && mkdir private/d && echo r > outbox/o && \
         echo h > home/.rc && echo c > CLAUDE.md && echo f > ../../results/notes.md",
    )
    .expect_ok("run as the agents' uid");
    // A child made by the smith is the agents' too (the scaffold), and so is its home.
    run_sh(
        &m,
        "smith-root",
        "mkdir smiths/smith-root/children/smith-001",
    )
    .expect_ok("mkdir child");
    // A child made by the operator (root) on the smith's behalf as well.
    m.sh_ok("mkdir smiths/smith-root/children/smith-002");
    m.umount();
    for rel in [
        "private/p",
        "private/d",
        "outbox/o",
        "home/.rc",
        "CLAUDE.md",
        "children/smith-001",
        "children/smith-001/private",
        "children/smith-001/home",
        "children/smith-001/inbox",
        "children/smith-002",
        "children/smith-002/home",
    ] {
        let md = std::fs::metadata(m.path().join(root_dir).join(rel)).expect("stat");
        assert_eq!(md.uid(), AGENT, "store: {rel}");
    }
    let md = std::fs::metadata(m.path().join("results/notes.md")).expect("stat");
    assert_eq!(md.uid(), AGENT, "store: results/notes.md");
    let conv = std::fs::metadata(
        m.path()
            .join(root_dir)
            .join("children/smith-002/conversations"),
    )
    .expect("stat");
    assert_eq!(conv.uid(), 0, "a child's conversations/ is the daemon's");
    m.mount();
}

#[test]
fn home_in_new_and_old_trees_seeded_from_an_operator_only_template() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut m = sandboxed(serde_json::json!({"uid": AGENT}));
    assert!(
        m.path().join("smiths/smith-root/home").is_dir(),
        "init makes home/"
    );
    // The operator seeds templates/home/; no smith can read it, not even the root smith.
    m.sh_ok("mkdir -p templates/home/.config && echo login > templates/home/.config/cli.json");
    let r = run_as(
        m.path(),
        "smith-root",
        &["cat", "templates/home/.config/cli.json"],
    );
    assert!(!r.ok() && r.stderr.contains("Permission denied"), "{r:?}");
    let r = run_as(m.path(), "smith-root", &["ls", "templates/home"]);
    assert!(!r.ok() && r.stderr.contains("Permission denied"), "{r:?}");
    // A new child's home/ is a copy, its own.
    m.sh_ok("mkdir smiths/smith-root/children/smith-001");
    let child = "smiths/smith-root/children/smith-001";
    let out = run_as(
        m.path(),
        "smith-root/smith-001",
        &[
            "sh",
            "-c",
            &format!("cat {child}/home/.config/cli.json && echo mine > {child}/home/notes"),
        ],
    )
    .expect_ok("the child reads and writes its home");
    assert_eq!(out, "login\n");
    // Its parent cannot read it (§3: home/** is the smith's and the operator's).
    let r = run_as(m.path(), "smith-root", &["ls", &format!("{child}/home")]);
    assert!(!r.ok() && r.stderr.contains("Permission denied"), "{r:?}");
    let r = run_as(
        m.path(),
        "smith-root",
        &["cat", &format!("{child}/home/notes")],
    );
    assert!(!r.ok() && r.stderr.contains("Permission denied"), "{r:?}");
    // A tree made before home/ existed gets it at mount, seeded.
    m.umount();
    std::fs::remove_dir_all(m.path().join(child).join("home")).expect("rm home");
    std::fs::remove_dir_all(m.path().join("smiths/smith-root/home")).expect("rm home");
    m.mount();
    for d in ["smiths/smith-root", child] {
        let seeded = m.path().join(d).join("home/.config/cli.json");
        assert_eq!(
            m.sh_ok(&format!("cat {}", seeded.display())),
            "login\n",
            "{d}"
        );
        assert_eq!(
            std::fs::metadata(m.path().join(d).join("home"))
                .expect("stat")
                .uid(),
            AGENT
        );
    }
    // home/ is structure: nobody but smithfs removes or renames it.
    let r = run_as(
        m.path(),
        "smith-root",
        &["mv", "smiths/smith-root/home", "smiths/smith-root/home2"],
    );
    assert!(!r.ok() && r.stderr.contains("not permitted"), "{r:?}");
}
