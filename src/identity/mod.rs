//! Who is calling: the identity of the process behind a FUSE request (docs/SPEC.md §2).

pub mod ancestry;
pub mod cgroup;
pub mod resolve;

pub use resolve::{Effective, IdentityError, Resolver};

use crate::tree::model::SmithIdx;

/// The identity a request is judged by (docs/SPEC.md §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A process started as a smith's run or bound to it, or a descendant of such a process.
    Smith(SmithIdx),
    /// A process outside every smith, with no daemon among its ancestors.
    Operator,
    /// Request pid 0, or an unbound descendant of the daemon: lookup and stat only.
    Unknown,
}
