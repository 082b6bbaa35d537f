//! `mount -o OPT[,OPT…]` (docs/SPEC.md §6): the comma-separated options as fstab writes them and
//! mount(8) hands them to `mount.fuse.smithfs`. Pure: lists in, [`MountOptions`] or one usage
//! line out (docs/PROTOCOL-NOTES.md O40).

use clap::ValueEnum;

use super::ids::UsageError;
use crate::config::{IdentityMode, OperatorMode};
use crate::fuse::transport::Transport;

/// What `-o` asked for. `None`/`false`: not named (the flags or the defaults decide).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountOptions {
    /// `allow_other`.
    pub allow_other: bool,
    /// `identity=auto|cgroup|ancestry`.
    pub identity: Option<IdentityMode>,
    /// `operator=read-write|read-only`.
    pub operator: Option<OperatorMode>,
    /// `transport=auto|io-uring|dev-fuse`.
    pub transport: Option<Transport>,
    /// `resume`.
    pub resume: bool,
    /// `no_passthrough`.
    pub no_passthrough: bool,
}

/// Options mount(8) and systemd pass along, which mean nothing to the filesystem (§6).
const IGNORED: &[&str] = &["defaults", "nofail", "noauto", "_netdev"];
/// Options mount(8) adds to every helper call (`rw`), or that every smithfs mount has anyway
/// (`nosuid`, `nodev`): accepted, no effect (O40).
const IMPLIED: &[&str] = &["rw", "nosuid", "nodev"];

/// `auto, cgroup or ancestry`.
fn one_of(values: &[&str]) -> String {
    match values {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// The command-line spelling of `value` (`read-only`, `io-uring`), as clap shows and takes it.
fn spelling<T: ValueEnum>(value: &T) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

/// The value of `-o NAME=VALUE`, spelled as its command-line flag takes it.
fn pick<T: ValueEnum>(name: &str, value: Option<&str>) -> Result<T, UsageError> {
    let allowed = || -> Vec<String> { T::value_variants().iter().map(spelling).collect() };
    match value {
        Some(v) => T::value_variants()
            .iter()
            .find(|t| spelling(*t) == v)
            .cloned()
            .ok_or_else(|| {
                let allowed = allowed();
                let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
                UsageError(format!("-o {name}={v}: expected {}", one_of(&allowed)))
            }),
        None => Err(UsageError(format!(
            "-o {name} needs a value: {name}={}",
            allowed().join("|")
        ))),
    }
}

/// Parse every `-o` argument in order; within and across them a later value wins, as when
/// mount(8) appends the command line's options to fstab's.
///
/// # Errors
/// One line naming the option: unknown (`-o foo: unknown mount option; smithfs takes …`), a value
/// where none belongs, a missing or bad value, or `ro`.
pub fn parse<S: AsRef<str>>(lists: &[S]) -> Result<MountOptions, UsageError> {
    let mut o = MountOptions::default();
    for opt in lists
        .iter()
        .flat_map(|l| l.as_ref().split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt, None),
        };
        let flag = |set: &mut bool| match value {
            None => {
                *set = true;
                Ok(())
            }
            Some(_) => Err(UsageError(format!("-o {opt}: {name} takes no value"))),
        };
        match name {
            "allow_other" => flag(&mut o.allow_other)?,
            "resume" => flag(&mut o.resume)?,
            "no_passthrough" => flag(&mut o.no_passthrough)?,
            "identity" => o.identity = Some(pick(name, value)?),
            "operator" => o.operator = Some(pick(name, value)?),
            "transport" => o.transport = Some(pick(name, value)?),
            "ro" => {
                return Err(UsageError(
                    "-o ro: a smithfs mount is read-write (for a read-only operator: -o operator=read-only)"
                        .into(),
                ))
            }
            n if value.is_none() && (IGNORED.contains(&n) || IMPLIED.contains(&n)) => {}
            n if n.starts_with("x-systemd.") => {}
            _ => {
                return Err(UsageError(format!(
                    "-o {opt}: unknown mount option; smithfs takes allow_other, identity=, operator=, transport=, resume, no_passthrough (and ignores defaults, nofail, noauto, _netdev, x-systemd.*)"
                )))
            }
        }
    }
    Ok(o)
}

/// Merge a flag and the same setting from `-o`: either alone, or both when they agree.
///
/// # Errors
/// They disagree: `--NAME A conflicts with -o NAME=B` (O40).
pub fn merge<T: ValueEnum + PartialEq>(
    name: &str,
    flag: Option<T>,
    opt: Option<T>,
) -> Result<Option<T>, UsageError> {
    match (flag, opt) {
        (Some(f), Some(o)) if f != o => Err(UsageError(format!(
            "--{} {} conflicts with -o {name}={}",
            name.replace('_', "-"),
            spelling(&f),
            spelling(&o)
        ))),
        (f, o) => Ok(f.or(o)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(lists: &[&str]) -> MountOptions {
        parse(lists).unwrap_or_else(|e| panic!("{lists:?}: {e}"))
    }

    fn err(lists: &[&str]) -> String {
        parse(lists).expect_err("refused").0
    }

    #[test]
    fn accepted_options() {
        let d = MountOptions::default;
        let table: &[(&[&str], MountOptions)] = &[
            (&[], d()),
            (&[""], d()),
            (&["defaults"], d()),
            (
                &["defaults,nofail,noauto,_netdev,x-systemd.automount,x-systemd.requires=a.mount"],
                d(),
            ),
            (&["rw,nosuid,nodev"], d()),
            (
                &["allow_other"],
                MountOptions {
                    allow_other: true,
                    ..d()
                },
            ),
            (
                &["resume,no_passthrough"],
                MountOptions {
                    resume: true,
                    no_passthrough: true,
                    ..d()
                },
            ),
            (
                &["identity=cgroup,operator=read-only,transport=dev-fuse"],
                MountOptions {
                    identity: Some(IdentityMode::Cgroup),
                    operator: Some(OperatorMode::ReadOnly),
                    transport: Some(Transport::DevFuse),
                    ..d()
                },
            ),
            // Repeatable; a later value wins (fstab's options, then the command line's).
            (
                &["identity=cgroup", "identity=ancestry,transport=io-uring"],
                MountOptions {
                    identity: Some(IdentityMode::Ancestry),
                    transport: Some(Transport::IoUring),
                    ..d()
                },
            ),
            // What mount(8) passes a helper for `defaults,nofail,allow_other`.
            (
                &["rw,allow_other,nofail,_netdev"],
                MountOptions {
                    allow_other: true,
                    ..d()
                },
            ),
            (
                &[" allow_other , ,resume"],
                MountOptions {
                    allow_other: true,
                    resume: true,
                    ..d()
                },
            ),
        ];
        for (lists, want) in table {
            assert_eq!(&ok(lists), want, "{lists:?}");
        }
    }

    #[test]
    fn refused_options_are_named() {
        let table: &[(&[&str], &str)] = &[
            (&["bogus"], "-o bogus: unknown mount option"),
            (&["allow_other,bogus=1"], "-o bogus=1: unknown mount option"),
            (&["allow_root"], "-o allow_root: unknown mount option"),
            (&["user"], "-o user: unknown mount option"),
            (&["x-other"], "-o x-other: unknown mount option"),
            (&["defaults=1"], "-o defaults=1: unknown mount option"),
            (
                &["allow_other=yes"],
                "-o allow_other=yes: allow_other takes no value",
            ),
            (&["resume=1"], "-o resume=1: resume takes no value"),
            (
                &["identity"],
                "-o identity needs a value: identity=auto|cgroup|ancestry",
            ),
            (
                &["identity="],
                "-o identity=: expected auto, cgroup or ancestry",
            ),
            (
                &["identity=pid"],
                "-o identity=pid: expected auto, cgroup or ancestry",
            ),
            (
                &["operator=rw"],
                "-o operator=rw: expected read-write or read-only",
            ),
            (
                &["transport=io_uring"],
                "-o transport=io_uring: expected auto, io-uring or dev-fuse",
            ),
            (&["ro"], "-o ro: a smithfs mount is read-write"),
        ];
        for (lists, want) in table {
            let e = err(lists);
            assert!(e.starts_with(want), "{lists:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn flags_and_options_merge_or_conflict() {
        let a = || Some(IdentityMode::Cgroup);
        let b = || Some(IdentityMode::Ancestry);
        assert_eq!(merge("identity", a(), None).unwrap(), a());
        assert_eq!(merge("identity", None, b()).unwrap(), b());
        assert_eq!(merge("identity", a(), a()).unwrap(), a());
        assert_eq!(merge::<IdentityMode>("identity", None, None).unwrap(), None);
        assert_eq!(
            merge("identity", a(), b()).unwrap_err().0,
            "--identity cgroup conflicts with -o identity=ancestry"
        );
        assert_eq!(
            merge(
                "transport",
                Some(Transport::IoUring),
                Some(Transport::DevFuse)
            )
            .unwrap_err()
            .0,
            "--transport io-uring conflicts with -o transport=dev-fuse"
        );
    }
}
