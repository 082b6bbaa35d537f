//! Strict template rendering and the template set used by the scaffold (docs/SPEC.md §1, §4).
//!
//! # Placeholder syntax
//!
//! A *placeholder* is exactly `{` followed by one or more characters from `[A-Z_]` followed by `}`,
//! e.g. `{SMITH_ID}`. Nothing else is a placeholder: `{}`, `{ X }`, `{smith_id}`, `{A1}` and an
//! unclosed `{X` are ordinary text, so markdown and code samples (`fn f() { … }`, `{"key": 1}`,
//! `awk '{print $1}'`) pass through untouched. Shell's `${HOME}` *does* contain the placeholder
//! `{HOME}`; write `${{HOME}}` (see the escape below) to get it literally.
//!
//! - A placeholder whose name is in the supplied variables is replaced by its value. Values are
//!   inserted verbatim and never re-scanned, so a task description may itself contain `{FOO}`.
//! - A placeholder whose name is not supplied is an error ([`TemplateError::UnknownPlaceholder`])
//!   naming it, with its line and column: a typo never reaches an agent silently.
//! - `{{NAME}}` (doubled braces around a placeholder name) renders as the literal text `{NAME}`;
//!   that is the only escape. Any other `{{` is ordinary text.
//! - Supplied variables that the template does not use are fine (an override may say less).
//! - The text is scanned left to right and the first rule that matches at a position wins (the
//!   escape before the placeholder), so `{{{A}}}` is `{` + `{{A}}` + `}` → `{{A}}`.
//!
//! Skills (`templates/skills/**`) are copied verbatim and never rendered (docs/SPEC.md §4 says
//! "copied"), so they may contain any braces.
//!
//! This module is pure: [`Templates::with_overrides`] takes a reader closure and never touches the
//! filesystem itself.

use std::fmt;
use std::path::{Component, Path};

/// Name of the smith definition template, relative to `templates/` (docs/SPEC.md §1).
pub const SMITH_MD: &str = "smith.md";
/// Name of the task template, relative to `templates/` (docs/SPEC.md §1).
pub const TASK_MD: &str = "task.md";
/// Name of the start guide template, relative to `templates/` (docs/SPEC.md §1, §4).
pub const START_HERE_MD: &str = "START_HERE.md";
/// Directory of skills, relative to `templates/`; each skill is `skills/<name>/…` (docs/SPEC.md §1).
pub const SKILLS_DIR: &str = "skills";
/// Name of the bundled skill (`skills/agent-smith/SKILL.md`).
pub const BUILTIN_SKILL_NAME: &str = "agent-smith";

/// Placeholders available to `smith.md` and `START_HERE.md`.
///
/// `SMITH_ID` short id (`smith-001`); `PARENT_ID` the parent's *full* id, or `none` for the root;
/// `LEVEL` decimal depth (root 0); `FULL_ID` the chain of ids (`smith-root/smith-001`);
/// `SMITH_DIR` the smith dir relative to the mount root (`smiths/smith-root/children/smith-001`).
pub const SMITH_VARS: &[&str] = &["SMITH_ID", "PARENT_ID", "LEVEL", "FULL_ID", "SMITH_DIR"];

/// Placeholders available to `task.md` (the seed's task template).
pub const TASK_VARS: &[&str] = &[
    "TITLE",
    "TASK_ID",
    "SMITH_ID",
    "PARENT_TASK_ID",
    "TIMESTAMP",
    "LEVEL",
    "DESCRIPTION",
    "CONTEXT",
    "EXPECTED_OUTPUT",
];

const BUILTIN_SMITH_MD: &str = include_str!("templates/smith.md");
const BUILTIN_TASK_MD: &str = include_str!("templates/task.md");
const BUILTIN_START_HERE_MD: &str = include_str!("templates/START_HERE.md");
const BUILTIN_SKILL_MD: &str = include_str!("templates/skills/agent-smith/SKILL.md");

/// Errors from rendering templates and from building a template set or a scaffold plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template contains `{NAME}` and no value for `NAME` was supplied.
    /// `line` and `column` are 1-based; `column` counts characters. `known` lists the supplied names.
    #[error(
        "{template}: unknown placeholder {{{name}}} at line {line}, column {column} (known: {})",
        KnownList(known)
    )]
    UnknownPlaceholder {
        /// Which template (`smith.md`, `templates/task.md (override)`, or `template` for [`render`]).
        template: String,
        /// The placeholder name, without braces.
        name: String,
        /// 1-based line of the opening brace.
        line: usize,
        /// 1-based character column of the opening brace.
        column: usize,
        /// The names that were supplied, in the order given.
        known: Vec<String>,
    },
    /// A skill path is not a relative path of plain, non-empty components of the form
    /// `<name>/<file…>` (no `..`, no `.`, no leading `/`, at least two components).
    #[error(
        "skill path {path:?} must be relative, like `agent-smith/SKILL.md`, with no `.`/`..` parts"
    )]
    BadSkillPath {
        /// The offending path, as given.
        path: String,
    },
    /// An argument to the scaffold does not fit docs/SPEC.md §1 (e.g. `full_id` does not end in
    /// `smith_id`, or `level` is not the depth of `full_id`).
    #[error("{what} = {value:?}: {reason}")]
    BadArgument {
        /// The argument's name (`full_id`, `level`, …).
        what: &'static str,
        /// Its value, as given.
        value: String,
        /// Why it was refused.
        reason: &'static str,
    },
}

/// Formats the list of known placeholder names for an error message.
struct KnownList<'a>(&'a [String]);

impl fmt::Display for KnownList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, name) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{{{name}}}")?;
        }
        Ok(())
    }
}

/// Renders `template`, replacing every placeholder `{NAME}` with the value paired with `NAME` in
/// `vars` (the first pair wins if a name repeats). See the module docs for the exact syntax.
///
/// # Errors
/// [`TemplateError::UnknownPlaceholder`] for the first placeholder without a value; the error names
/// the template as `template` (use [`render_named`] for a better name).
pub fn render(template: &str, vars: &[(&str, &str)]) -> Result<String, TemplateError> {
    render_named("template", template, vars)
}

/// Like [`render`], but errors name the template as `name` (e.g. `smith.md`).
///
/// # Errors
/// [`TemplateError::UnknownPlaceholder`] for the first placeholder without a value.
pub fn render_named(
    name: &str,
    template: &str,
    vars: &[(&str, &str)],
) -> Result<String, TemplateError> {
    let bytes = template.as_bytes();
    let mut out = String::with_capacity(template.len());
    let mut copied = 0; // template[..copied] is already in `out`
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'{' {
            i += 1;
            continue;
        }
        // `{{NAME}}` → literal `{NAME}`.
        if let Some(end) = name_end(bytes, i + 2) {
            if bytes.get(i + 1) == Some(&b'{')
                && bytes.get(end) == Some(&b'}')
                && bytes.get(end + 1) == Some(&b'}')
            {
                out.push_str(&template[copied..i]);
                out.push_str(&template[i + 1..end + 1]);
                i = end + 2;
                copied = i;
                continue;
            }
        }
        // `{NAME}` → value.
        if let Some(end) = name_end(bytes, i + 1) {
            if bytes.get(end) == Some(&b'}') {
                let key = &template[i + 1..end];
                match vars.iter().find(|(k, _)| *k == key) {
                    Some((_, value)) => {
                        out.push_str(&template[copied..i]);
                        out.push_str(value);
                        i = end + 1;
                        copied = i;
                        continue;
                    }
                    None => {
                        let (line, column) = line_column(template, i);
                        return Err(TemplateError::UnknownPlaceholder {
                            template: name.to_owned(),
                            name: key.to_owned(),
                            line,
                            column,
                            known: vars.iter().map(|(k, _)| (*k).to_owned()).collect(),
                        });
                    }
                }
            }
        }
        i += 1;
    }
    out.push_str(&template[copied..]);
    Ok(out)
}

/// Checks that every placeholder in `template` is one of `allowed`, without producing output.
///
/// # Errors
/// [`TemplateError::UnknownPlaceholder`] for the first placeholder not in `allowed`, naming the
/// template as `name`.
pub fn check(name: &str, template: &str, allowed: &[&str]) -> Result<(), TemplateError> {
    let vars: Vec<(&str, &str)> = allowed.iter().map(|k| (*k, "")).collect();
    render_named(name, template, &vars).map(drop)
}

/// If `bytes[start..]` begins with one or more `[A-Z_]`, the index just past them.
fn name_end(bytes: &[u8], start: usize) -> Option<usize> {
    let rest = bytes.get(start..)?;
    let len = rest
        .iter()
        .take_while(|b| b.is_ascii_uppercase() || **b == b'_')
        .count();
    (len > 0).then_some(start + len)
}

/// 1-based (line, character column) of byte offset `at` (a char boundary) in `text`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |p| p + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The template set the scaffold renders: `smith.md`, `task.md`, `START_HERE.md` and the skills.
///
/// Invariants (checked by every constructor): the three templates use only their placeholders
/// ([`SMITH_VARS`] for `smith.md` and `START_HERE.md`, [`TASK_VARS`] for `task.md`), and every skill
/// path is a valid relative path (see [`TemplateError::BadSkillPath`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Templates {
    smith_md: String,
    task_md: String,
    start_here_md: String,
    skills: Vec<(String, String)>,
}

impl Templates {
    /// The templates compiled into smithfs (`src/tree/templates/`), with the one bundled skill
    /// `agent-smith/SKILL.md`.
    pub fn builtin() -> Self {
        Templates {
            smith_md: BUILTIN_SMITH_MD.to_owned(),
            task_md: BUILTIN_TASK_MD.to_owned(),
            start_here_md: BUILTIN_START_HERE_MD.to_owned(),
            skills: vec![(
                format!("{BUILTIN_SKILL_NAME}/SKILL.md"),
                BUILTIN_SKILL_MD.to_owned(),
            )],
        }
    }

    /// The built-in templates, each replaced by the override that `read` returns for its name
    /// relative to the mount's `templates/` directory: `read("smith.md")`, `read("task.md")`,
    /// `read("START_HERE.md")` and `read("skills/agent-smith/SKILL.md")`. `read` returns `None` when
    /// there is no override (absent or unreadable: the caller decides and may log).
    ///
    /// Overrides are validated here, so a bad one fails at mount/init, not at the first mkdir.
    /// Skills other than the bundled one cannot be discovered through `read`; a caller that lists
    /// `templates/skills/` passes them with [`Templates::with_skills`].
    ///
    /// # Errors
    /// [`TemplateError::UnknownPlaceholder`] if an override uses a placeholder not available to it;
    /// the error names `templates/<name> (override)`.
    pub fn with_overrides(read: impl Fn(&str) -> Option<String>) -> Result<Self, TemplateError> {
        let mut t = Self::builtin();
        for (name, allowed, slot) in [
            (SMITH_MD, SMITH_VARS, &mut t.smith_md),
            (TASK_MD, TASK_VARS, &mut t.task_md),
            (START_HERE_MD, SMITH_VARS, &mut t.start_here_md),
        ] {
            if let Some(text) = read(name) {
                check(&format!("templates/{name} (override)"), &text, allowed)?;
                *slot = text;
            }
        }
        for (path, content) in &mut t.skills {
            if let Some(text) = read(&format!("{SKILLS_DIR}/{path}")) {
                *content = text;
            }
        }
        Ok(t)
    }

    /// Replaces the whole skill list with `skills`: pairs of (path relative to `templates/skills/`,
    /// content), e.g. `("agent-smith/SKILL.md", "---\nname: …")`. Use this when the caller has
    /// listed `templates/skills/` (which `smithfs init` fills with the bundled skill); an empty
    /// list means smiths get an empty `.claude/skills/`. Order is kept; duplicates: the first wins.
    ///
    /// # Errors
    /// [`TemplateError::BadSkillPath`] for a path that is absolute, contains `.`/`..` or empty
    /// components, or has fewer than two components.
    pub fn with_skills(mut self, skills: Vec<(String, String)>) -> Result<Self, TemplateError> {
        let mut kept: Vec<(String, String)> = Vec::with_capacity(skills.len());
        for (path, content) in skills {
            validate_skill_path(&path)?;
            if !kept.iter().any(|(p, _)| *p == path) {
                kept.push((path, content));
            }
        }
        self.skills = kept;
        Ok(self)
    }

    /// The `smith.md` template (placeholders: [`SMITH_VARS`]).
    pub fn smith_md(&self) -> &str {
        &self.smith_md
    }

    /// The `task.md` template (placeholders: [`TASK_VARS`]).
    pub fn task_md(&self) -> &str {
        &self.task_md
    }

    /// The `START_HERE.md` template (placeholders: [`SMITH_VARS`]).
    pub fn start_here_md(&self) -> &str {
        &self.start_here_md
    }

    /// The skills: (path relative to `skills/`, verbatim content), e.g. `agent-smith/SKILL.md`.
    pub fn skills(&self) -> &[(String, String)] {
        &self.skills
    }
}

/// Checks a skill path: relative, `<name>/<file…>`, only normal non-empty components, no `\0`.
fn validate_skill_path(path: &str) -> Result<(), TemplateError> {
    let bad = || TemplateError::BadSkillPath {
        path: path.to_owned(),
    };
    if path.is_empty() || path.contains('\0') || path.starts_with('/') || path.ends_with('/') {
        return Err(bad());
    }
    // `Path::components` silently drops `.` and repeated `/`; refuse them explicitly.
    if path
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad());
    }
    let mut count = 0;
    for c in Path::new(path).components() {
        match c {
            Component::Normal(_) => count += 1,
            Component::Prefix(_)
            | Component::RootDir
            | Component::CurDir
            | Component::ParentDir => return Err(bad()),
        }
    }
    if count < 2 {
        return Err(bad());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown(err: TemplateError) -> (String, usize, usize) {
        match err {
            TemplateError::UnknownPlaceholder {
                name, line, column, ..
            } => (name, line, column),
            other @ (TemplateError::BadSkillPath { .. } | TemplateError::BadArgument { .. }) => {
                panic!("unexpected error {other}")
            }
        }
    }

    #[test]
    fn renders_table() {
        let vars = [("A", "x"), ("B_C", "{A}"), ("A", "second")];
        let cases: &[(&str, &str)] = &[
            ("", ""),
            ("plain", "plain"),
            ("{A}", "x"),
            ("<{A}{A}>", "<xx>"),
            ("{B_C}", "{A}"),     // values are not re-scanned
            ("{{A}}", "{A}"),     // escape
            ("{{{A}}}", "{{A}}"), // leftmost match: `{` then the escape `{{A}}`, then `}`
            ("{{A}", "{x"),
            ("{A}}", "x}"),
            ("{a}", "{a}"),
            ("{A1}", "{A1}"),
            ("{ A }", "{ A }"),
            ("{}", "{}"),
            ("{{}}", "{{}}"),
            ("{A", "{A"),
            ("fn f() { g(); }", "fn f() { g(); }"),
            ("{\"k\": {A}}", "{\"k\": x}"),
            ("awk '{print $1}'", "awk '{print $1}'"),
            ("{{ .Name }}", "{{ .Name }}"),
            ("é{A}ü", "éxü"),
            ("{", "{"),
            ("}", "}"),
        ];
        for (tpl, want) in cases {
            assert_eq!(render(tpl, &vars).as_deref(), Ok(*want), "template {tpl:?}");
        }
    }

    #[test]
    fn unknown_placeholder_is_named_with_position() {
        let err = render("line one\n  é {NOPE} {A}", &[("A", "1")]).unwrap_err();
        let msg = err.to_string();
        assert_eq!(unknown(err), ("NOPE".to_owned(), 2, 5));
        assert!(msg.contains("{NOPE}"), "{msg}");
        assert!(msg.contains("line 2, column 5"), "{msg}");
        assert!(msg.contains("known: {A}"), "{msg}");
        let err = render("{_}", &[]).unwrap_err();
        assert!(err.to_string().contains("known: none"));
        assert_eq!(unknown(err).0, "_");
    }

    #[test]
    fn render_named_names_the_template() {
        let err = render_named("smith.md", "{X}", &[]).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("smith.md: unknown placeholder {X}"));
    }

    #[test]
    fn builtins_use_only_their_placeholders() {
        let t = Templates::builtin();
        check("smith.md", t.smith_md(), SMITH_VARS).unwrap();
        check("START_HERE.md", t.start_here_md(), SMITH_VARS).unwrap();
        check("task.md", t.task_md(), TASK_VARS).unwrap();
        assert_eq!(t.skills().len(), 1);
        assert_eq!(t.skills()[0].0, "agent-smith/SKILL.md");
        assert!(t.skills()[0].1.starts_with("---\nname: agent-smith\n"));
    }

    #[test]
    fn builtins_mention_what_the_spec_requires() {
        let t = Templates::builtin();
        for p in ["{SMITH_ID}", "{PARENT_ID}", "{LEVEL}", "{FULL_ID}"] {
            assert!(t.smith_md().contains(p), "smith.md lacks {p}");
            assert!(t.start_here_md().contains(p), "START_HERE.md lacks {p}");
        }
        for p in TASK_VARS {
            assert!(
                t.task_md().contains(&format!("{{{p}}}")),
                "task.md lacks {p}"
            );
        }
        for needle in [
            "EACCES",
            "EPERM",
            "EINVAL",
            "EDQUOT",
            "EXDEV",
            ".smithfs/why",
            "mkdir children/smith-",
            "outbox/result.md",
        ] {
            assert!(t.smith_md().contains(needle), "smith.md lacks {needle}");
        }
        for needle in [
            ".smithfs/whoami",
            ".smithfs/why",
            "outbox/result.md",
            "inbox/",
        ] {
            assert!(
                t.start_here_md().contains(needle),
                "START_HERE.md lacks {needle}"
            );
            assert!(t.skills()[0].1.contains(needle), "SKILL.md lacks {needle}");
        }
    }

    #[test]
    fn overrides_replace_and_are_validated() {
        let t = Templates::with_overrides(|name| match name {
            "smith.md" => Some("I am {SMITH_ID} in {SMITH_DIR}".to_owned()),
            "skills/agent-smith/SKILL.md" => Some("custom {anything} {GOES}".to_owned()),
            _ => None,
        })
        .unwrap();
        assert_eq!(t.smith_md(), "I am {SMITH_ID} in {SMITH_DIR}");
        assert_eq!(t.task_md(), Templates::builtin().task_md());
        assert_eq!(t.skills()[0].1, "custom {anything} {GOES}");

        let err = Templates::with_overrides(|name| {
            (name == "task.md").then(|| "{TITLE} {SMITH_DIR}".to_owned())
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("templates/task.md (override): unknown placeholder {SMITH_DIR}"));
    }

    #[test]
    fn no_overrides_is_builtin() {
        assert_eq!(
            Templates::with_overrides(|_| None),
            Ok(Templates::builtin())
        );
    }

    #[test]
    fn skill_paths_are_validated() {
        for good in ["a/SKILL.md", "agent-smith/scripts/x.sh", "a b/c"] {
            Templates::builtin()
                .with_skills(vec![(good.to_owned(), String::new())])
                .unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in [
            "", "SKILL.md", "/a/b", "a/../b", "../a/b", "./a/b", "a/./b", "a//b", "a/b/", "a/\0",
        ] {
            assert_eq!(
                Templates::builtin().with_skills(vec![(bad.to_owned(), String::new())]),
                Err(TemplateError::BadSkillPath {
                    path: bad.to_owned()
                }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn with_skills_dedups_and_keeps_order() {
        let t = Templates::builtin()
            .with_skills(vec![
                ("b/SKILL.md".into(), "1".into()),
                ("a/SKILL.md".into(), "2".into()),
                ("b/SKILL.md".into(), "3".into()),
            ])
            .unwrap();
        let paths: Vec<_> = t
            .skills()
            .iter()
            .map(|(p, c)| (p.as_str(), c.as_str()))
            .collect();
        assert_eq!(paths, [("b/SKILL.md", "1"), ("a/SKILL.md", "2")]);
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn never_panics_and_text_without_placeholders_is_identity(s in ".*") {
                let _ = render(&s, &[("A", "v")]);
                if !s.contains('{') {
                    prop_assert_eq!(render(&s, &[]), Ok(s.clone()));
                }
            }

            #[test]
            fn escaped_names_round_trip(name in "[A-Z_]{1,8}", pre in "[a-z {}]{0,5}", post in "[a-z }]{0,5}") {
                // Doubling the braces of a placeholder yields it literally.
                let tpl = format!("{pre}{{{{{name}}}}}{post}");
                let out = render(&tpl, &[]);
                if !pre.ends_with('{') {
                    prop_assert_eq!(out, Ok(format!("{pre}{{{name}}}{post}")));
                }
            }
        }
    }
}
