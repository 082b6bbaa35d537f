//! Real mounts end to end, driven by real processes: scheduling, the CLI and operator
//! experience, resource limits, workspaces, the real agent CLIs, everyday tools, hardening,
//! unprivileged mounts and the io_uring transport; one module per suite. Each test has its own
//! `TestMount`, unmounted by its guard; a test that cannot use `/dev/fuse` skips with a message.
//! The filesystem's own suites are in `tests/mount` (issue 9: test binaries grouped by layer —
//! no-kernel `tests/fs`, plain-dir `tests/sched`, `tests/identity`, real mounts `tests/mount`
//! and `tests/e2e`).

#[macro_use]
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/slurm.rs"]
mod slurm_cluster;

mod agent_clis;
mod hardening;
mod hostile;
mod kernel_cache;
mod limits_cgroup;
mod limits_reload;
mod limits_storage;
mod operator_cli;
mod ops;
mod ops_daemon;
mod remote_faults;
mod remote_runs;
mod sandbox;
mod sandbox_env;
mod sandbox_layers;
mod sandbox_run;
mod sched;
mod slurm;
mod tools;
mod unprivileged;
mod uring;
mod workspace;
