//! The no-kernel layer: `SmithFs` driven directly on a store made by `smithfs init` in a temp
//! dir, with made-up callers and identities and a recording scheduler link, one module per
//! family of operations (issue 9). The test plays the kernel: it looks names up before using
//! them and releases what it opens. Nothing here mounts, so it runs wherever the crate builds.

mod world;

mod control;
mod create;
mod dir;
mod entries;
mod io;
mod links;
mod quota;
mod remote;
mod remove;
mod rename;
mod xattr;
