//! The scaffold as a pure plan: what a new smith dir contains (docs/SPEC.md §1, §4) and the root
//! task file. The child-name rules and full ids are the tree model's (`super::model`), re-exported
//! here for the plan's callers.
//!
//! Nothing here touches the disk. The daemon's backing-store module applies a [`Plan`] under a
//! temporary name and renames the finished directory into place, so no half-made child is ever
//! visible (docs/SPEC.md §4, §9). `smithfs init` uses the same plan for `smith-root`.

use std::path::{Path, PathBuf};

use super::model::FullId;
pub use super::model::{child_name, parse_child_name, ROOT_ID};
use super::template::{render_named, TemplateError, Templates, SMITH_MD, START_HERE_MD, TASK_MD};

/// Permission bits of every directory in a plan. Access is decided by smithfs's policy (§3), not
/// by mode bits; these only have to let the owner and the operator work (`default_permissions`).
pub const DIR_MODE: u32 = 0o755;
/// Permission bits of every file in a plan (see [`DIR_MODE`]). `smith.md` is 0644 too, because the
/// operator may edit it (§3); smithfs refuses writes by smiths.
pub const FILE_MODE: u32 = 0o644;
/// The areas every smith dir has, besides `.claude/` (§1, §4), in the order the plan creates them.
/// `home/` is seeded from `templates/home/` by the daemon's scaffold (docs/SPEC.md §12).
pub const AREAS: [&str; 6] = [
    "inbox",
    "private",
    "outbox",
    "children",
    "conversations",
    "home",
];
/// Where skills are copied to, relative to the smith dir (§1).
pub const SKILLS_DEST: &str = ".claude/skills";
/// Where `smith.md` goes, relative to the smith dir.
pub const SMITH_MD_PATH: &str = "smith.md";
/// Where the start guide goes, relative to the smith dir (§4).
pub const START_HERE_PATH: &str = "private/START_HERE.md";
/// The root task written by `smithfs init`, relative to the root smith dir.
pub const ROOT_TASK_PATH: &str = "inbox/task-root.md";

/// One thing to create in a new smith dir. Paths are relative to the smith dir, never empty, never
/// absolute and free of `.`/`..`; `mode` holds permission bits only (no file-type bits) and is the
/// intended final mode (the applier should not let its umask narrow it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanEntry {
    /// A directory.
    Dir {
        /// Relative to the smith dir.
        path: PathBuf,
        /// Permission bits, e.g. [`DIR_MODE`].
        mode: u32,
    },
    /// A regular file with the given content.
    File {
        /// Relative to the smith dir.
        path: PathBuf,
        /// Permission bits, e.g. [`FILE_MODE`].
        mode: u32,
        /// The complete content (UTF-8 text for the built-in templates; bytes in general).
        content: Vec<u8>,
    },
}

impl PlanEntry {
    /// The entry's path, relative to the smith dir.
    pub fn path(&self) -> &Path {
        match self {
            PlanEntry::Dir { path, .. } | PlanEntry::File { path, .. } => path,
        }
    }
}

/// The complete content of a new smith dir, excluding the smith dir itself (the applier creates it).
///
/// Order: every directory comes before anything inside it (all directories first, then files), so
/// applying the entries in order with `mkdirat`/`openat` always finds the parent in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The entries, in creation order.
    pub entries: Vec<PlanEntry>,
}

/// Plans the smith dir of `full_id` (docs/SPEC.md §4): the areas `inbox/ private/ outbox/ children/
/// conversations/`, `.claude/skills/` with every skill of `t` below it, `smith.md` and
/// `private/START_HERE.md` rendered with `{SMITH_ID}` = its short id, `{PARENT_ID}` = the parent's
/// full id or `none`, `{LEVEL}` = its level, `{FULL_ID}` = `full_id` and `{SMITH_DIR}` = the
/// smith dir relative to the mount root ([`FullId::smith_dir_rel`]). Skills are copied verbatim.
///
/// # Errors
/// [`TemplateError::UnknownPlaceholder`] if a template uses a placeholder outside
/// [`SMITH_VARS`](super::template::SMITH_VARS) (impossible for a `Templates` built by its
/// constructors, which validate).
pub fn plan_smith(t: &Templates, full_id: &FullId) -> Result<Plan, TemplateError> {
    let smith_dir = full_id.smith_dir_rel();
    let parent = full_id.parent();
    let level_text = full_id.level().to_string();
    let smith_dir_text = smith_dir.to_string_lossy();
    let vars = [
        ("SMITH_ID", full_id.short()),
        ("PARENT_ID", parent.as_ref().map_or("none", |p| p.as_str())),
        ("LEVEL", level_text.as_str()),
        ("FULL_ID", full_id.as_str()),
        ("SMITH_DIR", smith_dir_text.as_ref()),
    ];
    let smith_md = render_named(SMITH_MD, t.smith_md(), &vars)?;
    let start_here = render_named(START_HERE_MD, t.start_here_md(), &vars)?;

    let mut dirs: Vec<PathBuf> = AREAS.iter().map(PathBuf::from).collect();
    let skills_root = PathBuf::from(SKILLS_DEST);
    for ancestor in skills_root
        .ancestors()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        push_unique(&mut dirs, ancestor);
    }
    let mut files = vec![
        file(PathBuf::from(SMITH_MD_PATH), smith_md.into_bytes()),
        file(PathBuf::from(START_HERE_PATH), start_here.into_bytes()),
    ];
    for (rel, content) in t.skills() {
        let dest = skills_root.join(rel);
        // Ancestors from the outside in, so parents precede children.
        let parents: Vec<&Path> = dest.ancestors().skip(1).collect();
        for parent in parents.into_iter().rev() {
            push_unique(&mut dirs, parent);
        }
        files.push(file(dest, content.clone().into_bytes()));
    }

    let mut entries: Vec<PlanEntry> = dirs
        .into_iter()
        .map(|path| PlanEntry::Dir {
            path,
            mode: DIR_MODE,
        })
        .collect();
    entries.extend(files);
    Ok(Plan { entries })
}

fn file(path: PathBuf, content: Vec<u8>) -> PlanEntry {
    PlanEntry::File {
        path,
        mode: FILE_MODE,
        content,
    }
}

/// Appends `p` unless it is empty or already present.
fn push_unique(dirs: &mut Vec<PathBuf>, p: &Path) {
    if !p.as_os_str().is_empty() && !dirs.iter().any(|d| d == p) {
        dirs.push(p.to_path_buf());
    }
}

/// The smith dir of `full_id` relative to the mount root: `smith-root` → `smiths/smith-root`,
/// `smith-root/smith-001/smith-002` → `smiths/smith-root/children/smith-001/children/smith-002`.
/// `None` if `full_id` is not `smith-root` followed by zero or more `/smith-NNN` (§1).
pub fn smith_dir_rel(full_id: &str) -> Option<PathBuf> {
    FullId::parse(full_id).map(|f| f.smith_dir_rel())
}

/// The values of `task.md`'s placeholders (the seed's task template), for [`plan_task`].
///
/// All text is inserted verbatim (never re-scanned for placeholders). For the root task written by
/// `smithfs init`: `task_id` = `root`, `smith_id` = `smith-root`, `parent_task_id` = `none`,
/// `level` = 0. `timestamp` is the caller's choice of format; smithfs uses RFC 3339.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSpec<'a> {
    /// `{TITLE}`: one line.
    pub title: &'a str,
    /// `{TASK_ID}`: e.g. `root`, `smith-001`.
    pub task_id: &'a str,
    /// `{SMITH_ID}`: the smith the task is for (its full id is clearest).
    pub smith_id: &'a str,
    /// `{PARENT_TASK_ID}`: the task this one was split from, or `none`.
    pub parent_task_id: &'a str,
    /// `{TIMESTAMP}`: when the task was written.
    pub timestamp: &'a str,
    /// `{LEVEL}`: the level of the smith the task is for.
    pub level: u8,
    /// `{DESCRIPTION}`: what to do (any text, may span lines).
    pub description: &'a str,
    /// `{CONTEXT}`: what the smith needs to know (any text).
    pub context: &'a str,
    /// `{EXPECTED_OUTPUT}`: what the result must contain (any text).
    pub expected_output: &'a str,
}

/// Renders `task.md` with `task`'s values: the content for `inbox/task-root.md`
/// ([`ROOT_TASK_PATH`]) at `smithfs init`, or any task file.
///
/// # Errors
/// [`TemplateError::UnknownPlaceholder`] if the template uses a placeholder outside
/// [`TASK_VARS`](super::template::TASK_VARS) (impossible for a validated `Templates`).
pub fn plan_task(t: &Templates, task: &TaskSpec<'_>) -> Result<Vec<u8>, TemplateError> {
    let level = task.level.to_string();
    let vars = [
        ("TITLE", task.title),
        ("TASK_ID", task.task_id),
        ("SMITH_ID", task.smith_id),
        ("PARENT_TASK_ID", task.parent_task_id),
        ("TIMESTAMP", task.timestamp),
        ("LEVEL", level.as_str()),
        ("DESCRIPTION", task.description),
        ("CONTEXT", task.context),
        ("EXPECTED_OUTPUT", task.expected_output),
    ];
    render_named(TASK_MD, t.task_md(), &vars).map(String::into_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::template::{Templates, SMITH_VARS};

    fn content<'p>(plan: &'p Plan, path: &str) -> &'p str {
        plan.entries
            .iter()
            .find_map(|e| match e {
                PlanEntry::File {
                    path: p, content, ..
                } if p == Path::new(path) => Some(std::str::from_utf8(content).unwrap()),
                PlanEntry::File { .. } | PlanEntry::Dir { .. } => None,
            })
            .unwrap_or_else(|| panic!("no file {path}"))
    }

    fn assert_parents_first(plan: &Plan) {
        for (i, e) in plan.entries.iter().enumerate() {
            let path = e.path();
            assert!(
                path.is_relative() && !path.as_os_str().is_empty(),
                "{path:?}"
            );
            assert_eq!(
                plan.entries.iter().filter(|o| o.path() == path).count(),
                1,
                "duplicate {path:?}"
            );
            let parent = path.parent().unwrap();
            if !parent.as_os_str().is_empty() {
                let pos = plan
                    .entries
                    .iter()
                    .position(|o| matches!(o, PlanEntry::Dir { path: p, .. } if p == parent));
                assert!(pos.is_some_and(|p| p < i), "{path:?} before its parent");
            }
        }
    }

    #[test]
    fn root_plan_has_the_layout() {
        let plan = plan_smith(&Templates::builtin(), &FullId::root()).unwrap();
        let paths: Vec<_> = plan
            .entries
            .iter()
            .map(|e| e.path().to_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                "inbox",
                "private",
                "outbox",
                "children",
                "conversations",
                "home",
                ".claude",
                ".claude/skills",
                ".claude/skills/agent-smith",
                "smith.md",
                "private/START_HERE.md",
                ".claude/skills/agent-smith/SKILL.md",
            ]
        );
        assert_parents_first(&plan);
        for e in &plan.entries {
            match e {
                PlanEntry::Dir { mode, .. } => assert_eq!(*mode, DIR_MODE),
                PlanEntry::File { mode, .. } => assert_eq!(*mode, FILE_MODE),
            }
        }
        let smith_md = content(&plan, "smith.md");
        assert!(smith_md.contains("| Parent | `none` |"));
        assert!(smith_md.contains("| Level | 0 "));
        let start = content(&plan, "private/START_HERE.md");
        assert!(
            start.contains("`$SMITH_MOUNT/smiths/smith-root`"),
            "{start}"
        );
        assert_eq!(
            content(&plan, ".claude/skills/agent-smith/SKILL.md"),
            Templates::builtin().skills()[0].1
        );
    }

    #[test]
    fn child_plan_fills_placeholders() {
        let full = FullId::parse("smith-root/smith-001/smith-002").unwrap();
        let plan = plan_smith(&Templates::builtin(), &full).unwrap();
        assert_parents_first(&plan);
        let smith_md = content(&plan, "smith.md");
        assert!(smith_md.starts_with("# Smith smith-002\n"));
        assert!(smith_md.contains("`smith-root/smith-001/smith-002`"));
        assert!(smith_md.contains("| Parent | `smith-root/smith-001` |"));
        assert!(smith_md.contains("You are at level 2"));
        let start = content(&plan, "private/START_HERE.md");
        assert!(start.contains("smiths/smith-root/children/smith-001/children/smith-002"));
        for e in &plan.entries {
            if let PlanEntry::File { path, content, .. } = e {
                if !path.starts_with(SKILLS_DEST) {
                    let text = String::from_utf8(content.clone()).unwrap();
                    for var in SMITH_VARS {
                        assert!(!text.contains(&format!("{{{var}}}")), "{path:?} kept {var}");
                    }
                }
            }
        }
    }

    #[test]
    fn nested_skills_get_their_directories() {
        let t = Templates::with_overrides(|n| (n == "smith.md").then(|| "{FULL_ID}".to_owned()))
            .unwrap()
            .with_skills(vec![
                ("b/SKILL.md".into(), "{NOT_RENDERED}".into()),
                ("b/scripts/run.sh".into(), "echo".into()),
                ("a/SKILL.md".into(), "a".into()),
            ])
            .unwrap();
        let plan = plan_smith(&t, &FullId::parse("smith-root/smith-001").unwrap()).unwrap();
        assert_parents_first(&plan);
        assert_eq!(content(&plan, "smith.md"), "smith-root/smith-001");
        assert_eq!(
            content(&plan, ".claude/skills/b/SKILL.md"),
            "{NOT_RENDERED}"
        );
        assert_eq!(content(&plan, ".claude/skills/b/scripts/run.sh"), "echo");
        let empty = Templates::builtin().with_skills(Vec::new()).unwrap();
        let plan = plan_smith(&empty, &FullId::root()).unwrap();
        assert!(plan
            .entries
            .iter()
            .any(|e| e.path() == Path::new(SKILLS_DEST)));
    }

    #[test]
    fn smith_dir_rel_table() {
        assert_eq!(
            smith_dir_rel("smith-root"),
            Some("smiths/smith-root".into())
        );
        assert_eq!(
            smith_dir_rel("smith-root/smith-001/smith-1000"),
            Some("smiths/smith-root/children/smith-001/children/smith-1000".into())
        );
        for bad in [
            "",
            "/smith-root",
            "smith-root/",
            "smith-root//smith-001",
            "smith-root/../x",
        ] {
            assert_eq!(smith_dir_rel(bad), None, "{bad}");
        }
    }

    #[test]
    fn root_task_renders() {
        let task = TaskSpec {
            title: "Write {a} report",
            task_id: "root",
            smith_id: ROOT_ID,
            parent_task_id: "none",
            timestamp: "2025-01-02T03:04:05Z",
            level: 0,
            description: "Line one\nLine {TWO}",
            context: "",
            expected_output: "A markdown file",
        };
        let bytes = plan_task(&Templates::builtin(), &task).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("# Task: Write {a} report\n"));
        assert!(text.contains("Line one\nLine {TWO}"));
        assert!(text.contains("| Task id | `root` |"));
        assert!(text.contains("| Parent task | `none` |"));
        assert!(text.contains("2025-01-02T03:04:05Z"));
        assert!(text.contains("(level 0)"));
        assert!(text.contains("A markdown file"));
    }
}
