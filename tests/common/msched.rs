//! Helpers for `tests/mount_sched.rs`: a `TestMount` prepared with a test agent script and a
//! config (written before the scheduler's mount, then remounted), the journal and status read
//! through the mount or the CLI, and small parsers.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::{poll_until, smithfs, Run, TestMount};

/// The test agent, installed as `agents/agent.sh`. The first line of `$SMITH_TASK_FILE` is a
/// directive (`ok`, `say TEXT` (publishes TEXT), `ticks N` (N lines `tick K EPOCH` on stdout,
/// 0.2 s apart), `sleep N`, `fail`, `hang`, `resumehang`, `resumehangterm` (its whole
/// group ignores TERM), `sibling`, `env`, `split`, `splitwait`); for `split`/`splitwait` each further line becomes the task of one child
/// (`smith-001`, `smith-002`, … made by this agent with mkdir) and `bad*` lines make the agent
/// write a malformed `config.json` into that child first. Woken for children, a smith
/// concatenates its children's results into its own.
pub const AGENT: &str = r#"
echo "run $SMITH_FULL_ID wake=$SMITH_WAKE task=$SMITH_TASK_FILE"
publish() { printf '%s\n' "$1" > private/r.md && mv private/r.md outbox/result.md; }
hang() {
  echo $$ > private/pid
  setsid sh -c 'trap "" TERM; echo $$ > private/spid.tmp; mv private/spid.tmp private/spid; exec sleep 1000' &
  sleep 1000 &
  echo $! > private/gpid
  wait $!
}
if [ "$SMITH_WAKE" = children ]; then
  cat children/*/outbox/result.md > private/r.md 2>/dev/null
  mv private/r.md outbox/result.md
  exit 0
fi
read -r cmd arg < "$SMITH_TASK_FILE"
case "$cmd" in
split|splitwait)
  tail -n +2 "$SMITH_TASK_FILE" > private/lines
  n=0
  while read -r line; do
    n=$((n+1)); c=$(printf 'smith-%03d' $n)
    mkdir "children/$c" || exit 9
    case "$line" in
      badkey) printf '{"agent": {"comand": ["x"]}}' > "children/$c/config.json" ;;
      badjson) printf '{"agent": ' > "children/$c/config.json" ;;
      badscope) printf '{"scheduler": {"max_concurrent": 1}}' > "children/$c/config.json" ;;
    esac
  done < private/lines
  n=0
  while read -r line; do
    n=$((n+1)); c=$(printf 'smith-%03d' $n)
    printf '%s\n' "$line" > private/t.md
    mv private/t.md "children/$c/inbox/task-1.md"
  done < private/lines
  if [ "$cmd" = splitwait ]; then
    i=0
    until grep -Eqs '"end": ?"' children/smith-001/conversations/run-0001/meta.json; do
      i=$((i+1)); [ $i -gt 3000 ] && exit 8; sleep 0.01
    done
    sleep 0.5
    echo "child settled while the parent runs" > private/settled-before-exit
  fi
  exit 0 ;;
ok|badkey|badjson|badscope) publish "result of $SMITH_ID" ;;
say) publish "$arg" ;;
ticks)
  i=0
  while [ $i -lt "$arg" ]; do echo "tick $i $(date +%s.%N)"; i=$((i+1)); sleep 0.2; done
  publish "ticked $SMITH_ID" ;;
sleep) sleep "$arg"; publish "result of $SMITH_ID" ;;
fail) exit 3 ;;
hang) hang ;;
resumehang|resumehangterm)
  [ "$cmd" = resumehangterm ] && trap "" TERM
  if [ -e private/resumed ]; then publish "resumed $SMITH_ID"; else : > private/resumed; hang; fi ;;
sibling)
  cat "$SMITH_MOUNT/.smithfs/whoami" > private/whoami.txt 2>&1
  { echo x > ../smith-002/private/intrusion; } 2> private/sibling.txt
  cat ../smith-002/private/START_HERE.md > /dev/null 2>> private/sibling.txt
  cat "$SMITH_MOUNT/.smithfs/why" > private/why.txt 2>&1
  publish "result of $SMITH_ID" ;;
sandboxenv)
  env | grep -E '^(HOME|XDG_[A-Z_]*|CLAUDE_CONFIG_DIR|CODEX_HOME|GEMINI_CLI_HOME|TMPDIR|USER|LOGNAME)=' | sort > private/env.txt
  printf %s "$SMITH_TEST_TOKEN" | sha256sum | cut -c1-64 > private/token.sha
  echo "token: $SMITH_TEST_TOKEN."
  printf 'split: %s' "$SMITH_TEST_TOKEN" | head -c 12; sleep 0.2; printf '%s\n' "$SMITH_TEST_TOKEN" | tail -c +6
  publish "result of $SMITH_ID" ;;
env)
  env | grep '^SMITH_' | sort > private/env.txt
  cat "$SMITH_MOUNT/.smithfs/whoami" > private/whoami.txt 2>&1
  publish "result of $SMITH_ID" ;;
*) echo "unknown directive $cmd"; exit 2 ;;
esac
"#;

/// A mount whose config was written before the mount that runs the scheduler.
pub struct Sm {
    pub m: TestMount,
}

/// Merge `patch` into `base`, objects key by key.
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p.clone(),
    }
}

/// `smith-root/smith-001` → `smiths/smith-root/children/smith-001`.
pub fn rel(full: &str) -> String {
    let mut parts = full.split('/');
    let mut r = format!("smiths/{}", parts.next().unwrap_or("smith-root"));
    for p in parts {
        r.push_str("/children/");
        r.push_str(p);
    }
    r
}

impl Sm {
    /// What the AGENT's `split` then `sibling` tasks must leave (docs/SPEC.md §3): `c1`'s run was
    /// `c1` (its `whoami.txt` says a smith and its full id), its write and its read of `c2`'s
    /// `private/` were both EACCES (`Permission denied` twice in its `sibling.txt`), and nothing
    /// of it reached `c2`. `how` is added to the failure messages (the path the runs took).
    pub fn check_sibling_refused(&self, c1: &str, c2: &str, how: &str) {
        let r1 = rel(c1);
        let who = self
            .read(&format!("{r1}/private/whoami.txt"))
            .unwrap_or_default();
        assert!(who.contains("identity: smith"), "{how}: {who}");
        assert!(who.contains(&format!("full id: {c1}")), "{how}: {who}");
        let sib = self
            .read(&format!("{r1}/private/sibling.txt"))
            .unwrap_or_default();
        assert_eq!(
            sib.matches("Permission denied").count(),
            2,
            "{how}: write and read of a sibling's private/ are EACCES: {sib}"
        );
        assert!(
            !self.p(&format!("{}/private/intrusion", rel(c2))).exists(),
            "{how}: nothing written into the sibling"
        );
    }

    /// Init and mount, install `AGENT` as `agents/agent.sh`, set `agent.command` to run it and
    /// merge `patch` into `config.json`, then remount so the scheduler reads it.
    pub fn new(patch: Value) -> Self {
        Self::with(
            super::MountOpts {
                allow_other: true,
                ..super::MountOpts::default()
            },
            patch,
        )
    }

    /// [`Sm::new`] mounted with `opts`.
    pub fn with(opts: super::MountOpts, patch: Value) -> Self {
        let mut m = TestMount::with(opts);
        std::fs::write(m.path().join("agents/agent.sh"), AGENT).expect("write agent");
        let cfg_path = m.path().join("config.json");
        let mut cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).expect("read config"))
                .expect("config JSON");
        merge(
            &mut cfg,
            &serde_json::json!({"agent": {"command": ["sh", "{mount}/agents/agent.sh"]}}),
        );
        merge(&mut cfg, &patch);
        std::fs::write(&cfg_path, serde_json::to_string_pretty(&cfg).unwrap()).expect("config");
        m.remount();
        Sm { m }
    }

    /// Path inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.m.path().join(rel)
    }

    /// The mount point as a string (for CLI arguments).
    pub fn dir(&self) -> String {
        self.m.path().display().to_string()
    }

    /// Read a file through the mount.
    pub fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.p(rel)).ok()
    }

    /// Write a file through the mount as the operator.
    pub fn write(&self, rel: &str, content: &str) {
        std::fs::write(self.p(rel), content).unwrap_or_else(|e| panic!("write {rel}: {e}"));
    }

    /// Give the root its task (a plain write into its inbox).
    pub fn task(&self, content: &str) {
        self.write("smiths/smith-root/inbox/task-1.md", content);
    }

    /// The journal read through the mount (`.smithfs/events.jsonl`).
    pub fn events(&self) -> Vec<Value> {
        self.read(".smithfs/events.jsonl")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The journal from `smithfs events DIR --json`.
    pub fn events_cli(&self) -> Vec<Value> {
        let out = smithfs(["events", &self.dir(), "--json"]).expect_ok("smithfs events --json");
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// Events named `ev` of `smith` (any smith when `None`).
    pub fn of(&self, ev: &str, smith: Option<&str>) -> Vec<Value> {
        filter(&self.events(), ev, smith)
    }

    /// Poll (bounded) until at least `n` events `ev` of `smith` are journaled; returns them.
    pub fn wait_events(&self, secs: u64, ev: &str, smith: Option<&str>, n: usize) -> Vec<Value> {
        let mut got = Vec::new();
        poll_until(
            Duration::from_secs(secs),
            &format!("{n} × {ev} of {smith:?} in {}", self.dir()),
            || {
                got = self.of(ev, smith);
                got.len() >= n
            },
        );
        got
    }

    /// `smithfs status DIR --json`.
    pub fn status(&self) -> Value {
        let out = smithfs(["status", &self.dir(), "--json"]).expect_ok("smithfs status --json");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    /// `.smithfs/status.json` read through the mount.
    pub fn status_file(&self) -> Value {
        let t = self.read(".smithfs/status.json").expect("status.json");
        serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t}"))
    }

    /// A smith's state from `.smithfs/status.json`.
    pub fn state(&self, full: &str) -> String {
        let st = self.status_file();
        let found = st["smiths"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["full_id"] == full));
        found
            .and_then(|s| s["state"].as_str())
            .unwrap_or("")
            .to_string()
    }

    /// Poll (bounded) until `full` is in `state`.
    pub fn wait_state(&self, secs: u64, full: &str, state: &str) {
        poll_until(
            Duration::from_secs(secs),
            &format!("{full} to be {state}"),
            || self.state(full) == state,
        );
    }

    /// Poll (bounded) until the file exists through the mount; its content.
    pub fn wait_file(&self, secs: u64, rel: &str) -> String {
        let mut got = None;
        poll_until(Duration::from_secs(secs), &format!("file {rel}"), || {
            got = self.read(rel).filter(|s| !s.is_empty());
            got.is_some()
        });
        got.unwrap()
    }

    /// Every `conversations/*/meta.json` of a smith, in run-id order.
    pub fn metas(&self, full: &str) -> Vec<Value> {
        let dir = self.p(&format!("{}/conversations", rel(full)));
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        names.sort();
        names
            .iter()
            .filter_map(|n| std::fs::read_to_string(dir.join(n).join("meta.json")).ok())
            .map(|t| serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t}")))
            .collect()
    }

    /// A pid recorded by the agent in `private/NAME` of `full`, waited for.
    /// The host pid of a process `full`'s latest run recorded in `private/NAME` (`echo $$`): in
    /// a sandboxed run that is a pid in the run's own namespace, mapped through the run's init
    /// (`meta.json`'s `pid`).
    pub fn recorded_pid(&self, full: &str, name: &str) -> i32 {
        let t = self.wait_file(20, &format!("{}/private/{name}", rel(full)));
        let ns_pid: i32 = t
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("pid in {name}: {e}: {t:?}"));
        let init = self.run_pid(full);
        crate::common::host_pid_in(init, ns_pid)
            .unwrap_or_else(|| panic!("{name} {ns_pid} of {full}'s run (pid {init}) is not alive"))
    }

    /// The pid of `full`'s latest run (`meta.json`'s `pid`: the agent's, or its sandbox init's).
    pub fn run_pid(&self, full: &str) -> i32 {
        poll_until(
            Duration::from_secs(10),
            &format!("a run pid in {full}'s meta.json"),
            || {
                self.metas(full)
                    .last()
                    .and_then(|m| m["pid"].as_i64())
                    .and_then(|p| i32::try_from(p).ok())
            },
        )
    }

    /// `smithfs ARGS…` with this mount's dir appended after the subcommand.
    pub fn cli(&self, sub: &str, args: &[&str]) -> Run {
        let dir = self.dir();
        let mut a = vec![sub, dir.as_str()];
        a.extend_from_slice(args);
        smithfs(a)
    }
}

/// Events named `ev` of `smith` (any when `None`).
pub fn filter(events: &[Value], ev: &str, smith: Option<&str>) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["event"] == ev && smith.map_or(true, |s| e["smith"] == s))
        .cloned()
        .collect()
}

/// A smith's entry in a status document.
pub fn smith_of<'a>(status: &'a Value, full: &str) -> &'a Value {
    status["smiths"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["full_id"] == full))
        .unwrap_or_else(|| panic!("{full} not in status {status}"))
}

/// Field `key` of each value, as strings.
pub fn strs(vals: &[Value], key: &str) -> Vec<String> {
    vals.iter()
        .map(|v| v[key].as_str().unwrap_or("").to_string())
        .collect()
}

/// Seconds since the epoch of an RFC 3339 UTC timestamp (`2026-11-30T08:54:44.335868Z`).
pub fn ts(v: &Value) -> f64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a timestamp: {v}"));
    let parsed = s
        .strip_suffix('Z')
        .and_then(|s| s.split_once('T'))
        .and_then(|(date, time)| {
            let d: Vec<i64> = date
                .split('-')
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?;
            let t: Vec<f64> = time
                .split(':')
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?;
            (d.len() == 3 && t.len() == 3).then_some((d, t))
        });
    let Some((d, t)) = parsed else {
        panic!("not an RFC 3339 UTC timestamp: {s}");
    };
    // Days from civil (Howard Hinnant's algorithm).
    let (y, m, day) = (if d[1] <= 2 { d[0] - 1 } else { d[0] }, d[1], d[2]);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days as f64 * 86_400.0 + t[0] * 3600.0 + t[1] * 60.0 + t[2]
}

/// Is process `pid` gone (or a zombie)?
pub fn gone(pid: i32) -> bool {
    crate::common::process_gone(pid)
}

/// Processes a test saw (an agent's recorded pids), held by pidfd and SIGKILLed on drop if
/// still there, so a failing test leaves no `sleep 1000` behind and its mount can unmount.
/// Declare it after the `Sm` so it drops first.
/// Also removes the cgroup trees of daemons the test killed (a new daemon leaves them behind).
#[derive(Default)]
pub struct Leftovers(Vec<std::os::fd::OwnedFd>, Vec<PathBuf>);

impl Leftovers {
    /// Watch the pids a `hang` run of `full` records: its leader (`pid`), a member of its
    /// process group (`gpid`) and a `setsid` descendant that ignores TERM (`spid`).
    pub fn hang(&mut self, s: &Sm, full: &str) -> [i32; 3] {
        let p = ["pid", "gpid", "spid"].map(|n| s.recorded_pid(full, n));
        p.iter().for_each(|&x| self.watch(x));
        // A sandboxed run's init: SIGKILLing it ends its whole pid namespace.
        self.watch(s.run_pid(full));
        p
    }

    /// Remove the (by then empty) cgroup tree `dir` on drop.
    pub fn cgroup(&mut self, dir: PathBuf) {
        self.1.push(dir);
    }

    /// Watch `pid` (no-op if it is already gone).
    pub fn watch(&mut self, pid: i32) {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd >= 0 {
            // SAFETY: the fd was just returned to us and is owned by nobody else.
            self.0
                .push(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) });
        }
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        for fd in &self.0 {
            // SAFETY: a signal sent through a pidfd we own reaches only that process.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
        for dir in &self.1 {
            let end = std::time::Instant::now() + Duration::from_secs(3);
            while remove_tree(dir).is_err() && std::time::Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// rmdir a cgroup tree bottom-up (cgroup dirs hold only virtual files).
fn remove_tree(dir: &std::path::Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&e.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
