//! The scheduler layer without a mount: the daemon's scheduler driven on a plain directory
//! (`common::sched`), with real runs and hooks as processes. One binary, one module per area
//! (issue 9: test binaries grouped by layer).

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod cli;
mod hooks;
mod kill;
mod run;
