//! Build script: the git commit `smithfs --version` prints (`SMITHFS_GIT_COMMIT`).
//!
//! From `$SMITHFS_GIT_COMMIT` when set (packagers building from a tarball), else
//! `git rev-parse --short=12 HEAD`, else `unknown` (not a git checkout, or no git). It reruns
//! only when HEAD moves (`.git/HEAD`, the branch's ref file, `packed-refs`) or the variable
//! changes, not on every source edit.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

/// A file whose change means HEAD moved, when it exists (a missing path would make cargo rerun
/// this script on every build).
fn watch(git_path: &str) {
    if let Some(p) = git(&["rev-parse", "--git-path", git_path]).map(PathBuf::from) {
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SMITHFS_GIT_COMMIT");
    let commit = std::env::var("SMITHFS_GIT_COMMIT")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    if commit.is_some() && std::env::var_os("SMITHFS_GIT_COMMIT").is_none() {
        watch("HEAD");
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(&branch);
        }
        watch("packed-refs");
    }
    println!(
        "cargo:rustc-env=SMITHFS_GIT_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
