//! The identity layer: the resolver (cgroup and ancestry modes) and the keeper of `smithfs
//! run`, on real processes, without a mount. One binary (issue 9: test binaries grouped by
//! layer).

mod keeper;
mod resolver;
