//! How smithfs runs git (docs/SPEC.md §11): with its configuration isolated, so that no git smithfs or
//! the operator's commands run (scaffold, `diff`, `accept`, the auto-commit) executes anything a smith
//! configured — hooks, `core.fsmonitor`, `diff.external`, textconv and filter drivers from a
//! repository's `.git/config` (and what it includes) or `.gitattributes`.
//!
//! The recipe: no system or global config (`GIT_CONFIG_NOSYSTEM=1`, `GIT_CONFIG_GLOBAL=/dev/null`),
//! the fixed `-c` overrides of [`SAFE_FLAGS`], and for every driver command the repository's own config
//! names an empty override ([`overrides`], from `git config --list --name-only --includes`).
//! Attributes can only name drivers that config defines (or built-in conversions), so with every
//! driver command emptied they run nothing. Diffs also get `--no-ext-diff --no-textconv`.

use std::ffi::OsStr;
use std::process::Command;

/// The environment of every git smithfs runs: what to set (docs/SPEC.md §11).
pub const ENV_SET: [(&str, &str); 6] = [
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_ATTR_NOSYSTEM", "1"),
    ("GIT_OPTIONAL_LOCKS", "0"),
    ("LC_ALL", "C"),
];

/// The environment variables removed from every git smithfs runs: ones that would point git at other
/// repositories, configuration or programs than the command line names.
pub const ENV_REMOVE: [&str; 14] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CONFIG",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_PARAMETERS",
    "GIT_EXEC_PATH",
    "GIT_EXTERNAL_DIFF",
    "GIT_PAGER",
    "GIT_EDITOR",
    "GIT_SSH_COMMAND",
    "GIT_ASKPASS",
];

/// The fixed `-c` overrides (each preceded by `-c` on the command line): no hooks, no fsmonitor, no
/// global attributes, no pager, editor, signing program, credential helper or ssh command.
///
/// Git's ownership check stays on (no `safe.directory`): a git that reads a smith's repository
/// runs as that smith, in its sandbox (the auto-commit, `diff`, `accept`'s reading half), so the
/// repository is its own; see [`TRUST_ANY_OWNER`] for the two places that waive it.
pub const SAFE_FLAGS: [&str; 12] = [
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.attributesFile=/dev/null",
    "core.pager=cat",
    "core.editor=true",
    "sequence.editor=true",
    "core.sshCommand=",
    "core.askPass=",
    "credential.helper=",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "protocol.ext.allow=never",
];

/// The `-c` setting that waives git's ownership check ("dubious ownership"), for the two gits that
/// read a repository of another uid by design (docs/PROTOCOL-NOTES.md W19): `init` (the operator's
/// `smithfs init --repo PATH` as root, reading PATH, the operator's own project) and the scaffold's
/// git (the new child's uid reading its parent's `workspace/.git` inside the Landlock domain of
/// W16: whatever the parent's repository makes it run runs as the parent's own descendant, reading
/// only what the parent may read, writing only the new workspace). Never for a git that runs as
/// root, the operator or PATH's owner on a smith's repository.
pub const TRUST_ANY_OWNER: &str = "safe.directory=*";

/// The `-c` overrides that neutralise the driver commands a repository's config defines, given the
/// output of `git config --list --name-only --includes` (one key a line, as git prints it: section and
/// key lower-case, subsection as written). Pure.
///
/// Emptied: `filter.*.{clean,smudge,process}` (and `filter.*.required` set to false, so an emptied
/// filter is not an error), `diff.*.{command,textconv}`, `diff.external`, `merge.*.driver`,
/// `credential.*.helper`, `gpg.program` and `gpg.*.program`. Unknown or harmless keys give nothing.
///
/// # Errors
/// One of those keys has a name `-c NAME=VALUE` cannot say (docs/PROTOCOL-NOTES.md W21): a `=`
/// in its subsection (git splits `-c` at the first `=`, so `-c filter.a=b.clean=` sets
/// `filter.a`, and the driver `a=b` stays armed), or a byte that is not UTF-8 (shown here as
/// U+FFFD, so the override would name another driver). Such a repository is refused, never run.
pub fn overrides(config_names: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |s: String| {
        if !out.contains(&s) {
            out.push(s);
        }
    };
    for name in config_names
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        let Some((section, rest)) = name.split_once('.') else {
            continue;
        };
        let (sub, key) = match rest.rsplit_once('.') {
            Some((sub, key)) => (Some(sub), key),
            None => (None, rest),
        };
        let section = section.to_ascii_lowercase();
        let key = key.to_ascii_lowercase();
        let driver = matches!(
            (section.as_str(), key.as_str()),
            ("filter", "clean" | "smudge" | "process" | "required")
                | ("diff", "command" | "textconv" | "external")
                | ("merge", "driver")
                | ("credential", "helper")
                | ("gpg", "program")
        );
        if driver && sub.is_some_and(|s| s.contains(['=', '\u{fffd}'])) {
            return Err(format!(
                "its git configuration names a driver git's -c cannot override ({}: a '=' or a byte that is not UTF-8 in its name): refused",
                name.escape_debug()
            ));
        }
        match (section.as_str(), sub, key.as_str()) {
            ("filter", Some(sub), "clean" | "smudge" | "process") => {
                push(format!("filter.{sub}.{key}="));
                push(format!("filter.{sub}.required=false"));
            }
            ("filter", Some(sub), "required") => push(format!("filter.{sub}.required=false")),
            ("diff", Some(sub), "command" | "textconv") => push(format!("diff.{sub}.{key}=")),
            ("diff", None, "external") => push("diff.external=".into()),
            ("merge", Some(sub), "driver") => push(format!("merge.{sub}.driver=")),
            ("credential", Some(sub), "helper") => push(format!("credential.{sub}.helper=")),
            ("gpg", None, "program") => push("gpg.program=".into()),
            ("gpg", Some(sub), "program") => push(format!("gpg.{sub}.program=")),
            _ => {}
        }
    }
    Ok(out)
}

/// Put the isolation of this module on `cmd` (environment and the fixed `-c` flags), for a git that
/// has yet to get its subcommand: `isolate(Command::new("git"))` then `.args(["-C", dir, "status"])`.
/// `extra` are more `-c` overrides (from [`overrides`]).
pub fn isolate<S: AsRef<OsStr>>(mut cmd: Command, extra: &[S]) -> Command {
    for k in ENV_REMOVE {
        cmd.env_remove(k);
    }
    for (k, v) in ENV_SET {
        cmd.env(k, v);
    }
    cmd.arg("--no-pager");
    for f in SAFE_FLAGS {
        cmd.arg("-c").arg(f);
    }
    for f in extra {
        cmd.arg("-c").arg(f.as_ref());
    }
    cmd
}

/// The arguments [`isolate`] puts before a git subcommand, for processes smithfs starts through
/// its own launcher (the auto-commit): `["--no-pager", "-c", "core.hooksPath=/dev/null", …]`
/// followed by `-c X` for each of `extra`.
pub fn isolated_args(extra: &[String]) -> Vec<String> {
    let mut v = vec!["--no-pager".to_string()];
    for f in SAFE_FLAGS
        .iter()
        .map(|s| s.to_string())
        .chain(extra.iter().cloned())
    {
        v.push("-c".into());
        v.push(f);
    }
    v
}

/// The oldest git a parent's `git pull` from a child is safe with (docs/SPEC.md §11: it runs nothing the
/// child configured): 2.45.1, which fixed the local-clone and local-fetch code execution of
/// CVE-2024-32002/32004/32465 (the backports 2.39.4, 2.40.2, 2.41.1, 2.42.2, 2.43.4 and 2.44.1 count).
pub const SAFE_PULL_VERSIONS: [(u32, u32, u32); 7] = [
    (2, 39, 4),
    (2, 40, 2),
    (2, 41, 1),
    (2, 42, 2),
    (2, 43, 4),
    (2, 44, 1),
    (2, 45, 1),
];

/// Parse `git version 2.47.3` (any suffix after the third number is ignored). Pure.
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.trim().strip_prefix("git version ")?;
    let mut it = v.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    let patch = it.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some((major, minor, patch))
}

/// Is git `v` one a parent's pull from a child is safe with ([`SAFE_PULL_VERSIONS`])? Pure.
pub fn pull_is_safe(v: (u32, u32, u32)) -> bool {
    let newest = SAFE_PULL_VERSIONS[SAFE_PULL_VERSIONS.len() - 1];
    if (v.0, v.1) > (newest.0, newest.1) {
        return true;
    }
    SAFE_PULL_VERSIONS
        .iter()
        .any(|s| (s.0, s.1) == (v.0, v.1) && v.2 >= s.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_table() {
        let rows: [(&str, &[&str]); 9] = [
            ("core.bare\nuser.name\n", &[]),
            (
                "filter.evil.clean\nfilter.evil.smudge",
                &[
                    "filter.evil.clean=",
                    "filter.evil.required=false",
                    "filter.evil.smudge=",
                ],
            ),
            (
                "filter.lfs.process",
                &["filter.lfs.process=", "filter.lfs.required=false"],
            ),
            ("diff.evil.textconv", &["diff.evil.textconv="]),
            ("diff.Evil.Dots.command", &["diff.Evil.Dots.command="]),
            ("diff.external", &["diff.external="]),
            ("merge.ours.driver", &["merge.ours.driver="]),
            (
                "credential.https://x.helper",
                &["credential.https://x.helper="],
            ),
            (
                "gpg.ssh.program\ngpg.program",
                &["gpg.ssh.program=", "gpg.program="],
            ),
        ];
        for (input, want) in rows {
            assert_eq!(
                overrides(input),
                Ok(want.iter().map(|s| s.to_string()).collect()),
                "{input}"
            );
        }
    }

    /// A driver `-c` cannot name is refused, not left armed (notes W21): `-c filter.a=b.clean=`
    /// sets `filter.a`; a non-UTF-8 subsection arrives here as U+FFFD.
    #[test]
    fn names_that_c_cannot_say_are_refused() {
        for bad in [
            "filter.a=b.clean",
            "filter.x=.process",
            "diff.=.textconv",
            "merge.a=b.driver",
            "filter.\u{fffd}.clean",
            "credential.https://h/?a=b.helper",
        ] {
            let e = overrides(&format!("core.bare\n{bad}\n")).expect_err(bad);
            assert!(e.contains("refused"), "{bad}: {e}");
        }
        // Harmless keys may say anything.
        assert_eq!(
            overrides("branch.a=b.remote\nremote.\u{fffd}.url\n"),
            Ok(vec![])
        );
    }

    #[test]
    fn versions() {
        for (text, want, safe) in [
            ("git version 2.47.3", Some((2, 47, 3)), true),
            ("git version 2.45.1.windows.1", Some((2, 45, 1)), true),
            ("git version 2.45.0", Some((2, 45, 0)), false),
            ("git version 2.39.4", Some((2, 39, 4)), true),
            ("git version 2.39.2", Some((2, 39, 2)), false),
            ("git version 2.30.0", Some((2, 30, 0)), false),
            ("git version 3.0", Some((3, 0, 0)), true),
        ] {
            let v = parse_version(text);
            assert_eq!(v, want, "{text}");
            assert_eq!(v.map(pull_is_safe), Some(safe), "{text}");
        }
        assert_eq!(parse_version("hg 1"), None);
    }
}
