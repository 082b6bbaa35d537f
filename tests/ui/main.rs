//! `smithfs ui` (docs/SPEC.md §14) in a real browser: Debian's headless chromium driven over
//! WebDriver (`webdriver.rs`) against real mounts with real agent runs. Every mount, ui server,
//! chromedriver and browser a test starts is stopped by its guard, also when the test fails.
//! The screenshots in docs/ (the tree, a smith's page) are taken here.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod browser;
mod http_edge;
mod webdriver;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{smithfs, TestMount, SMITHFS};

/// A mount with a project (`init --repo`, allow_other): a fresh repository in the test's
/// directory with one commit of `a.txt`; the mount and the repository's path.
pub fn project_mount() -> (TestMount, PathBuf) {
    let mut repo = PathBuf::new();
    let m = TestMount::with_init(
        common::MountOpts {
            allow_other: true,
            ..common::MountOpts::default()
        },
        |tmp| {
            repo = tmp.join("repo");
            std::fs::create_dir_all(&repo).expect("mkdir");
            let ok = Command::new("bash")
                .arg("-ec")
                .arg(
                    "git init -q -b main . && git config user.name u && git config user.email u@e \
                     && echo one > a.txt && git add -A && git commit -qm one",
                )
                .current_dir(&repo)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "git init");
            vec![
                std::ffi::OsString::from("--repo"),
                repo.clone().into_os_string(),
            ]
        },
    );
    (m, repo)
}

/// A `smithfs ui DIR` process; Drop kills it (by its pid) and reaps it.
pub struct UiServer {
    child: Child,
    /// The URL it printed (with the token).
    pub url: String,
    /// Its port.
    pub port: u16,
    /// Its token.
    pub token: String,
    /// Where its pages are (`/s-…`: the path its cookie is scoped to, notes UI13), learnt from
    /// the redirect of the first visit; empty before UI13.
    pub base: String,
}

impl UiServer {
    /// Start `smithfs ui DIR ARGS…` and read the URL it prints.
    pub fn start(dir: &Path, args: &[&str]) -> UiServer {
        UiServer::start_with(dir, args, None)
    }

    /// [`UiServer::start`] with its `RLIMIT_NOFILE` (soft and hard) set to `nofile` when given.
    pub fn start_with(dir: &Path, args: &[&str], nofile: Option<u64>) -> UiServer {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(SMITHFS);
        if let Some(n) = nofile {
            // SAFETY: setrlimit is async-signal-safe and touches no memory of ours.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .arg("ui")
            .arg(dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn smithfs ui");
        let out = child.stdout.take().expect("stdout");
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let url = line.trim().to_string();
        let mut s = UiServer {
            child,
            url: url.clone(),
            port: 0,
            token: String::new(),
            base: String::new(),
        };
        let rest = url
            .strip_prefix("http://127.0.0.1:")
            .unwrap_or_else(|| panic!("smithfs ui printed {url:?}"));
        let (port, query) = rest.split_once("/?token=").expect("a token in the URL");
        s.port = port.parse().expect("a port");
        s.token = query.to_string();
        // The first visit's redirect names where the pages are.
        let (_, headers, _) =
            webdriver::http(s.port, "GET", &format!("/?token={}", s.token), &[], b"")
                .expect("the first visit");
        let location = headers
            .iter()
            .find(|(k, _)| k == "location")
            .map(|(_, v)| v.clone())
            .expect("the first visit redirects");
        s.base = location.trim_end_matches('/').to_string();
        s
    }

    /// `http://127.0.0.1:PORT` + the pages' base + `path` (no token).
    pub fn at(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}{path}", self.port, self.base)
    }
}

impl Drop for UiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Set the mount's agent to `bash -c SCRIPT` (no retries) and remount (config is read at mount).
pub fn set_agent(m: &mut TestMount, script: &str) {
    let p = m.path().join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("config")).expect("JSON");
    c["agent"] = serde_json::json!({ "command": ["bash", "-c", script], "retries": 0 });
    std::fs::write(&p, serde_json::to_string_pretty(&c).expect("JSON")).expect("write");
    m.remount();
}

/// The test agent: `split` (one child per further task line), `count WORD` (a census of one
/// word, after a short pause), `fail` (a long log with terminal escapes, invalid UTF-8 and
/// HTML, then exit 3), `sleep` (runs until cancelled), `edit` (changes the workspace).
/// Its `split` writes each child's task in place (one create, one write, the release completes
/// it) rather than `agent_split!`'s rename: since main's 754943e…391fca1 a child woken by the
/// rename sometimes finds no `inbox/task-1.md` (ENOENT, reported to the scheduler's owner).
pub const AGENT: &str = concat!(
    agent_prelude!(),
    r#"split)
  tail -n +2 "$SMITH_TASK_FILE" > private/lines
  n=0
  while read -r line; do n=$((n+1)); mkdir "children/$(printf 'smith-%03d' $n)" || exit 9; done < private/lines
  n=0
  while read -r line; do
    n=$((n+1)); printf '%s\n' "$line" > "children/$(printf 'smith-%03d' $n)/inbox/task-1.md"
  done < private/lines
  exit 0 ;;
count) echo "counting $arg"; sleep 1; publish "$arg: $(printf %s "$arg" | wc -c) letters"; exit 0 ;;
fail) for i in $(seq 1 2000); do echo "line $i of a long log ................................................................"; done
  echo "failing on purpose"; printf 'bad \033[31mred\033[0m \377\376 <b>bold</b> <script>x()</script>\n'; exit 3 ;;
sleep) echo "sleeping"; sleep 600; exit 0 ;;
edit) echo "changed by the smith" >> workspace/a.txt; printf 'new\nfile\n' > workspace/b.txt; publish "edited"; exit 0 ;;
esac
exit 1"#
);

/// Write a task into the root's inbox through the mount, as the operator.
pub fn task(m: &TestMount, name: &str, text: &str) {
    std::fs::write(
        m.path()
            .join("smiths/smith-root/inbox")
            .join(format!("task-{name}.md")),
        text,
    )
    .expect("write the task");
}

/// `smithfs status DIR --json` parsed.
pub fn status(dir: &Path) -> serde_json::Value {
    let r = smithfs([OsStr::new("status"), dir.as_os_str(), OsStr::new("--json")]);
    serde_json::from_str(&r.stdout).unwrap_or(serde_json::Value::Null)
}

/// The state of `full` in `status --json`.
pub fn state_of(dir: &Path, full: &str) -> String {
    status(dir)["smiths"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["full_id"] == full).cloned())
        .and_then(|s| s["state"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Every run log under the tree and the journal, for a failure message.
pub fn dump(m: &TestMount) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(
            "for f in $(find smiths -path '*/conversations/*' -type f); do echo \"== $f\"; \
             cat \"$f\"; done; cat .smithfs/events.jsonl",
        )
        .current_dir(m.path())
        .output()
        .expect("sh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Poll `cond` every 50 ms for up to `secs`; on timeout panic with `what` and [`dump`].
#[track_caller]
pub fn wait_tree(m: &TestMount, secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !cond() {
        if std::time::Instant::now() > end {
            panic!("timed out after {secs}s waiting for {what}:\n{}", dump(m));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
