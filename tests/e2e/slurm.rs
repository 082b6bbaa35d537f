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
