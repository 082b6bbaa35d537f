//! The scaffold as a pure plan: what a new smith dir contains (PROTOCOL.md §1, §4), the root task
//! file, and the child-name rules (`smith-NNN`).
//!
//! Nothing here touches the disk. The daemon's backing-store module applies a [`Plan`] under a
//! temporary name and renames the finished directory into place, so no half-made child is ever
//! visible (PROTOCOL.md §4, §9). `smithfs init` uses the same plan for `smith-root`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::template::{render_named, TemplateError, Templates, SMITH_MD, START_HERE_MD, TASK_MD};

/// Permission bits of every directory in a plan. Access is decided by smithfs's policy (§3), not
/// by mode bits; these only have to let the owner and the operator work (`default_permissions`).
pub const DIR_MODE: u32 = 0o755;
/// Permission bits of every file in a plan (see [`DIR_MODE`]). `smith.md` is 0644 too, because the
/// operator may edit it (§3); smithfs refuses writes by smiths.
pub const FILE_MODE: u32 = 0o644;
/// The root smith's id and full id (§1).
pub const ROOT_ID: &str = "smith-root";
/// The areas every smith dir has, besides `.claude/` (§1, §4), in the order the plan creates them.
pub const AREAS: [&str; 5] = ["inbox", "private", "outbox", "children", "conversations"];
/// Where skills are copied to, relative to the smith dir (§1).
pub const SKILLS_DEST: &str = ".claude/skills";
/// Where `smith.md` goes, relative to the smith dir.
pub const SMITH_MD_PATH: &str = "smith.md";
/// Where the start guide goes, relative to the smith dir (§4).
pub const START_HERE_PATH: &str = "private/START_HERE.md";
/// The root task written by `smithfs init`, relative to the root smith dir.
pub const ROOT_TASK_PATH: &str = "inbox/task-root.md";

const CHILD_PREFIX: &str = "smith-";

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

/// Plans the smith dir of `full_id` (PROTOCOL.md §4): the areas `inbox/ private/ outbox/ children/
/// conversations/`, `.claude/skills/` with every skill of `t` below it, `smith.md` and
/// `private/START_HERE.md` rendered with `{SMITH_ID}` = `smith_id`, `{PARENT_ID}` =
/// `parent_full_id` or `none`, `{LEVEL}` = `level`, `{FULL_ID}` = `full_id` and `{SMITH_DIR}` = the
/// smith dir relative to the mount root (see [`smith_dir_rel`]). Skills are copied verbatim.
///
/// The arguments are redundant on purpose and must agree: `full_id` is `smith-root` followed by
/// zero or more `/smith-NNN` ([`parse_child_name`]), `smith_id` is its last component,
/// `parent_full_id` is the rest (`None` for the root) and `level` is its number of `/`.
///
/// # Errors
/// [`TemplateError::BadArgument`] if the arguments disagree or `full_id` is malformed;
/// [`TemplateError::UnknownPlaceholder`] if a template uses a placeholder outside
/// [`SMITH_VARS`](super::template::SMITH_VARS) (impossible for a `Templates` built by its
/// constructors, which validate).
pub fn plan_smith(
    t: &Templates,
    smith_id: &str,
    full_id: &str,
    parent_full_id: Option<&str>,
    level: u8,
) -> Result<Plan, TemplateError> {
    let smith_dir = check_identity(smith_id, full_id, parent_full_id, level)?;
    let level_text = level.to_string();
    let smith_dir_text = smith_dir.to_string_lossy();
    let vars = [
        ("SMITH_ID", smith_id),
        ("PARENT_ID", parent_full_id.unwrap_or("none")),
        ("LEVEL", level_text.as_str()),
        ("FULL_ID", full_id),
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

/// Validates the identity arguments of [`plan_smith`]; returns the mount-relative smith dir.
fn check_identity(
    smith_id: &str,
    full_id: &str,
    parent_full_id: Option<&str>,
    level: u8,
) -> Result<PathBuf, TemplateError> {
    let bad = |what, value: &str, reason| TemplateError::BadArgument {
        what,
        value: value.to_owned(),
        reason,
    };
    let smith_dir = smith_dir_rel(full_id).ok_or_else(|| {
        bad(
            "full_id",
            full_id,
            "not a full smith id: `smith-root` followed by zero or more `/smith-NNN`",
        )
    })?;
    let (parent, last) = match full_id.rsplit_once('/') {
        Some((parent, last)) => (Some(parent), last),
        None => (None, full_id),
    };
    if smith_id != last {
        return Err(bad(
            "smith_id",
            smith_id,
            "is not the last component of full_id",
        ));
    }
    if parent_full_id != parent {
        return Err(bad(
            "parent_full_id",
            parent_full_id.unwrap_or("<none>"),
            "is not full_id without its last component (none for the root)",
        ));
    }
    if full_id.matches('/').count() != usize::from(level) {
        return Err(bad(
            "level",
            &level.to_string(),
            "is not the depth of full_id (its number of `/`)",
        ));
    }
    Ok(smith_dir)
}

/// The smith dir of `full_id` relative to the mount root: `smith-root` → `smiths/smith-root`,
/// `smith-root/smith-001/smith-002` → `smiths/smith-root/children/smith-001/children/smith-002`.
/// `None` if `full_id` is not `smith-root` followed by zero or more `/smith-NNN` (§1).
pub fn smith_dir_rel(full_id: &str) -> Option<PathBuf> {
    let mut parts = full_id.split('/');
    if parts.next() != Some(ROOT_ID) {
        return None;
    }
    let mut dir = PathBuf::from("smiths");
    dir.push(ROOT_ID);
    for part in parts {
        parse_child_name(OsStr::new(part))?;
        dir.push("children");
        dir.push(part);
    }
    Some(dir)
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

/// The number of a child dir name, or `None` if `name` is not a valid child name (§4 rule 3 →
/// EINVAL).
///
/// Valid: `smith-` followed by three or more ASCII digits and nothing else (no sign, no spaces),
/// whose value fits in a `u32`. `smith-000` is a valid name, as PROTOCOL.md §4 rule 3 reads (three
/// digits, and 0 is above every number a smith without children has used); the scheduler and
/// `why` still suggest `smith-001` first (docs/PROTOCOL-NOTES.md). Extra leading
/// zeros are accepted (`smith-0042` is 42, as "three or more digits" allows); the strictly
/// increasing rule compares numbers, so `smith-042` and `smith-0042` can never both exist.
pub fn parse_child_name(name: &OsStr) -> Option<u32> {
    let digits = name.as_bytes().strip_prefix(CHILD_PREFIX.as_bytes())?;
    if digits.len() < 3 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: u32 = 0;
    for d in digits {
        n = n.checked_mul(10)?.checked_add(u32::from(d - b'0'))?;
    }
    Some(n)
}

/// The canonical name of child number `n`: `smith-` and `n` zero-padded to three digits
/// (`1` → `smith-001`, `1234` → `smith-1234`). For every `n`,
/// `parse_child_name(child_name(n)) == Some(n)`.
pub fn child_name(n: u32) -> String {
    format!("{CHILD_PREFIX}{n:03}")
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
        let plan = plan_smith(&Templates::builtin(), ROOT_ID, ROOT_ID, None, 0).unwrap();
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
        let plan = plan_smith(
            &Templates::builtin(),
            "smith-002",
            "smith-root/smith-001/smith-002",
            Some("smith-root/smith-001"),
            2,
        )
        .unwrap();
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
        let plan = plan_smith(
            &t,
            "smith-001",
            "smith-root/smith-001",
            Some("smith-root"),
            1,
        )
        .unwrap();
        assert_parents_first(&plan);
        assert_eq!(content(&plan, "smith.md"), "smith-root/smith-001");
        assert_eq!(
            content(&plan, ".claude/skills/b/SKILL.md"),
            "{NOT_RENDERED}"
        );
        assert_eq!(content(&plan, ".claude/skills/b/scripts/run.sh"), "echo");
        let empty = Templates::builtin().with_skills(Vec::new()).unwrap();
        let plan = plan_smith(&empty, ROOT_ID, ROOT_ID, None, 0).unwrap();
        assert!(plan
            .entries
            .iter()
            .any(|e| e.path() == Path::new(SKILLS_DEST)));
    }

    #[test]
    fn inconsistent_arguments_are_refused() {
        let t = Templates::builtin();
        let cases: &[(&str, &str, Option<&str>, u8, &str)] = &[
            ("smith-001", "smith-001", None, 0, "full_id"),
            ("smith-root", "root", None, 0, "full_id"),
            ("x", "smith-root/x", Some("smith-root"), 1, "full_id"),
            ("", "", None, 0, "full_id"),
            (
                "smith-root",
                "smith-root/",
                Some("smith-root"),
                1,
                "full_id",
            ),
            (
                "smith-002",
                "smith-root/smith-001",
                Some("smith-root"),
                1,
                "smith_id",
            ),
            (
                "smith-001",
                "smith-root/smith-001",
                None,
                1,
                "parent_full_id",
            ),
            (
                "smith-root",
                "smith-root",
                Some("smith-root"),
                0,
                "parent_full_id",
            ),
            (
                "smith-001",
                "smith-root/smith-001",
                Some("smith-root"),
                2,
                "level",
            ),
            ("smith-root", "smith-root", None, 1, "level"),
        ];
        for (id, full, parent, level, what) in cases {
            match plan_smith(&t, id, full, *parent, *level) {
                Err(TemplateError::BadArgument { what: w, .. }) => assert_eq!(w, *what, "{full}"),
                other => panic!("{full}: {other:?}"),
            }
        }
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

    #[test]
    fn child_names_table() {
        let cases: &[(&[u8], Option<u32>)] = &[
            (b"smith-001", Some(1)),
            (b"smith-042", Some(42)),
            (b"smith-999", Some(999)),
            (b"smith-1000", Some(1000)),
            (b"smith-0042", Some(42)),
            (b"smith-4294967295", Some(u32::MAX)),
            (b"smith-4294967296", None),
            (b"smith-99999999999999999999", None),
            (b"smith-000", Some(0)),
            (b"smith-0000", Some(0)),
            (b"smith-01", None),
            (b"smith-1", None),
            (b"smith-", None),
            (b"smith-+01", None),
            (b"smith--01", None),
            (b"smith-+001", None),
            (b"smith-001 ", None),
            (b" smith-001", None),
            (b"smith-00a", None),
            (b"Smith-001", None),
            (b"smith_001", None),
            (b"smith-root", None),
            (b"smith-\xd9\xa1\xd9\xa2\xd9\xa3", None), // Arabic-Indic digits
            (b"smith-\xff01", None),
            (b"", None),
        ];
        for (name, want) in cases {
            assert_eq!(parse_child_name(OsStr::from_bytes(name)), *want, "{name:?}");
        }
        assert_eq!(child_name(1), "smith-001");
        assert_eq!(child_name(42), "smith-042");
        assert_eq!(child_name(1000), "smith-1000");
        assert_eq!(child_name(0), "smith-000");
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn child_name_round_trips(n in 0u32..) {
                prop_assert_eq!(parse_child_name(OsStr::new(&child_name(n))), Some(n));
            }

            #[test]
            fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
                let mut name = b"smith-".to_vec();
                name.extend_from_slice(&bytes);
                let _ = parse_child_name(OsStr::from_bytes(&name));
                let _ = parse_child_name(OsStr::from_bytes(&bytes));
            }
        }
    }
}
