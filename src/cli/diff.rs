//! `smithfs diff [DIR] ID [--stat]` (docs/SPEC.md §6, §11): a smith's changes from its base commit
//! (`git config smithfs.base`) to its work tree, committed and not, untracked files included.
//!
//! Read-only on the workspace: the untracked files are marked intent-to-add in a temporary index
//! outside it, so nothing is written there. Git runs isolated (`workspace::git`): nothing the smith
//! configured runs. And it runs **as the smith** (docs/SPEC.md §12 "Programs smithfs runs for
//! others", docs/PROTOCOL-NOTES.md W19): on a mount, every git that reads a smith's repository is
//! started through `smithfs run --smith ID`, bound to that smith, as its uid, in its sandbox, so
//! even a configuration key the isolation missed runs nothing as the operator or as another smith;
//! the operator's side only reads what it printed. `accept` reads the same way ([`as_smith`]).
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{anyhow, bail, Result};

use super::util::resolve_mount;
use crate::config::Config;
use crate::tree::scaffold_plan::smith_dir_rel;
use crate::workspace::{self, git};

/// Arguments of `smithfs diff`.
#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// `[DIR] ID`: the mount (default as for `status`) and the smith, e.g. `smith-root/smith-001`.
    #[arg(num_args = 1..=2, required = true, value_name = "[DIR] ID")]
    pub args: Vec<String>,
    /// Only the changed files and their line counts (`git diff --stat`).
    #[arg(long)]
    pub stat: bool,
}

/// A smith's workspace found from `[DIR] ID`.
pub(crate) struct Located {
    /// The mount (or store) directory.
    pub dir: PathBuf,
    /// The full id.
    pub full_id: String,
    /// `DIR/smiths/…/workspace`.
    pub ws: PathBuf,
    /// The mount's configuration (its `workspace.repo` is set).
    pub config: Config,
    /// `dir` is a live mount (else a store not mounted).
    pub mounted: bool,
}

/// Error with an exit code: 2 for usage errors and unknown smiths (docs/SPEC.md §6).
pub(crate) struct Exit2(pub String);

/// Find the workspace of `[DIR] ID` (`cmd` names the subcommand in messages).
pub(crate) fn locate(args: &[String], cmd: &str) -> Result<Result<Located, Exit2>> {
    let (dir, id) = match args {
        [id] => (None, id.as_str()),
        [dir, id] => (Some(PathBuf::from(dir)), id.as_str()),
        _ => return Ok(Err(Exit2(format!("usage: smithfs {cmd} [DIR] ID")))),
    };
    let dir = resolve_mount(dir.as_deref())?;
    locate_in(&dir, id)
}

/// Find the workspace of smith `id` in the mount (or store) `dir`: what `diff`, `accept` and
/// the ui read.
pub(crate) fn locate_in(dir: &Path, id: &str) -> Result<Result<Located, Exit2>> {
    let dir = dir.to_path_buf();
    let text = std::fs::read_to_string(dir.join("config.json"))
        .map_err(|e| anyhow!("cannot read {}/config.json: {e}", dir.display()))?;
    let config = Config::parse(&text).map_err(|e| anyhow!("{e}"))?;
    if !config.workspace.enabled() {
        bail!(
            "{} has no project (make one with `smithfs init DIR --repo PATH`)",
            dir.display()
        );
    }
    // A full id, a short id only one smith has or a unique suffix (docs/SPEC.md §6); ambiguous
    // and unknown ids are usage errors (exit 2, the candidates listed).
    let src = super::store::source(&dir)?;
    let mounted = matches!(src, super::store::Source::Mount(_));
    let id = super::store::resolve_id(&src, id)?;
    let Some(rel) = smith_dir_rel(&id) else {
        return Ok(Err(Exit2(format!("no smith {id}"))));
    };
    if !dir.join(&rel).is_dir() {
        return Ok(Err(Exit2(format!("no smith {id} in {}", dir.display()))));
    }
    let ws = dir.join(&rel).join(workspace::AREA);
    if !ws.join(".git").exists() {
        bail!("{id} has no workspace ({} is missing)", ws.display());
    }
    Ok(Ok(Located {
        dir,
        full_id: id,
        ws,
        config,
        mounted,
    }))
}

/// Run isolated git with `extra` overrides and `env` in `cwd`, as `owner` (uid, gid) when given
/// (a root process switching to the owner of the repository: `accept`'s writing half);
/// stdout, or git's error line.
pub(crate) fn git_out(
    cwd: &Path,
    owner: Option<(u32, u32)>,
    extra: &[String],
    env: &[(&str, &Path)],
    args: &[&str],
) -> Result<String, String> {
    let mut cmd = git::isolate(Command::new("git"), extra);
    cmd.arg("-C").arg(cwd).args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some((uid, gid)) = owner {
        // std drops the supplementary groups when a root process sets a uid.
        cmd.uid(uid).gid(gid);
    }
    let out = cmd.output().map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(error_line(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `s` quoted for `sh` (single quotes; a `'` inside written `'\''`). Pure.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The start of a shell script that runs git as `workspace::git` isolates it: the environment
/// (`ENV_REMOVE` unset, `ENV_SET` exported) and `G`, the isolated command (`$G status`), with
/// `extra` overrides. Pure.
pub(crate) fn git_script(extra: &[String]) -> String {
    let mut s = String::from("set -e\n");
    for k in git::ENV_REMOVE {
        s.push_str(&format!("unset {k}\n"));
    }
    for (k, v) in git::ENV_SET {
        s.push_str(&format!("export {k}={}\n", sh_quote(v)));
    }
    // The work tree is the workspace the script runs in, whatever the smith's `core.worktree`
    // says: else `diff` showed (and hashed) another directory the smith may read, past UI14's
    // bound on big files (notes W24).
    s.push_str("GIT_WORK_TREE=$PWD\nexport GIT_WORK_TREE\n");
    let mut g = vec!["git".to_string()];
    g.extend(git::isolated_args(extra));
    let g: Vec<String> = g.iter().map(|a| sh_quote(a)).collect();
    s.push_str(&format!("G() {{ {} \"$@\"; }}\n", g.join(" ")));
    s
}

/// Run `sh -c SCRIPT sh ARGS…` in the smith's workspace **as the smith** (docs/SPEC.md §12,
/// docs/PROTOCOL-NOTES.md W19): on a mount through `smithfs run --mount DIR --smith ID` (bound,
/// its uid, its sandbox when the mount applies one); on a store not mounted only while the
/// sandbox is off (then as this process, on files that are its own), else refused. Returns
/// stdout.
///
/// # Errors
/// One line: the script's first `fatal:`/`error:` line or its last stderr line; a store not
/// mounted with the sandbox on; the command could not start.
pub(crate) fn as_smith(l: &Located, script: &str, args: &[&str]) -> Result<Vec<u8>, String> {
    as_smith_max(l, script, args, None).map(|(out, _)| out)
}

/// [`as_smith`], keeping at most `max` bytes of its stdout (`None`: all): past them git's
/// stdout is closed and the flag is true (what it printed so far is the answer, whatever its
/// exit status). The ui's bound on what a smith can make it hold (notes UI11).
///
/// # Errors
/// As [`as_smith`].
pub(crate) fn as_smith_max(
    l: &Located,
    script: &str,
    args: &[&str],
    max: Option<usize>,
) -> Result<(Vec<u8>, bool), String> {
    let mut cmd = if l.mounted {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find smithfs: {e}"))?;
        let mut c = Command::new(exe);
        c.arg("run")
            .arg("--mount")
            .arg(&l.dir)
            .arg("--smith")
            .arg(&l.full_id)
            .arg("--")
            .arg("/bin/sh");
        c
    } else if crate::sandbox::applies(&l.config.sandbox) {
        return Err(format!(
            "{} is not mounted: its git runs as the smith, in its sandbox, through the mount (mount it first)",
            l.dir.display()
        ));
    } else {
        Command::new("/bin/sh")
    };
    // The operator's environment stays with the operator (notes W22): its credentials and
    // tokens are no business of a process that reads the smith's files as the smith, and a
    // `PATH` with `.` or an empty entry would run the smith's own `git` from its work tree.
    cmd.env_clear().env("PATH", SMITH_GIT_PATH);
    for k in SMITH_GIT_KEEP {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
    cmd.arg("-c")
        .arg(script)
        .arg("sh")
        .args(args)
        .current_dir(&l.ws)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The smith's files may hang git (a FIFO where git reads a file): past the deadline its
    // whole process group is killed and the command fails (notes H23).
    let deadline = smith_git_deadline();
    let out = crate::process::output_within_max(&mut cmd, deadline, max)
        .map_err(|e| format!("cannot run git: {e}"))?;
    let Some((out, cut)) = out else {
        return Err(format!(
            "git, run as {}, did not finish within {} s and was stopped: a file in its workspace may be a FIFO or hang (look at {}/.git)",
            l.full_id,
            deadline.as_secs(),
            l.ws.display()
        ));
    };
    if cut {
        return Ok((out.stdout, true));
    }
    if !out.status.success() {
        return Err(error_line(&out.stderr));
    }
    Ok((out.stdout, false))
}

/// The `PATH` of the smith-side git of `diff` and `accept` (notes W22): absolute directories
/// of the host only, never the operator's `PATH`.
const SMITH_GIT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The operator's variables the smith-side git still gets (notes W22): `smithfs run` reads
/// `SUDO_UID`/`SUDO_GID` (the agents' user, docs/SPEC.md §12), and `TZ` gives the commit
/// dates the operator's zone. Nothing else of the operator's environment.
const SMITH_GIT_KEEP: [&str; 3] = ["SUDO_UID", "SUDO_GID", "TZ"];

/// How long the smith-side git of `diff` and `accept` may take: 60 s, or
/// `SMITHFS_SMITH_GIT_DEADLINE` seconds (1–3600; a test knob, notes H23).
fn smith_git_deadline() -> std::time::Duration {
    std::time::Duration::from_secs(
        std::env::var("SMITHFS_SMITH_GIT_DEADLINE")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|s| (1..=3600).contains(s))
            .unwrap_or(60),
    )
}

/// Git's error in `stderr`: the first `fatal:`/`error:` line, else the last line, else `failed`.
fn error_line(stderr: &[u8]) -> String {
    let err = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = err
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .iter()
        .find(|l| l.starts_with("fatal:") || l.starts_with("error:"))
        .or(lines.last())
        .copied()
        .map_or_else(|| "failed".to_string(), super::util::inline_safe)
}

/// The most bytes of key names a smith's git configuration may list (`smith_overrides`).
const MAX_CONFIG_NAMES: usize = 16 << 20;

/// The driver overrides for the smith's repository (see `workspace::git::overrides`), listed by
/// a git that runs as the smith ([`as_smith`]).
///
/// # Errors
/// As [`as_smith`].
pub(crate) fn smith_overrides(l: &Located) -> Result<Vec<String>, String> {
    let script = format!(
        "{}G config --list --name-only --includes || true\n",
        git_script(&[])
    );
    let (names, cut) = as_smith_max(l, &script, &[], Some(MAX_CONFIG_NAMES))?;
    if cut {
        return Err(format!(
            "its git configuration names more than {} MiB of keys: refused",
            MAX_CONFIG_NAMES >> 20
        ));
    }
    git::overrides(&String::from_utf8_lossy(&names))
}

/// The largest file (apparent size, KiB) `diff` reads: git hashes every changed or untracked
/// file whole, so one sparse file of 200 GB that costs its smith nothing kept `diff` — and each
/// view of its page in the ui — reading zeros until the deadline. Larger files are left out of
/// the diff and named (notes UI14).
const DIFF_MAX_FILE_KIB: u64 = 1 << 20;

/// At most this many files over [`DIFF_MAX_FILE_KIB`] are left out, their names at most
/// [`DIFF_LEFT_OUT_BYTES`] in all; beyond either the diff is refused, as before UI14 (the
/// names become git's arguments, in one `xargs` run).
const DIFF_LEFT_OUT_MAX: usize = 50;

/// See [`DIFF_LEFT_OUT_MAX`].
const DIFF_LEFT_OUT_BYTES: usize = 16 << 10;

/// The script of `diff` (run as the smith; `$1`: `--stat` or empty, `$2`: [`diff_inner`]): the
/// files of the work tree larger than [`DIFF_MAX_FILE_KIB`] (`find`, `.git` pruned: stat only)
/// printed first — their number on a line, then each name NUL-terminated — then the diff of the
/// rest, by the inner script with those names as its arguments (`xargs -0`, so any byte of a
/// name stays itself). Pure.
fn diff_script() -> String {
    format!(
        "set -e\n\
         big=$(mktemp \"${{TMPDIR:-/tmp}}/smithfs-big.XXXXXX\")\n\
         inner=$(mktemp \"${{TMPDIR:-/tmp}}/smithfs-diff.XXXXXX\")\n\
         trap 'rm -f \"$big\" \"$inner\"' EXIT\n\
         printf '%s' \"$2\" > \"$inner\"\n\
         find . -path ./.git -prune -o -type f -size +{DIFF_MAX_FILE_KIB}k -print0 2>/dev/null > \"$big\" || true\n\
         n=$(tr -cd '\\000' < \"$big\" | wc -c)\n\
         if [ \"$n\" -gt {DIFF_LEFT_OUT_MAX} ] || [ \"$(wc -c < \"$big\")\" -gt {DIFF_LEFT_OUT_BYTES} ]; then \
         echo \"fatal: too large to diff: $n files over {gib} GiB\" >&2; exit 1; fi\n\
         printf '%s\\n' \"$n\"\n\
         cat \"$big\"\n\
         xargs -0 sh \"$inner\" \"$1\" < \"$big\"\n",
        gib = DIFF_MAX_FILE_KIB >> 20
    )
}

/// The inner script of `diff` (`$1`: `--stat` or empty; the rest: the files left out, as `find`
/// names them, `./NAME`): `smithfs.base`; a temporary index in `$TMPDIR` (the sandbox's private
/// `/tmp`) read from `HEAD` with the untracked files intent-to-add, then `git diff BASE`, both
/// limited to `.` less each file left out (`:(exclude,literal)NAME`: no glob, any name). A
/// submodule shows as its commit, never its work tree: looking at that runs a git in the
/// submodule, under the submodule's own config, whose drivers the overrides never listed
/// (notes W25) — so only the untracked files are marked (`ls-files --others`, each name
/// literal; `add --all` looked into every submodule), and the diff is
/// `--ignore-submodules=dirty`. Pure.
fn diff_inner(extra: &[String]) -> String {
    format!(
        "{}stat=$1\n\
         shift\n\
         n=$#\n\
         for f do set -- \"$@\" \":(exclude,literal)${{f#./}}\"; done\n\
         shift \"$n\"\n\
         base=$(G config smithfs.base) || {{ echo 'fatal: no smithfs.base' >&2; exit 1; }}\n\
         GIT_INDEX_FILE=$(mktemp \"${{TMPDIR:-/tmp}}/smithfs-diff.XXXXXX\")\n\
         export GIT_INDEX_FILE\n\
         trap 'rm -f \"$GIT_INDEX_FILE\" \"$GIT_INDEX_FILE.lock\"' EXIT\n\
         G read-tree HEAD\n\
         new=$(mktemp \"${{TMPDIR:-/tmp}}/smithfs-new.XXXXXX\")\n\
         trap 'rm -f \"$GIT_INDEX_FILE\" \"$GIT_INDEX_FILE.lock\" \"$new\"' EXIT\n\
         G ls-files -z --others --exclude-standard -- . \"$@\" > \"$new\"\n\
         if [ -s \"$new\" ]; then G --literal-pathspecs add --intent-to-add --ignore-errors \
         --pathspec-from-file=\"$new\" --pathspec-file-nul; fi\n\
         G diff --no-ext-diff --no-textconv --ignore-submodules=dirty --no-color $stat \"$base\" -- . \"$@\"\n",
        git_script(extra),
    )
}

/// What [`diff_script`] printed, taken apart: the names left out (`./` taken off) and the diff.
/// `None`: not the header it prints (its output was cut inside it). Pure.
fn split_left_out(out: &[u8]) -> Option<(Vec<String>, &[u8])> {
    let nl = out.iter().position(|b| *b == b'\n')?;
    let n: usize = std::str::from_utf8(&out[..nl]).ok()?.trim().parse().ok()?;
    let mut rest = &out[nl + 1..];
    let mut names = Vec::with_capacity(n.min(DIFF_LEFT_OUT_MAX));
    for _ in 0..n {
        let end = rest.iter().position(|b| *b == 0)?;
        let name = &rest[..end];
        let name = name.strip_prefix(b"./").unwrap_or(name);
        names.push(String::from_utf8_lossy(name).into_owned());
        rest = &rest[end + 1..];
    }
    Some((names, rest))
}

/// What `diff` shows: git's output, whether it was cut, and the files left out of it (over
/// 1 GiB, notes UI14).
pub(crate) struct DiffOut {
    /// `git diff` (or `--stat`) of everything else.
    pub text: String,
    /// Cut after the bound asked for (notes UI11).
    pub cut: bool,
    /// The work tree's files over 1 GiB, not diffed (lossy UTF-8, as found).
    pub left_out: Vec<String>,
}

impl DiffOut {
    /// The note naming the files left out, one line (empty when none): what `smithfs diff`
    /// prints on stderr and the ui under the list of changed files.
    pub(crate) fn note(&self) -> String {
        if self.left_out.is_empty() {
            return String::new();
        }
        format!(
            "left out of the diff, over {} GiB each (git would read them whole): {}",
            DIFF_MAX_FILE_KIB >> 20,
            self.left_out.join(", ")
        )
    }
}

/// Run `smithfs diff`.
pub fn run(args: DiffArgs) -> Result<ExitCode> {
    let l = match locate(&args.args, "diff")? {
        Ok(l) => l,
        Err(Exit2(msg)) => {
            eprintln!("smithfs: {msg}");
            return Ok(ExitCode::from(2));
        }
    };
    // The smith's files, printed for the operator: inert on a terminal (notes O51).
    let d = diff_max(&l, args.stat, None)?;
    super::util::print_untrusted(d.text.as_bytes())?;
    if !d.left_out.is_empty() {
        eprintln!("smithfs: {}", super::util::inline_safe(&d.note()));
    }
    Ok(ExitCode::SUCCESS)
}

/// The smith's changes from its base commit to its work tree, committed and not, untracked
/// files included, as `git diff` prints them (`stat`: `git diff --stat`), but for the files
/// over 1 GiB, left out and named (notes UI14); cut after `max` bytes (`None`: whole, notes
/// UI11). What `smithfs diff` and the ui show (one code path). Git runs as the smith
/// ([`as_smith`]).
///
/// # Errors
/// The workspace has no `smithfs.base`, a git step failed, or the work tree holds more files
/// over 1 GiB than can be left out (one line naming it).
pub(crate) fn diff_max(l: &Located, stat: bool, max: Option<usize>) -> Result<DiffOut> {
    let fail = |e: String| anyhow!("diff {}: {e}", l.full_id);
    let extra = smith_overrides(l).map_err(fail)?;
    let inner = diff_inner(&extra);
    // The header of names comes on top of the bound.
    let max = max.map(|m| m + DIFF_LEFT_OUT_BYTES + 32);
    let (out, cut) = as_smith_max(
        l,
        &diff_script(),
        &[if stat { "--stat" } else { "" }, &inner],
        max,
    )
    .map_err(fail)?;
    let Some((left_out, text)) = split_left_out(&out) else {
        return Err(fail("its output was cut before the diff".into()));
    };
    Ok(DiffOut {
        text: String::from_utf8_lossy(text).into_owned(),
        cut,
        left_out,
    })
}

/// The smith's commits since its base, one line each (`%h %ad %an: %s`, ISO dates), read as
/// the smith ([`as_smith`]): what the ui lists; cut after `max` bytes (the flag).
///
/// # Errors
/// As [`as_smith`].
pub(crate) fn commits(l: &Located, max: Option<usize>) -> Result<(String, bool), String> {
    let extra = smith_overrides(l)?;
    let script = format!(
        "{}base=$(G config smithfs.base)\n\
         G log --no-color '--format=%h %ad %an: %s' --date=iso-strict \"$base..HEAD\"\n",
        git_script(&extra)
    );
    as_smith_max(l, &script, &[], max)
        .map(|(o, cut)| (String::from_utf8_lossy(&o).into_owned(), cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), "'it'\\''s'");
        let s = git_script(&["filter.x.clean=".to_string()]);
        assert!(s.contains("unset GIT_DIR\n"), "{s}");
        assert!(s.contains("'-c' 'core.hooksPath=/dev/null'"), "{s}");
        assert!(s.contains("'-c' 'filter.x.clean='"), "{s}");
        assert!(!s.contains("safe.directory"), "{s}");
        assert!(
            s.contains("GIT_WORK_TREE=$PWD\nexport GIT_WORK_TREE\n"),
            "{s}"
        );
    }

    /// The smith-side script gets none of the operator's environment, and a fixed `PATH`
    /// (notes W22). Here the path a store not mounted takes with the sandbox off (the script
    /// runs as this process); on a mount the same command starts `smithfs run`.
    #[test]
    fn the_smith_side_gets_none_of_the_operators_environment() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let config = Config::parse(r#"{"sandbox": {"enabled": false}}"#).expect("config");
        let l = Located {
            dir: tmp.path().to_path_buf(),
            full_id: "smith-root".into(),
            ws: tmp.path().to_path_buf(),
            config,
            mounted: false,
        };
        let out = as_smith(&l, "env", &[]).expect("env runs");
        let out = String::from_utf8_lossy(&out);
        let names: Vec<&str> = out
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|p| p.0)
            .collect();
        assert!(names.contains(&"PATH"), "{out}");
        assert!(out.contains(&format!("PATH={SMITH_GIT_PATH}\n")), "{out}");
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            // The shell makes PWD, OLDPWD, SHLVL and `_` of its own.
            let own = ["PATH", "PWD", "OLDPWD", "SHLVL", "_"];
            if !own.contains(&k.as_ref()) && !SMITH_GIT_KEEP.contains(&k.as_ref()) {
                assert!(
                    !names.contains(&k.as_ref()),
                    "the operator's {k} reached the smith: {out}"
                );
            }
        }
    }
}
