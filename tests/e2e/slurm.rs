//! The throwaway Slurm cluster the §13 tests stand on (docs/SPEC.md §13): it starts, runs a job
//! to completion, reports a cancelled job as CANCELLED, and stops leaving no process behind.
//! The launcher's own tests (runs as Slurm jobs) build on `common::slurm::Cluster`.

use std::time::Duration;

use crate::common::poll_until;
use crate::slurm_cluster::Cluster;

/// A job's state and node as `squeue -t all` shows them (`None` while it has none yet).
fn job_state(cluster: &Cluster, job: &str) -> Option<String> {
    let out = cluster.client("squeue", &["-h", "-t", "all", "-j", job, "-o", "%T"]);
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!s.is_empty()).then_some(s)
}

#[test]
fn a_throwaway_cluster_runs_a_job_cancels_one_and_stops_clean() {
    let Some(cluster) = Cluster::start(2) else {
        panic!(
            "Slurm is not installed (scripts/install-deps.sh installs munge, slurmctld, slurmd)"
        );
    };
    let marker = cluster.dir().join("ran");
    let wrap = format!("echo $SLURM_JOB_ID > {}", marker.display());
    let out = cluster.client(
        "sbatch",
        &[
            "--parsable",
            "-J",
            "smithfs:t:1",
            "-o",
            "/dev/null",
            "-e",
            "/dev/null",
            "--wrap",
            &wrap,
        ],
    );
    assert!(
        out.status.success(),
        "sbatch: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        job.parse::<u64>().is_ok(),
        "sbatch --parsable printed {job:?}"
    );
    poll_until(Duration::from_secs(30), "the job completes", || {
        job_state(&cluster, &job).filter(|s| s == "COMPLETED")
    });
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), job);

    let out = cluster.client(
        "sbatch",
        &["--parsable", "-o", "/dev/null", "--wrap", "sleep 300"],
    );
    let long = String::from_utf8_lossy(&out.stdout).trim().to_string();
    poll_until(Duration::from_secs(30), "the long job runs", || {
        job_state(&cluster, &long).filter(|s| s == "RUNNING")
    });
    assert!(cluster.client("scancel", &[&long]).status.success());
    poll_until(Duration::from_secs(30), "the long job is cancelled", || {
        job_state(&cluster, &long).filter(|s| s == "CANCELLED")
    });

    let dir = cluster.dir().to_path_buf();
    let ns_pid: i32 = std::fs::read_to_string(dir.join("ns.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    drop(cluster);
    // The namespace's PID 1 is gone, and with it every process of the cluster.
    assert!(
        !std::path::Path::new(&format!("/proc/{ns_pid}")).exists(),
        "the cluster's PID 1 ({ns_pid}) outlived the guard"
    );
}

// ----- runs as Slurm jobs (docs/SPEC.md §13, docs/PROTOCOL-NOTES.md R17–R22) ----------------

use crate::common::msched::*;
use crate::common::MountOpts;
use serde_json::json;

const ROOT: &str = "smith-root";
const C1: &str = "smith-root/smith-001";
const C2: &str = "smith-root/smith-002";

/// Run before the test agent's own directives: `waitterm` records its pid, then waits; a TERM
/// makes it write `private/term` (through its remote mount) and exit 7; a run that finds
/// `private/term` from an earlier attempt publishes `retried` instead. `holdwrite`'s first run
/// opens `outbox/result.md`, writes to it, says so (`private/holding`) and keeps writing until
/// its mount fails; a later run writes `retried` into the same file.
const PROLOGUE: &str = r#"
read -r first _ < "$SMITH_TASK_FILE"
if [ "$SMITH_WAKE" != children ] && [ "$first" = waitterm ]; then
  if [ -e private/term ]; then
    printf 'retried\n' > private/r.md && mv private/r.md outbox/result.md
    exit 0
  fi
  trap 'echo TERM > private/term; exit 7' TERM
  echo $$ > private/pid
  sleep 1000 &
  wait $!
  exit 0
fi
if [ "$SMITH_WAKE" != children ] && [ "$first" = waitonce ]; then
  if [ -e private/started ]; then
    printf 'resumed\n' > private/r.md && mv private/r.md outbox/result.md
    exit 0
  fi
  echo started > private/started
  sleep 1000 &
  wait $!
  exit 0
fi
if [ "$SMITH_WAKE" != children ] && [ "$first" = holdwrite ]; then
  if [ -e private/tried ]; then
    if [ -e outbox/result.md ]; then echo yes > private/saw-partial; fi
    printf 'retried\n' > outbox/result.md
    exit 0
  fi
  touch private/tried
  exec 3>outbox/result.md
  echo partial >&3
  touch private/holding
  while echo more >&3; do sleep 0.05; done
  exit 3
fi
if [ "$SMITH_WAKE" != children ] && [ "$first" = uid ]; then
  id -u > private/uid
  printf 'uid\n' > private/r.md && mv private/r.md outbox/result.md
  exit 0
fi
"#;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A scheduler mount whose runs are jobs of `cluster` (the daemon reaches it through
/// `SLURM_CONF`), the sandbox off, `patch` merged into its config.
fn on_cluster(cluster: &Cluster, patch: serde_json::Value) -> Sm {
    on_cluster_with(cluster, patch, true)
}

/// [`on_cluster`], the sandbox on unless `unsandboxed`.
fn on_cluster_with(cluster: &Cluster, patch: serde_json::Value, unsandboxed: bool) -> Sm {
    on_cluster_opts(cluster, patch, unsandboxed, Vec::new())
}

/// [`on_cluster_with`], with more `smithfs mount` arguments.
fn on_cluster_opts(
    cluster: &Cluster,
    patch: serde_json::Value,
    unsandboxed: bool,
    extra: Vec<&'static str>,
) -> Sm {
    on_cluster_env(cluster, patch, unsandboxed, extra, Vec::new())
}

/// [`on_cluster_opts`], with more environment for the daemon.
fn on_cluster_env(
    cluster: &Cluster,
    patch: serde_json::Value,
    unsandboxed: bool,
    extra: Vec<&'static str>,
    more_env: Vec<(&'static str, &'static str)>,
) -> Sm {
    let conf = cluster.conf_env();
    let mut cfg = json!({"launcher": {"kind": "slurm", "listen": "127.0.0.1:0"}});
    merge(&mut cfg, &patch);
    let s = Sm::with(
        MountOpts {
            allow_other: true,
            unsandboxed,
            extra,
            env: [("SLURM_CONF", conf)].into_iter().chain(more_env).collect(),
            ..MountOpts::default()
        },
        cfg,
    );
    s.write("agents/agent.sh", &format!("{PROLOGUE}{AGENT}"));
    s
}

fn cluster() -> Option<Cluster> {
    if !is_root() {
        eprintln!("skipped: the throwaway cluster and smithfs attach need root");
        return None;
    }
    Some(Cluster::start(1).expect(
        "Slurm is not installed (scripts/install-deps.sh installs munge, slurmctld, slurmd)",
    ))
}

/// The job id `meta.json` of `full`'s run `n` (0-based) names, once it names one.
fn job_of(s: &Sm, full: &str, n: usize) -> String {
    poll_until(
        Duration::from_secs(30),
        "the run's job id in meta.json",
        || {
            s.metas(full)
                .get(n)
                .and_then(|m| m["job_id"].as_str().map(String::from))
        },
    )
}

/// A run end to end as a Slurm job: task → job → attach on the node → the agent writes its
/// outbox through its remote mount → the result flows up; its output is in `messages.log`
/// (Slurm's own output files are /dev/null); the job id is in `meta.json`, `run.started` and
/// `status` (`slurm:JOBID@n1`).
#[test]
fn a_run_is_a_slurm_job_end_to_end() {
    let Some(cluster) = cluster() else { return };
    let s = on_cluster(&cluster, json!({"agent": {"retries": 0}}));
    s.task("split\nok\nok\n");
    assert_eq!(
        s.wait_file(120, "results/final.md"),
        "result of smith-001\nresult of smith-002\n"
    );
    s.wait_state(30, ROOT, "done");
    for full in [ROOT, C1, C2] {
        let started = s.wait_events(20, "run.started", Some(full), 1)[0].clone();
        let job = started["job_id"]
            .as_str()
            .expect("run.started has job_id")
            .to_string();
        assert!(job.parse::<u64>().is_ok(), "{started}");
        assert!(started.get("pid").is_none_or(|p| p.is_null()), "{started}");
        let m = &s.metas(full)[0];
        assert_eq!(m["job_id"], job.as_str(), "{m}");
        assert_eq!(m["node"], "n1", "{m}");
        assert_eq!(m["exit_code"], 0, "{m}");
        let log = s
            .read(&format!(
                "{}/conversations/run-0001/messages.log",
                rel(full)
            ))
            .unwrap_or_default();
        assert!(
            log.contains(&format!("run {full} wake=task")),
            "{full}: {log:?}"
        );
        let status = s.status();
        let lr = &smith_of(&status, full)["last_run"];
        let want = format!("slurm:{job}@n1");
        // The root's last run is its `children` one: its own job.
        if full != ROOT {
            assert_eq!(lr["where"], want.as_str(), "{lr}");
        }
        let exited = s.wait_events(20, "run.exited", Some(full), 1)[0].clone();
        assert_eq!(exited["reason"], "exit", "{exited}");
    }
    let out = s.cli("status", &[]);
    assert!(out.stdout.contains("on slurm:"), "{}", out.stdout);
}

/// With the §12 sandbox on (the default), a job's agent runs in it on the node (`attach` starts
/// it from the plan in the welcome, notes R30): not root, and its result still flows up.
#[test]
fn a_sandboxed_run_is_a_slurm_job() {
    let Some(cluster) = cluster() else { return };
    let s = on_cluster_with(&cluster, json!({"agent": {"retries": 0}}), false);
    s.task("uid\n");
    assert_eq!(s.wait_file(120, "results/final.md"), "uid\n");
    let uid = s.read("smiths/smith-root/private/uid").unwrap_or_default();
    assert_ne!(uid.trim(), "0", "the agent on the node is not root");
    assert!(!uid.trim().is_empty());
    let e = s.wait_events(30, "run.exited", Some(ROOT), 1)[0].clone();
    assert_eq!(e["reason"], "exit", "{e}");
    let m = &s.metas(ROOT)[0];
    assert!(m["job_id"].is_string(), "{m}");
    assert_eq!(m["exit_code"], 0, "{m}");
}

/// Cancel is an scancel that TERMs the job's processes (the agent's trap writes through its
/// mount), and a run over `agent.timeout_secs` — counted from when the job runs — is stopped
/// the same way and journaled `run.timed_out`.
#[test]
fn a_slurm_run_is_cancelled_and_timed_out_through_scancel() {
    let Some(cluster) = cluster() else { return };
    let s = on_cluster(
        &cluster,
        json!({"agent": {"timeout_secs": 8, "kill_grace_secs": 4, "retries": 0}}),
    );
    s.task("split\nwaitterm\nwaitterm\n");
    s.wait_file(60, &format!("{}/private/pid", rel(C1)));
    s.cli("cancel", &[C1]).expect_ok("smithfs cancel");
    s.wait_events(30, "run.cancelled", Some(C1), 1);
    let e = s.wait_events(30, "run.exited", Some(C1), 1)[0].clone();
    assert_eq!(e["reason"], "cancelled", "{e}");
    assert_eq!(
        s.read(&format!("{}/private/term", rel(C1))).as_deref(),
        Some("TERM\n"),
        "the cancel's TERM reached the agent on the node"
    );
    s.wait_state(10, C1, "cancelled");
    s.wait_events(60, "run.timed_out", Some(C2), 1);
    let e = s.wait_events(30, "run.exited", Some(C2), 1)[0].clone();
    assert_eq!(e["reason"], "timeout", "{e}");
    assert_eq!(
        s.read(&format!("{}/private/term", rel(C2))).as_deref(),
        Some("TERM\n"),
        "the timeout's TERM reached the agent on the node"
    );
    let m = &s.metas(C2)[0];
    assert_eq!(m["timed_out"], true, "{m}");
    assert!(m["running"].is_string(), "{m}");
    s.wait_state(10, C2, "failed");
}

/// A job scancelled by someone else is Slurm's verdict, not the node's report: `run.exited`
/// with `reason` `lost`, retried per `agent.retries` (the retry publishes).
#[test]
fn a_job_scancelled_by_someone_else_is_lost_and_retried() {
    let Some(cluster) = cluster() else { return };
    let s = on_cluster(&cluster, json!({"agent": {"retries": 1}}));
    s.task("waitterm\n");
    s.wait_file(60, "smiths/smith-root/private/pid");
    let job = job_of(&s, ROOT, 0);
    assert!(cluster.client("scancel", &[&job]).status.success());
    let e = s.wait_events(60, "run.exited", Some(ROOT), 1)[0].clone();
    assert_eq!(e["reason"], "lost", "{e}");
    assert_eq!(e["outcome"], "retry", "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap_or_default()
            .contains("cancelled outside smithfs"),
        "{e}"
    );
    assert_eq!(s.wait_file(60, "results/final.md"), "retried\n");
    assert_eq!(strs(&s.metas(ROOT), "wake"), ["task", "retry"]);
    assert_ne!(job_of(&s, ROOT, 1), job, "the retry is a job of its own");
}

/// `sbatch` absent (not on the daemon's PATH): the run fails with the reason in the journal
/// and its `messages.log`, and the mount stays up.
#[test]
fn sbatch_absent_fails_the_run_and_the_mount_stays_up() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let cfg =
        json!({"launcher": {"kind": "slurm", "listen": "127.0.0.1:0"}, "agent": {"retries": 0}});
    let s = Sm::with(
        MountOpts {
            allow_other: true,
            unsandboxed: true,
            env: vec![("PATH", "/nonexistent")],
            ..MountOpts::default()
        },
        cfg,
    );
    s.task("ok\n");
    let e = s.wait_events(30, "run.exited", Some(ROOT), 1)[0].clone();
    assert_eq!(e["reason"], "spawn_error", "{e}");
    let error = e["error"].as_str().unwrap_or_default();
    assert!(error.contains("sbatch"), "{e}");
    let log = s
        .read("smiths/smith-root/conversations/run-0001/messages.log")
        .unwrap_or_default();
    assert!(log.contains("sbatch"), "{log:?}");
    s.wait_state(10, ROOT, "failed");
    // The mount is up: the tree and the control directory answer.
    assert!(s.read("config.json").is_some());
    assert_eq!(s.state(ROOT), "failed");
}

/// notes R21: a daemon killed with a job in flight leaves `run.started` with its `job_id` open;
/// the job's remote mount fails closed; the next `mount --resume` scancels the job (it does not
/// reconnect) and re-queues the run, whose new job finishes the work.
#[test]
fn a_killed_daemons_job_is_cancelled_at_the_next_mount_and_resume_finishes() {
    let Some(cluster) = cluster() else { return };
    let s = on_cluster_opts(
        &cluster,
        json!({"agent": {"retries": 0, "kill_grace_secs": 2}}),
        true,
        Vec::new(),
    );
    s.task("waitonce\n");
    s.wait_file(60, "smiths/smith-root/private/started");
    let job = job_of(&s, ROOT, 0);
    let daemon = crate::common::find_daemon(s.m.path()).expect("daemon");
    // SAFETY: SIGKILL to the daemon this test's mount started.
    assert_eq!(unsafe { libc::kill(daemon, libc::SIGKILL) }, 0);
    poll_until(Duration::from_secs(10), "the daemon to die", || {
        gone(daemon)
    });
    poll_until(
        Duration::from_secs(10),
        "the mount point to report the dead mount",
        || std::fs::metadata(s.m.path()).is_err(),
    );
    // The job still runs: nobody cancelled it yet.
    assert_eq!(job_state(&cluster, &job).as_deref(), Some("RUNNING"));
    let dir = s.dir();
    crate::common::smithfs(["umount", dir.as_str()]).expect_ok("umount of a dead mount");
    let r = crate::common::run(
        std::process::Command::new(crate::common::SMITHFS)
            .args(["mount", dir.as_str(), "--allow-other", "--resume"])
            .env("SLURM_CONF", cluster.conf()),
    );
    assert_eq!(r.code, Some(0), "mount --resume: {r:?}");
    poll_until(
        Duration::from_secs(30),
        "the leftover job to be cancelled",
        || job_state(&cluster, &job).filter(|st| st == "CANCELLED"),
    );
    let intr = s.wait_events(20, "run.interrupted", Some(ROOT), 1);
    assert_eq!(intr[0]["run_id"], "run-0001");
    assert_eq!(s.wait_file(60, "results/final.md"), "resumed\n");
    assert_ne!(
        job_of(&s, ROOT, 1),
        job,
        "the resumed run is a job of its own"
    );
}

/// A job state smithfs does not know (here `WIBBLE`, from an `squeue` on the daemon's PATH that
/// renames RUNNING) ends the run as `lost` with the state named in `run.exited`'s `error`, and
/// the job is cancelled rather than left running unfollowed.
#[test]
fn a_job_state_smithfs_does_not_know_ends_the_run_lost_and_cancels_the_job() {
    let Some(cluster) = cluster() else { return };
    let bin = tempfile::Builder::new()
        .prefix("smithfs-fake-squeue-")
        .tempdir()
        .expect("tempdir");
    let squeue = bin.path().join("squeue");
    std::fs::write(
        &squeue,
        "#!/bin/sh\n/usr/bin/squeue \"$@\" | sed 's/|RUNNING|/|WIBBLE|/'\n",
    )
    .expect("fake squeue");
    std::fs::set_permissions(&squeue, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let path: &'static str = Box::leak(
        format!(
            "{}:{}",
            bin.path().display(),
            std::env::var("PATH").unwrap_or_default()
        )
        .into_boxed_str(),
    );
    let s = on_cluster_env(
        &cluster,
        json!({"agent": {"retries": 0}}),
        true,
        Vec::new(),
        vec![("PATH", path)],
    );
    s.task("waitonce\n");
    let e = s.wait_events(60, "run.exited", Some(ROOT), 1)[0].clone();
    assert_eq!(e["reason"], "lost", "{e}");
    let error = e["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("WIBBLE") && error.contains("does not know"),
        "{e}"
    );
    let job = job_of(&s, ROOT, 0);
    poll_until(Duration::from_secs(30), "the job to be cancelled", || {
        job_state(&cluster, &job).filter(|st| st == "CANCELLED")
    });
    s.wait_state(10, ROOT, "failed");
}

/// notes XT21 through a Slurm job: a parent's loader variables in its child's `agent.env` reach
/// `sbatch`, the batch shell and `attach` (all root) only encoded, and the agent (sandboxed, not
/// root) by their names: nothing is written in the root-only trap directory.
#[test]
fn a_childs_loader_variables_reach_only_its_agent_through_a_slurm_job() {
    let Some(cluster) = cluster() else { return };
    let conf = cluster.conf_env();
    crate::sandbox_env::loader_variables_of_a_child_with(
        "cgroup",
        json!({"kind": "slurm", "listen": "127.0.0.1:0"}),
        vec![("SLURM_CONF", conf)],
    );
}

/// The `smithfs attach` of `cluster`'s Slurm job `job` on this host's node: the process named
/// `smithfs` whose environment holds `SLURM_JOB_ID=JOB` and the cluster's `SLURM_CONF` (job ids
/// start at 1 on every throwaway cluster of tests that run at once); its host pid (the cluster's
/// processes live in a pid namespace of their own).
fn attach_of_job(cluster: &Cluster, job: &str) -> Option<i32> {
    let want = format!("SLURM_JOB_ID={job}");
    let conf = format!("SLURM_CONF={}", cluster.conf().display());
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        if comm.trim() != "smithfs" {
            return None;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let mut vars = env.split(|b| *b == 0);
        (vars.clone().any(|v| v == want.as_bytes()) && vars.any(|v| v == conf.as_bytes()))
            .then_some(pid)
    })
}

/// How the node's job dies under its writing agent.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// `scancel JOB` by someone other than smithfs.
    Scancel,
    /// SIGKILL to the job's `smithfs attach` (the batch script's exec), by its host pid.
    Attach,
}

/// docs/SPEC.md §13 (notes R43): a job killed while its agent holds `outbox/result.md` open and
/// is writing it — by an `scancel` (whose TERM kills the agent, so its close reaches the daemon)
/// or by a SIGKILL of its `attach` (the connection drops, the write never completes) — is `lost`
/// by Slurm's verdict, and what it wrote is no result: no `results/final.md`, the file moved out
/// of the outbox into the run's directory (`result.md.unpublished`), so the retry, a job of its
/// own, starts without it; the retry's result is the final one.
fn a_job_killed_mid_write(kill: Kill) {
    let Some(cluster) = cluster() else { return };
    let s = on_cluster(&cluster, json!({"agent": {"retries": 1}}));
    s.task("holdwrite\n");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while s.read("smiths/smith-root/private/holding").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "[{kill:?}] the run never held its result open; events: {:?}\nlog: {:?}",
            s.events(),
            s.read("smiths/smith-root/conversations/run-0001/messages.log")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let job = job_of(&s, ROOT, 0);
    match kill {
        Kill::Scancel => assert!(cluster.client("scancel", &[&job]).status.success()),
        Kill::Attach => {
            let pid = poll_until(Duration::from_secs(10), "the job's attach", || {
                attach_of_job(&cluster, &job)
            });
            // SAFETY: SIGKILL to the attach process of the job this test submitted.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        }
    }
    let e = s.wait_events(60, "run.exited", Some(ROOT), 1)[0].clone();
    assert_eq!(e["reason"], "lost", "[{kill:?}] {e}");
    assert_eq!(e["outcome"], "retry", "[{kill:?}] {e}");
    // The lost run's write is no result: not the final one, not in the outbox for the retry.
    assert_eq!(s.read("results/final.md"), None, "[{kill:?}]");
    let error = e["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("result.md.unpublished"),
        "[{kill:?}] the half-written result is said to be set aside: {e}"
    );
    assert_eq!(
        s.wait_file(60, "results/final.md"),
        "retried\n",
        "[{kill:?}]"
    );
    // The half-written file is kept in the lost run's directory, never in the outbox.
    let aside = s
        .read("smiths/smith-root/conversations/run-0001/result.md.unpublished")
        .unwrap_or_default();
    assert!(aside.starts_with("partial\n"), "[{kill:?}] {aside:?}");
    assert_eq!(
        s.read("smiths/smith-root/private/saw-partial"),
        None,
        "[{kill:?}] the retry found the lost run's write in its outbox"
    );
    assert_eq!(strs(&s.metas(ROOT), "wake"), ["task", "retry"]);
    assert_ne!(job_of(&s, ROOT, 1), job, "the retry is a job of its own");
    s.wait_state(10, ROOT, "done");
}

#[test]
fn a_job_scancelled_mid_write_publishes_nothing_and_its_retry_publishes() {
    a_job_killed_mid_write(Kill::Scancel);
}

#[test]
fn a_jobs_attach_killed_mid_write_publishes_nothing_and_its_retry_publishes() {
    a_job_killed_mid_write(Kill::Attach);
}

/// docs/SPEC.md §12, §13 (notes R30): tests/fixtures/escapes.sh as the sandboxed agent of a Slurm
/// job — every route fails exactly as in a loopback run (the same check,
/// `remote_runs::sandboxed_remote_runs_let_nothing_escape`), its result still published through
/// the job's remote mount. Both identity modes.
fn a_slurm_jobs_sandboxed_agent_escapes_nothing(mode: &'static str) {
    let Some(cluster) = cluster() else { return };
    let conf = cluster.conf_env();
    crate::remote_runs::sandboxed_remote_runs_let_nothing_escape(
        mode,
        json!({"kind": "slurm", "listen": "127.0.0.1:0"}),
        vec![("SLURM_CONF", conf)],
    );
}

#[test]
fn a_slurm_jobs_sandboxed_agent_escapes_nothing_cgroup() {
    a_slurm_jobs_sandboxed_agent_escapes_nothing("cgroup");
}

#[test]
fn a_slurm_jobs_sandboxed_agent_escapes_nothing_ancestry() {
    a_slurm_jobs_sandboxed_agent_escapes_nothing("ancestry");
}

/// The `launcher` checks of `smithfs doctor DIR --json`, by name: (status, detail).
fn doctor_launcher(
    s: &Sm,
) -> (
    Option<i32>,
    std::collections::BTreeMap<String, (String, String)>,
) {
    let out = s.cli("doctor", &["--json"]);
    let checks: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}\n{}", out.stdout));
    let by_name = checks
        .as_array()
        .expect("a list")
        .iter()
        .filter(|c| {
            matches!(
                c["check"].as_str(),
                Some("launcher" | "advertise" | "listener")
            )
        })
        .map(|c| {
            (
                c["check"].as_str().unwrap_or_default().to_string(),
                (
                    c["status"].as_str().unwrap_or_default().to_string(),
                    c["detail"].as_str().unwrap_or_default().to_string(),
                ),
            )
        })
        .collect();
    (out.code, by_name)
}

/// `smithfs doctor DIR` checks the listener (issue 28, docs/SPEC.md §6, §13, notes R44): on a
/// live slurm mount it finds the listener the daemon runs and finishes a TLS handshake pinning
/// its certificate at the address the nodes dial (no ticket, no run), and warns that nodes other
/// than this host cannot dial `127.0.0.1`; a `launcher.advertise` that does not resolve fails
/// both checks (exit 1); unmounted, the listener is reported as not running.
#[test]
fn doctor_checks_the_listener_and_the_advertised_address() {
    let Some(cluster) = cluster() else { return };
    let s = on_cluster(&cluster, json!({}));
    let (_, c) = doctor_launcher(&s);
    assert_eq!(c["launcher"].0, "ok", "{c:?}");
    assert!(c["launcher"].1.starts_with("slurm:"), "{c:?}");
    assert_eq!(c["listener"].0, "ok", "{c:?}");
    assert!(c["listener"].1.contains("accepts TLS"), "{c:?}");
    assert_eq!(c["advertise"].0, "warn", "{c:?}");
    assert!(c["advertise"].1.contains("only jobs on this host"), "{c:?}");
    // The handshake is no run: nothing was journaled for it.
    assert!(s.of("run.started", None).is_empty());
    drop(s);

    // An advertised name that does not resolve: every job's attach would fail to connect.
    let s = on_cluster(
        &cluster,
        json!({"launcher": {"advertise": "no-such-host.invalid:7000"}}),
    );
    let (code, c) = doctor_launcher(&s);
    assert_eq!(c["advertise"].0, "fail", "{c:?}");
    assert!(c["advertise"].1.contains("does not resolve"), "{c:?}");
    // The listener is probed where the nodes dial it: there is no such place.
    assert_eq!(c["listener"].0, "fail", "{c:?}");
    assert_eq!(code, Some(1), "a failed check is exit 1");
    let dir = s.dir();
    crate::common::smithfs(["umount", dir.as_str()]).expect_ok("umount");
    let out = crate::common::smithfs(["doctor", dir.as_str(), "--json"]);
    assert!(
        out.stdout
            .contains("is not mounted: the listener runs only while it is"),
        "{}",
        out.stdout
    );
}

/// `last_run.where` keeps the job's node across a daemon restart (notes R22): the journal gives
/// `slurm:JOBID` only, the run's `meta.json` the node, and the status after a remount is
/// `slurm:JOBID@n1` as before it.
#[test]
fn the_jobs_node_is_kept_across_a_remount() {
    let Some(cluster) = cluster() else { return };
    let mut s = on_cluster(&cluster, json!({"agent": {"retries": 0}}));
    s.task("uid\n");
    s.wait_file(120, "results/final.md");
    s.wait_state(30, ROOT, "done");
    let job = job_of(&s, ROOT, 0);
    let want = format!("slurm:{job}@n1");
    let where_now = || smith_of(&s.status(), ROOT)["last_run"]["where"].clone();
    poll_until(Duration::from_secs(10), "the node in the status", || {
        (where_now() == want.as_str()).then_some(())
    });
    s.m.umount();
    s.m.mount();
    let lr = smith_of(&s.status(), ROOT)["last_run"].clone();
    assert_eq!(lr["where"], want.as_str(), "after the remount: {lr}");
    assert_eq!(lr["run_id"], "run-0001", "{lr}");
    let out = s.cli("status", &[]);
    assert!(out.stdout.contains(&format!("on {want}")), "{}", out.stdout);
}

/// Attacks of the hostile and hardening suites (docs/PROTOCOL-NOTES.md R56, R57) made by the
/// agent of Slurm jobs on the one-node cluster, as through loopback runs: a root agent without
/// the sandbox is confined (escapes.sh finds nothing; with `agent.confine: false` it keeps
/// `CAP_SYS_ADMIN`), the agent's umask is the mounter's 027 (sandboxed and not: the daemon's own
/// is 0), it holds only fds 0–2, another smith's FIFO and socket are EACCES, and chown to root is
/// EPERM. cgroup mode.
#[test]
fn hostile_and_hardening_attacks_through_slurm_jobs() {
    let Some(cluster) = cluster() else { return };
    let slurm = crate::common::launcher::Launcher::Slurm(cluster.conf_env());
    crate::hardening::agent_is_confined("cgroup", slurm);
    crate::hardening::runs_take_the_mounters_umask("cgroup", slurm);
    crate::hardening::agents_hold_only_stdio("cgroup", slurm);
    crate::hostile::rendezvous_of_another_smith("cgroup", slurm);
    crate::hostile::no_file_given_away("cgroup", slurm);
}
