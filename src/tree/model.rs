//! Pure model of the smith tree: ids and relations (PROTOCOL.md §1).

/// Index of a registered smith in the daemon's registry. Stable for the life of a mount;
/// never reused for another smith while the mount lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SmithIdx(pub u32);
