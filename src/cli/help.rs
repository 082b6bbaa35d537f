//! The examples `--help` ends with (`after_help`), one block per main command, and the
//! version line (`--version`: the package version and the git commit, from `build.rs`).

/// `smithfs --version`: `0.1.0 (commit 0123456789ab)`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SMITHFS_GIT_COMMIT"),
    ")"
);

/// `smithfs --help`.
pub const MAIN: &str = "\
Examples:
  smithfs init ./fleet --agent reference --task 'count the lines of src/'
  smithfs mount ./fleet                  # detaches once the mount is live
  smithfs status ./fleet --watch         # the tree, live
  smithfs wait ./fleet --final && cat ./fleet/results/final.md
  smithfs umount ./fleet

Exit codes: 0 success, 1 the awaited work failed or was cancelled, 2 usage errors and unknown
smiths, 124 timeout. DIR defaults to the smithfs mount above the working directory, then
$SMITH_MOUNT, then ./.agent-smith.";

/// `smithfs init --help`.
pub const INIT: &str = "\
Examples:
  smithfs init ./fleet --agent reference --task 'take a census of this tree'
  smithfs init ./fleet --agent claude --task-file TASK.md
  smithfs init ./fleet --repo . --agent coder --task 'add the license header'
  smithfs init ./fleet --agent-command my-agent --prompt {task_file}";

/// `smithfs mount --help`.
pub const MOUNT: &str = "\
Examples:
  smithfs mount ./fleet
  smithfs mount ./fleet -f --log-level debug         # in the foreground, logging to stderr
  smithfs mount ./fleet -o allow_other,identity=cgroup
  smithfs mount ./fleet --resume                      # re-queue runs a dead daemon left
fstab (needs mount.fuse.smithfs, scripts/install.sh):
  /srv/fleet  /srv/fleet  fuse.smithfs  defaults,nofail,allow_other  0 0";

/// `smithfs umount --help`.
pub const UMOUNT: &str = "\
Examples:
  smithfs umount ./fleet     # stops live runs (journaled run.interrupted), then unmounts";

/// `smithfs status --help`.
pub const STATUS: &str = "\
Examples:
  smithfs status                 # the mount above the working directory
  smithfs status ./fleet --watch
  smithfs status ./fleet --json | jq '.smiths[] | select(.state == \"failed\")'";

/// `smithfs events --help`.
pub const EVENTS: &str = "\
Examples:
  smithfs events ./fleet --follow
  smithfs events ./fleet --smith smith-001 --json";

/// `smithfs ui --help`.
pub const UI: &str = "\
Examples:
  smithfs ui ./fleet                         # prints http://127.0.0.1:PORT/?token=…
  smithfs ui ./fleet --listen 127.0.0.1:8700 --stalled-after 120
On a remote machine, keep the loopback address and tunnel to it:
  ssh -L 8700:127.0.0.1:8700 host 'smithfs ui ./fleet --listen 127.0.0.1:8700'";

/// `smithfs logs --help`.
pub const LOGS: &str = "\
Examples:
  smithfs logs smith-001             # the latest run's messages.log
  smithfs logs smith-001 --follow    # until that run ends
  smithfs logs --daemon";

/// `smithfs wait --help`.
pub const WAIT: &str = "\
Examples:
  smithfs wait ./fleet --final --timeout 600 && cat ./fleet/results/final.md
  smithfs wait --smith smith-002";

/// `smithfs retry --help`.
pub const RETRY: &str = "\
Examples:
  smithfs status               # a failed smith shows its reason and log
  smithfs logs smith-003       # why it failed
  smithfs retry smith-003      # run it again; its parent aggregates again
  smithfs retry smith-003 && smithfs wait --smith smith-003   # returns once it is queued: wait sees the new run";

/// `smithfs doctor --help`.
pub const DOCTOR: &str = "\
Examples:
  smithfs doctor                          # exit 1 when mounting cannot work for this user
  smithfs doctor --json | jq -r '.[] | select(.status != \"ok\") | .check'";

/// `smithfs run --help`.
pub const RUN: &str = "\
Examples:
  smithfs run --smith smith-root -- bash            # a shell as the root smith
  smithfs run --mount ./fleet --smith smith-001 -- cat .smithfs/whoami
  smithfs run --smith smith-root/smith-001 -- sh -c 'cd \"$SMITH_DIR\" && ls outbox'
The command gets only stdin, stdout and stderr, and SMITH_* variables as a run does.";

/// `smithfs whoami --help`.
pub const WHOAMI: &str = "\
Examples:
  smithfs whoami                          # the operator, in the mount's root
  smithfs whoami --mount ./fleet --json
  smithfs run --smith smith-001 -- smithfs whoami   # what a smith sees";

/// `smithfs cancel --help`.
pub const CANCEL: &str = "\
Examples:
  smithfs cancel ./fleet smith-root/smith-001       # stop its run and its subtree's
  smithfs cancel smith-001                          # a short id only one smith has
  smithfs retry ./fleet smith-001                   # run it again later";

/// `smithfs reload --help`.
pub const RELOAD: &str = "\
Examples:
  smithfs reload ./fleet                  # after editing ./fleet/config.json; prints what changed
  kill -HUP \"$(smithfs whoami --mount ./fleet --json | jq .daemon_pid)\"   # the same
A bad file, or a changed key that needs a remount, is refused whole with one line.";

/// `smithfs diff --help`.
pub const DIFF: &str = "\
Examples:
  smithfs diff ./fleet smith-root/smith-001         # its changes since its base commit
  smithfs diff ./fleet smith-001 --stat";

/// `smithfs accept --help`.
pub const ACCEPT: &str = "\
Examples:
  smithfs accept ./fleet smith-root                 # prints BRANCH COMMIT
  smithfs accept ./fleet smith-001 --branch try/smith-001
  git -C REPO merge smith/smith-root";

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// The words of one example command: up to a comment, `&&`, `|` or `>`; single quotes
    /// group words.
    fn words(line: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut quoted = false;
        for c in line.chars() {
            match c {
                '\'' => quoted = !quoted,
                c if c.is_whitespace() && !quoted => {
                    if !cur.is_empty() {
                        out.push(std::mem::take(&mut cur));
                    }
                }
                c => cur.push(c),
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        let end = out
            .iter()
            .position(|w| w.starts_with('#') || ["&&", "|", ">"].contains(&w.as_str()))
            .unwrap_or(out.len());
        out.truncate(end);
        out
    }

    /// Every `smithfs …` example in every help text parses with the real command line.
    #[test]
    fn every_example_parses() {
        let mut n = 0;
        for text in [
            super::MAIN,
            super::INIT,
            super::MOUNT,
            super::UMOUNT,
            super::STATUS,
            super::EVENTS,
            super::LOGS,
            super::UI,
            super::WAIT,
            super::RETRY,
            super::DOCTOR,
        ] {
            for line in text
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with("smithfs "))
            {
                let w = words(line);
                if let Err(e) = super::super::Cli::try_parse_from(&w) {
                    panic!("{line}: {e}");
                }
                n += 1;
            }
        }
        assert!(n >= 20, "{n} examples");
    }
}
