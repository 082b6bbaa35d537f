//! Real mounts driven by real processes, the filesystem itself: every operation of the core
//! filesystem (`core_fs`) and the access rules of docs/SPEC.md §2–§4, §7 (`isolation`). These
//! two suites run again over FUSE over io_uring in CI (`scripts/test.sh`, stage uring). The other
//! real-mount suites are in `tests/e2e` (issue 9: test binaries grouped by layer).

#[macro_use]
#[path = "../common/mod.rs"]
mod common;
// Only `start` and `conf` here: the Slurm variants of the remote battery (isolation.rs).
#[allow(dead_code)]
#[path = "../common/slurm.rs"]
mod slurm_cluster;

mod core_fs;
mod isolation;
mod sandbox_tree;
