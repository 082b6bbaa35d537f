//! The sandbox every run of a smith starts in (docs/SPEC.md §12).
//!
//! - `user.rs`: the agents' user — the unprivileged uid and gid runs execute as, resolved once
//!   at mount (`sandbox.uid`, `SUDO_UID`, or one smithfs allocates and records), the per-smith
//!   uids of `sandbox.uid_per_smith`, and the passwd/group entries of a run's view.
//!
//! May import `backing`, `config` and `tree::model` (types only).

pub mod user;

pub use user::{AgentUser, HostFiles, UserError, UserSource};
