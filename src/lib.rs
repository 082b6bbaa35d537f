//! smithfs: a FUSE filesystem that enforces the Agent Smith multi-agent protocol
//! (`docs/SPEC.md`) at the kernel boundary.
//!
//! Layering (the module map of `docs/ARCHITECTURE.md`, enforced by
//! `architecture::imports_follow_the_architecture_map`): `cli → daemon → {reload, fuse, sched,
//! fs}`, `fuse → fs`, `sched → fs`'s ports, `fs → {policy, identity, limits, tree, trigger}`, and
//! everyone → `backing` (the store layer) and `sys` (`/proc`, cgroups, the mount table), the
//! leaves. The pure modules (`policy`, `sys::procfs`, `tree::model`, `config`) import only types.

#![deny(clippy::undocumented_unsafe_blocks)]

mod architecture;
pub mod backing;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod fs;
pub mod fuse;
pub mod identity;
pub mod limits;
pub mod policy;
pub mod process;
pub mod reload;
pub mod remote;
pub mod sandbox;
pub mod sched;
pub mod sys;
pub mod time;
pub mod tree;
pub mod trigger;
pub mod ui;
pub mod workspace;
