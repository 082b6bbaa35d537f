//! `smithfs init DIR`: create the layout, a default config.json and the root smith through the
//! same scaffold code that child creation uses (docs/SPEC.md §1, §4, §6).

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;

use super::util::{self, MountState};
use crate::backing;
use crate::fs::scaffold_write::create_smith_dir;
use crate::tree::scaffold_plan::{
    plan_smith, plan_task, PlanEntry, TaskSpec, FILE_MODE, ROOT_ID, ROOT_TASK_PATH,
};
use crate::tree::template::{Templates, BUILTIN_SKILL_NAME};
use crate::workspace::{self, project, Base, GitRun, PROJECT_GIT};
use std::os::unix::ffi::OsStrExt;

/// Arguments of `smithfs init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// The directory to initialise (created if missing).
    pub dir: PathBuf,
    /// The root task's description.
    #[arg(long, conflicts_with = "task_file")]
    pub task: Option<String>,
    /// Read the root task's description from a file.
    #[arg(long, value_name = "F")]
    pub task_file: Option<PathBuf>,
    /// The root task's title (default: its first line).
    #[arg(long, value_name = "T")]
    pub title: Option<String>,
    /// Write a working `agent` configuration for this agent CLI (`reference` also installs the
    /// bundled census agent as `agents/reference.sh`, `coder` the bundled coding agent as
    /// `agents/coder.sh`, which needs `--repo`).
    #[arg(long, value_enum)]
    pub agent: Option<AgentPreset>,
    /// The user's git repository every smith works on (docs/SPEC.md §11): copied to
    /// `DIR/project.git`; every smith dir gets a `workspace/`.
    #[arg(long, value_name = "PATH")]
    pub repo: Option<PathBuf>,
    /// The revision of PATH the root's workspace starts at (default HEAD).
    #[arg(long, value_name = "REV", requires = "repo")]
    pub rev: Option<String>,
    /// Run this program as the agent (any other CLI or a script of your own): CMD and every
    /// argument after it become `agent.command`, with the placeholders `{mount} {smith_dir}
    /// {task_file} {smith_id} {full_id} {level}` filled in per run. Must be the last option.
    #[arg(
        long,
        value_name = "CMD",
        num_args = 1..,
        allow_hyphen_values = true,
        conflicts_with = "agent"
    )]
    pub agent_command: Option<Vec<String>>,
    /// Run the agents without the sandbox (docs/SPEC.md §12): writes `"sandbox": {"enabled":
    /// false}`, and `--agent claude|codex|gemini` in their prompting modes instead of the
    /// unattended ones (the agents then run as the mounting user, root included).
    #[arg(long)]
    pub no_sandbox: bool,
}

/// The bundled reference agent (docs/SPEC.md §6: installed under the mount's `agents/`).
pub const REFERENCE_AGENT: &str = include_str!("../../agents/reference.sh");
/// The bundled coding agent (license headers over a workspace tree, docs/SPEC.md §11;
/// docs/PROTOCOL-NOTES.md W11), installed like the reference agent.
pub const CODER_AGENT: &str = include_str!("../../agents/coder.sh");

/// An agent `init --agent NAME` configures: its `agent` section of config.json
/// (`agents/configs/NAME.json`) and, for the two bundled agents, a script under `agents/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentPreset {
    /// The bundled census agent (`agents/reference.sh`).
    Reference,
    /// The bundled coding agent (`agents/coder.sh`; needs `--repo`).
    Coder,
    /// Claude Code.
    Claude,
    /// OpenAI Codex CLI.
    Codex,
    /// Gemini CLI.
    Gemini,
    /// aider.
    Aider,
}

impl AgentPreset {
    /// The name as `--agent` takes it and `init` prints it.
    pub fn name(self) -> &'static str {
        match self {
            AgentPreset::Reference => "reference",
            AgentPreset::Coder => "coder",
            AgentPreset::Claude => "claude",
            AgentPreset::Codex => "codex",
            AgentPreset::Gemini => "gemini",
            AgentPreset::Aider => "aider",
        }
    }

    /// The `agent` section this preset writes into config.json (JSON text): with `sandbox` the
    /// CLI's unattended mode (`agents/configs/NAME.json`), without it its prompting mode
    /// (`agents/configs/prompting/NAME.json`; docs/SPEC.md §12, docs/AGENTS.md §2). The bundled
    /// agents and aider have one configuration for both (notes XT10).
    pub fn config(self, sandbox: bool) -> &'static str {
        match (self, sandbox) {
            (AgentPreset::Reference, _) => include_str!("../../agents/configs/reference.json"),
            (AgentPreset::Coder, _) => include_str!("../../agents/configs/coder.json"),
            (AgentPreset::Claude, true) => include_str!("../../agents/configs/claude.json"),
            (AgentPreset::Claude, false) => {
                include_str!("../../agents/configs/prompting/claude.json")
            }
            (AgentPreset::Codex, true) => include_str!("../../agents/configs/codex.json"),
            (AgentPreset::Codex, false) => {
                include_str!("../../agents/configs/prompting/codex.json")
            }
            (AgentPreset::Gemini, true) => include_str!("../../agents/configs/gemini.json"),
            (AgentPreset::Gemini, false) => {
                include_str!("../../agents/configs/prompting/gemini.json")
            }
            (AgentPreset::Aider, _) => include_str!("../../agents/configs/aider.json"),
        }
    }

    /// The script this preset installs under the mount's `agents/`: its file name and text.
    fn bundled_script(self) -> Option<(&'static std::ffi::CStr, &'static str)> {
        match self {
            AgentPreset::Reference => Some((c"reference.sh", REFERENCE_AGENT)),
            AgentPreset::Coder => Some((c"coder.sh", CODER_AGENT)),
            AgentPreset::Claude | AgentPreset::Codex | AgentPreset::Gemini | AgentPreset::Aider => {
                None
            }
        }
    }
}

/// The default config.json with `agent` replaced by `agent`'s configuration (its unattended
/// mode with `sandbox`, its prompting mode without).
fn config_with_agent(agent: AgentPreset, sandbox: bool) -> Result<String> {
    let section = agent.config(sandbox);
    let agent = agent.name();
    let mut config: serde_json::Value = serde_json::from_str(DEFAULT_CONFIG)?;
    config["agent"] = serde_json::from_str(section)?;
    let text = serde_json::to_string_pretty(&config)? + "\n";
    crate::config::Config::parse(&text)
        .map_err(|e| anyhow!("bundled {agent} configuration: {e}"))?;
    Ok(text)
}

/// The default config.json with `agent.command` = `command` (`init --agent-command`), checked
/// like any config.json (unknown placeholders are refused, docs/SPEC.md §5, §8).
fn config_with_command(command: &[String]) -> Result<String> {
    if command.first().map_or(true, |c| c.is_empty()) {
        bail!("--agent-command needs a program to run");
    }
    let mut config: serde_json::Value = serde_json::from_str(DEFAULT_CONFIG)?;
    config["agent"]["command"] = serde_json::json!(command);
    let text = serde_json::to_string_pretty(&config)? + "\n";
    crate::config::Config::parse(&text).map_err(|e| anyhow!("--agent-command: {e}"))?;
    Ok(text)
}

/// The config.json that `init` writes: every key of docs/SPEC.md §8 at its default, no agent.
pub const DEFAULT_CONFIG: &str = r#"{
  "agent": { "env": {}, "timeout_secs": 1800, "retries": 1, "kill_grace_secs": 5 },
  "scheduler": { "max_concurrent": 4 },
  "limits": { "max_level": 3, "max_children": 5 },
  "operator": "read-write",
  "identity": "auto",
  "hooks": {},
  "hook_timeout_secs": 30
}
"#;

/// `config` with `"sandbox": {"enabled": false}` (`init --no-sandbox`, docs/SPEC.md §12).
fn config_without_sandbox(config: &str) -> Result<String> {
    let mut value: serde_json::Value = serde_json::from_str(config)?;
    value["sandbox"] = serde_json::json!({ "enabled": false });
    let text = serde_json::to_string_pretty(&value)? + "\n";
    crate::config::Config::parse(&text).map_err(|e| anyhow!("sandbox configuration: {e}"))?;
    Ok(text)
}

/// `config` with `"workspace": {"repo", "rev"}` of the checked project (docs/SPEC.md §8).
fn config_with_workspace(config: &str, p: &project::Checked) -> Result<String> {
    let mut value: serde_json::Value = serde_json::from_str(config)?;
    value["workspace"] = serde_json::json!({ "repo": p.repo, "rev": p.rev });
    let text = serde_json::to_string_pretty(&value)? + "\n";
    crate::config::Config::parse(&text).map_err(|e| anyhow!("workspace configuration: {e}"))?;
    Ok(text)
}

/// Run `smithfs init`.
pub fn run(args: InitArgs) -> Result<ExitCode> {
    let dir = util::absolute(&args.dir)?;
    match util::mount_state(&dir) {
        MountState::NotMounted => {}
        _ => bail!(
            "{} is mounted; run `smithfs init` before `smithfs mount`",
            dir.display()
        ),
    }
    let description = match (&args.task, &args.task_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the task file {}", f.display()))?,
        ),
        (None, None) => None,
    };
    if args.agent == Some(AgentPreset::Coder) && args.repo.is_none() {
        bail!("--agent coder needs --repo PATH: the coding agent edits the project in workspaces (docs/SPEC.md §11)");
    }
    // checked before anything is created, so a bad --agent-command leaves nothing behind
    let config = match (&args.agent, &args.agent_command) {
        (Some(a), _) => config_with_agent(*a, unattended(&args))?,
        (None, Some(cmd)) => config_with_command(cmd)?,
        (None, None) => DEFAULT_CONFIG.to_string(),
    };
    let config = if args.no_sandbox {
        config_without_sandbox(&config)?
    } else {
        config
    };
    if dir.exists() && !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let project = match &args.repo {
        Some(repo) => {
            let rev = args.rev.as_deref().unwrap_or("HEAD");
            let repo = util::absolute(repo)?;
            Some(project::check(&repo, rev, &dir).map_err(|e| anyhow!("{e}"))?)
        }
        None => None,
    };
    if dir.join("smiths/smith-root").exists() {
        bail!(
            "{} is already initialised (smiths/smith-root exists)",
            dir.display()
        );
    }
    if project.is_some() && dir.join(PROJECT_GIT).exists() {
        bail!("{} already has a {PROJECT_GIT}", dir.display());
    }
    let created = !dir.exists();
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let root = backing::open_store_root(&dir)
        .map_err(|e| anyhow!("cannot open {}: {e}", dir.display()))?;
    let root = root.as_fd();
    let templates = crate::daemon::load_templates(root)?;
    // SAFETY: umask has no preconditions; the scaffold's modes are meant literally.
    let old_umask = unsafe { libc::umask(0o022) };
    let agent = match (&args.agent, &args.agent_command) {
        (Some(a), _) => Some(Agent::Preset(*a)),
        (None, Some(_)) => Some(Agent::Command),
        (None, None) => None,
    };
    let config = match &project {
        Some(p) => config_with_workspace(&config, p)?,
        None => config,
    };
    if let Some(p) = &project {
        if let Err(e) = project::make_project_git(p, &dir) {
            let _ = std::fs::remove_dir_all(dir.join(PROJECT_GIT));
            if created {
                let _ = std::fs::remove_dir_all(&dir);
            }
            // SAFETY: as above.
            unsafe { libc::umask(old_umask) };
            bail!("{e}");
        }
    }
    let result = lay_out(
        root,
        &templates,
        &config,
        agent,
        description.as_deref(),
        args.title.as_deref(),
        project.as_ref(),
    );
    if result.is_err() && project.is_some() {
        // Nothing is left of a failed `init --repo` (docs/SPEC.md §11).
        if created {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            let _ = std::fs::remove_dir_all(dir.join(PROJECT_GIT));
        }
    }
    // SAFETY: as above.
    unsafe { libc::umask(old_umask) };
    result?;
    println!("initialised {}", dir.display());
    if let Some(p) = &project {
        println!(
            "  project: {} at {} ({}), in {PROJECT_GIT}; workspaces on smith/<full id with / as .>",
            p.repo.display(),
            p.rev,
            &p.commit[..p.commit.len().min(12)]
        );
        if p.dirty {
            eprintln!(
                "smithfs: warning: {} has uncommitted changes; they are not included (the root's workspace starts at HEAD, {})",
                p.repo.display(),
                &p.commit[..p.commit.len().min(12)]
            );
        }
        match project::exclude(p, &dir) {
            Ok(true) => println!(
                "  added {} to {}/info/exclude",
                dir.display(),
                p.git_dir.display()
            ),
            Ok(false) => {}
            Err(e) => eprintln!(
                "smithfs: warning: cannot add {} to info/exclude: {e}",
                dir.display()
            ),
        }
    }
    if description.is_some() {
        println!("  root task: smiths/smith-root/{ROOT_TASK_PATH}");
    }
    match (&args.agent, &args.agent_command) {
        (Some(a), _) => println!("  agent: {} (config.json \"agent\")", a.name()),
        (None, Some(cmd)) => println!(
            "  agent: {} (config.json \"agent\".\"command\")",
            serde_json::to_string(cmd).unwrap_or_default()
        ),
        (None, None) => println!(
            "  no agent configured: tasks wait until config.json has an \"agent\" (or use --agent)"
        ),
    }
    if args.no_sandbox {
        println!(
            "  sandbox: off (config.json \"sandbox\": {{\"enabled\": false}}): agents run as the mounting user; agent CLIs in their prompting modes"
        );
    }
    println!("  next: smithfs mount {}", dir.display());
    Ok(ExitCode::SUCCESS)
}

/// Whether `init --agent` writes the CLI's unattended mode: always but with `--no-sandbox`
/// (runs start in the sandbox, docs/SPEC.md §12 "Agent CLIs unattended").
fn unattended(args: &InitArgs) -> bool {
    !args.no_sandbox
}

/// The agent `init` configured, if any: a preset (`--agent`) or a command (`--agent-command`).
#[derive(Clone, Copy, Debug)]
enum Agent {
    Preset(AgentPreset),
    Command,
}

fn cstr(s: &str) -> Result<CString> {
    Ok(CString::new(s)?)
}

fn lay_out(
    root: BorrowedFd<'_>,
    t: &Templates,
    config: &str,
    agent: Option<Agent>,
    task: Option<&str>,
    title: Option<&str>,
    project: Option<&project::Checked>,
) -> Result<()> {
    let io = |what: &str, e: nix::errno::Errno| anyhow!("cannot create {what}: {e}");
    for d in ["agents", "results", "smiths", "templates"] {
        backing::ensure_dir(root, &cstr(d)?, 0o755).map_err(|e| io(d, e))?;
    }
    match backing::open_file(
        root,
        c"config.json",
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o644,
    ) {
        Ok(f) => {
            backing::pwrite(f.as_fd(), config.as_bytes(), 0).map_err(|e| io("config.json", e))?;
        }
        Err(nix::errno::Errno::EEXIST) if agent.is_some() || project.is_some() => {
            backing::write_atomic(root, c"config.json", config.as_bytes(), 0o644)
                .map_err(|e| io("config.json", e))?;
        }
        Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(io("config.json", e)),
    }
    if let Some((file, text)) = match agent {
        Some(Agent::Preset(a)) => a.bundled_script(),
        Some(Agent::Command) | None => None,
    } {
        let agents =
            backing::open_dir_path(root, Path::new("agents")).map_err(|e| io("agents", e))?;
        backing::write_atomic(agents.as_fd(), file, text.as_bytes(), 0o755)
            .map_err(|e| io(&format!("agents/{}", file.to_string_lossy()), e))?;
    }
    let templates =
        backing::open_dir_path(root, Path::new("templates")).map_err(|e| io("templates", e))?;
    let skills = backing::ensure_dir(templates.as_fd(), c"skills", 0o755)
        .map_err(|e| io("templates/skills", e))?;
    if let Some((path, content)) = t
        .skills()
        .iter()
        .find(|(p, _)| p.starts_with(BUILTIN_SKILL_NAME))
    {
        let skill = backing::ensure_dir(skills.as_fd(), &cstr(BUILTIN_SKILL_NAME)?, 0o755)
            .map_err(|e| io("templates/skills", e))?;
        let file = Path::new(path)
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("SKILL.md");
        if backing::stat_at(skill.as_fd(), &cstr(file)?).is_err() {
            backing::write_atomic(skill.as_fd(), &cstr(file)?, content.as_bytes(), 0o644)
                .map_err(|e| io("the bundled skill", e))?;
        }
    }
    let mut plan =
        plan_smith(t, &crate::tree::model::FullId::root()).map_err(|e| anyhow!("{e}"))?;
    if let Some(description) = task {
        let first_line = description.lines().next().unwrap_or("").trim();
        let title = title.unwrap_or(if first_line.is_empty() {
            "Root task"
        } else {
            first_line
        });
        let now = crate::time::now_rfc3339();
        let content = plan_task(
            t,
            &TaskSpec {
                title,
                task_id: "root",
                smith_id: ROOT_ID,
                parent_task_id: "none",
                timestamp: &now,
                level: 0,
                description,
                context: "Given by the operator at `smithfs init`.",
                expected_output: "A complete answer in outbox/result.md.",
            },
        )
        .map_err(|e| anyhow!("{e}"))?;
        plan.entries.push(PlanEntry::File {
            path: PathBuf::from(ROOT_TASK_PATH),
            mode: FILE_MODE,
            content,
        });
    }
    let smiths = backing::open_dir_path(root, Path::new("smiths")).map_err(|e| io("smiths", e))?;
    // SAFETY: getuid/getgid have no preconditions.
    let owner = unsafe { (libc::getuid(), libc::getgid()) };
    let Some(p) = project else {
        create_smith_dir(smiths.as_fd(), &cstr(ROOT_ID)?, &plan, Some(owner), None)
            .map_err(|e| io("smiths/smith-root", e))?;
        return Ok(());
    };
    plan.entries
        .extend(workspace::plan_workspace(ROOT_ID).ok_or_else(|| anyhow!("bad root id"))?);
    let mut failure: Option<String> = None;
    let run = GitRun {
        cwd: smiths.as_fd(),
        detach: None,
        creds: None,
        sandbox: None,
        deadline: None,
    };
    let mut finish = |tmp: &std::ffi::CStr| {
        let ws = Path::new(std::ffi::OsStr::from_bytes(tmp.to_bytes())).join(workspace::AREA);
        workspace::populate(&run, &ws, ROOT_ID, Base::Commit(&p.commit)).map_err(|e| {
            failure = Some(e.to_string());
            // The scaffold's failure, as the mount reports it; `failure` says what went wrong.
            crate::fs::FsError::Scaffold.errno()
        })?;
        Ok(())
    };
    let made = create_smith_dir(
        smiths.as_fd(),
        &cstr(ROOT_ID)?,
        &plan,
        Some(owner),
        Some(&mut finish),
    );
    match (made, failure) {
        (Ok(()), _) => Ok(()),
        (Err(_), Some(f)) => Err(anyhow!("cannot make the root's workspace: {f}")),
        (Err(e), None) => Err(io("smiths/smith-root", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::{config_with_agent, config_with_command, config_without_sandbox, AgentPreset};

    /// With the sandbox each CLI is in its unattended mode (docs/SPEC.md §12); `--no-sandbox`
    /// gives claude, codex and gemini their prompting modes and turns the sandbox off.
    #[test]
    fn agent_presets_unattended_with_the_sandbox_prompting_without() {
        let command = |agent, sandbox| -> String {
            let text = config_with_agent(agent, sandbox).expect("bundled config");
            let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            assert!(v.get("sandbox").is_none(), "{text}");
            v["agent"]["command"].to_string()
        };
        for (agent, unattended, prompting) in [
            (
                AgentPreset::Claude,
                "--dangerously-skip-permissions",
                "acceptEdits",
            ),
            (
                AgentPreset::Codex,
                "--dangerously-bypass-approvals-and-sandbox",
                "workspace-write",
            ),
            (AgentPreset::Gemini, "\"yolo\"", "auto_edit"),
            (AgentPreset::Aider, "--yes-always", "--yes-always"),
        ] {
            let on = command(agent, true);
            let off = command(agent, false);
            assert!(on.contains(unattended), "{agent:?}: {on}");
            assert!(off.contains(prompting), "{agent:?}: {off}");
            if agent != AgentPreset::Aider {
                assert!(!off.contains(unattended), "{agent:?}: {off}");
                assert!(!on.contains(prompting), "{agent:?}: {on}");
            }
        }
        let text = config_with_agent(AgentPreset::Claude, false).expect("config");
        let off: serde_json::Value =
            serde_json::from_str(&config_without_sandbox(&text).expect("config")).expect("JSON");
        assert_eq!(off["sandbox"], serde_json::json!({ "enabled": false }));
        let cfg = crate::config::Config::parse(&off.to_string()).expect("parses");
        assert!(!cfg.sandbox.enabled);
    }

    #[test]
    fn agent_command_becomes_agent_command_with_placeholders_checked() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        for (cmd, ok) in [
            (s(&["my-agent", "--task", "{task_file}", "-v"]), true),
            (
                s(&[
                    "sh",
                    "-c",
                    "echo {full_id} {level} {smith_id}",
                    "{mount}",
                    "{smith_dir}",
                ]),
                true,
            ),
            (s(&["my-agent", "{bogus}"]), false),
            (s(&["my-agent", "{task}"]), false),
            (s(&[""]), false),
            (vec![], false),
        ] {
            let got = config_with_command(&cmd);
            assert_eq!(got.is_ok(), ok, "{cmd:?}: {got:?}");
            if let Ok(text) = got {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["agent"]["command"], serde_json::json!(cmd));
                assert_eq!(
                    v["agent"]["retries"], 1,
                    "the other agent keys keep their defaults"
                );
            }
        }
    }
}
