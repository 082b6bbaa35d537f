//! The low layer over the Linux system interfaces that are not the store: `/proc` parsing
//! (`procfs.rs`), cgroup v2 primitives (`cgroup.rs`), the mount table as smithfs reads it
//! (`mount.rs`), whether the CPUs have headroom (`headroom.rs`), and `$PATH` searched as
//! execvp(3) searches it (`path.rs`). It imports nothing of the crate, so `identity`, `limits`,
//! `fuse`, `remote`, `process`, `sched` and `cli` can all use it without importing each other.

pub mod cgroup;
pub mod headroom;
pub mod mount;
pub mod path;
pub mod procfs;
