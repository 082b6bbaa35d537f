//! A smith's `agent.env` never acts on a privileged process (docs/SPEC.md §3, §12, notes XT21):
//! a parent writes its child's `config.json` with the dynamic loader's variables (`LD_DEBUG`
//! with `LD_DEBUG_OUTPUT` naming a root-only host directory, `LD_PRELOAD` of a library there,
//! `GLIBC_TUNABLES`); the child's run starts — through the sandbox's init, root until it drops,
//! and on the loopback kind through `smithfs attach`, root outside the sandbox — and nothing is
//! written in that directory: only the agent, as the agents' uid inside its view, sees the
//! variables (by their names: it prints them). Both identity modes, local and loopback runs.

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::*;

/// The agent: the parent (task `parent`) makes smith-001 with the loader's variables in its
/// config.json and gives it a task; the child prints what it got (with builtins: the loader's
/// debug lines of an executed program could mix into its output).
const AGENT: &str = r#"
cd "$SMITH_DIR"
read -r what < "$SMITH_TASK_FILE"
case "$what" in
  parent)
    mkdir children/smith-001
    printf '{"agent":{"env":{"LD_DEBUG":"files","LD_DEBUG_OUTPUT":"%s/ld","LD_PRELOAD":"%s/evil.so","GLIBC_TUNABLES":"glibc.malloc.check=3"}}}' \
      "$TRAP" "$TRAP" > children/smith-001/config.json
    echo child > children/smith-001/inbox/task-1.md
    ;;
  child)
    echo "child sees LD_DEBUG=$LD_DEBUG LD_DEBUG_OUTPUT=$LD_DEBUG_OUTPUT as $UID"
    ;;
esac
"#;

fn loader_variables_of_a_child(mode: &'static str, launcher: &str) {
    loader_variables_of_a_child_with(mode, serde_json::json!({ "kind": launcher }), Vec::new());
}

/// [`loader_variables_of_a_child`] with `launcher` as config.json's `launcher` and `env` for the
/// daemon (the Slurm kind's tests in tests/e2e/slurm.rs: a cluster's `SLURM_CONF`).
pub(crate) fn loader_variables_of_a_child_with(
    mode: &'static str,
    launcher: serde_json::Value,
    env: Vec<(&'static str, &'static str)>,
) {
    if !is_root() {
        eprintln!("skipped: the sandbox needs root");
        return;
    }
    // A root-only host directory: what a privileged process honouring LD_DEBUG_OUTPUT writes
    // there shows (it is outside every view).
    let trap = tempfile::Builder::new()
        .prefix("smithfs-ld-trap.")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(trap.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let config = serde_json::json!({
        "launcher": launcher,
        "agent": {
            "command": ["/bin/bash", "-c", AGENT],
            "env": { "TRAP": trap.path() },
            "retries": 0,
        },
    });
    let what = format!("{mode}, {}", config["launcher"]);
    let m = TestMount::with_config(&config, mode, env);
    std::fs::write(
        m.path().join("smiths/smith-root/inbox/task-1.md"),
        "parent\n",
    )
    .expect("task");
    let (log, meta) = ended_run(&m, "smiths/smith-root", 1, 90);
    assert_eq!(meta["exit_code"], 0, "[{what}] parent: {meta}\n{log}");
    let child = "smiths/smith-root/children/smith-001";
    let (_, meta) = ended_run(&m, child, 1, 90);
    assert_eq!(meta["exit_code"], 0, "[{what}] child: {meta}");
    // The output may trail the run's end (a remote run's crosses its connection).
    let log_path = m
        .path()
        .join(child)
        .join("conversations/run-0001/messages.log");
    let log = poll_until(
        std::time::Duration::from_secs(10),
        "the child's line",
        || {
            std::fs::read_to_string(&log_path)
                .ok()
                .filter(|l| l.contains("child sees"))
        },
    );
    assert!(
        log.contains("child sees LD_DEBUG=files LD_DEBUG_OUTPUT=") && !log.contains(" as 0\n"),
        "[{what}] the agent (not root) gets its variables by their names:\n{log}"
    );
    let written: Vec<String> = std::fs::read_dir(trap.path())
        .expect("the trap")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        written.is_empty(),
        "[{what}] a privileged process honoured the child's LD_DEBUG_OUTPUT: {written:?}\n{log}"
    );
}

#[test]
fn a_childs_loader_variables_reach_only_its_agent_cgroup() {
    loader_variables_of_a_child("cgroup", "local");
}

#[test]
fn a_childs_loader_variables_reach_only_its_agent_ancestry() {
    loader_variables_of_a_child("ancestry", "local");
}

#[test]
fn a_childs_loader_variables_reach_only_its_agent_through_attach() {
    loader_variables_of_a_child("cgroup", "loopback");
}
