//! A throwaway Slurm cluster for tests (docs/SPEC.md §13): `scripts/slurm/cluster.sh` starts
//! munged, slurmctld and one slurmd per node in a pid namespace of their own under a temp dir;
//! [`Cluster`]'s `Drop` stops it (one signal to that namespace's PID 1), also when the test
//! fails. Clients reach it through [`Cluster::conf`] (`SLURM_CONF`), never /etc/slurm.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The cluster script, from the repository root.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/slurm/cluster.sh");

/// A running cluster; stopped when dropped.
pub struct Cluster {
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts a cluster of `nodes` nodes (1 or 2: `n1`, `n2`), or `None` when this host has no
    /// Slurm (the caller then fails or skips, saying so). Panics when Slurm is installed but the
    /// cluster does not come up (the script prints the logs' tails).
    pub fn start(nodes: u32) -> Option<Cluster> {
        if Command::new("slurmctld").arg("-V").output().is_err() {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("smithfs-slurm.")
            .tempdir()
            .ok()?;
        let out = Command::new(SCRIPT)
            .arg("start")
            .arg(dir.path())
            .args(["--nodes", &nodes.to_string()])
            .output()
            .expect("run scripts/slurm/cluster.sh");
        let cluster = Cluster { dir };
        assert!(
            out.status.success(),
            "cluster.sh start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(cluster)
    }

    /// The cluster's directory (configuration, spool, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `SLURM_CONF` for clients of this cluster.
    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// [`Cluster::conf`] as the `&'static str` a mount's environment takes (`SLURM_CONF`); leaked,
    /// once per test.
    pub fn conf_env(&self) -> &'static str {
        Box::leak(self.conf().to_string_lossy().into_owned().into_boxed_str())
    }

    /// Runs a Slurm client command (`sbatch`, `squeue`, `scontrol`, `scancel`, `sinfo`) against
    /// this cluster.
    pub fn client(&self, program: &str, args: &[&str]) -> Output {
        Command::new(program)
            .args(args)
            .env("SLURM_CONF", self.conf())
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT)
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}
