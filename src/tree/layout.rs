//! The store's layout as smithfs reads it outside a smith dir's areas (docs/SPEC.md §1, §5): the
//! name of its own state directory and which inbox names are tasks. Pure facts, below both the
//! filesystem (`fs`) and the scheduler (`sched`), which both go by them.

/// The name of smithfs's own state directory in the store's root, never visible through the
/// mount (docs/SPEC.md §1).
pub const STATE_DIR: &str = ".smithfs-state";

/// The longest task name that triggers, in bytes (docs/SPEC.md §5).
pub const MAX_TASK_NAME: usize = 255;

/// What an inbox name is to the scheduler (docs/SPEC.md §5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskName {
    /// `task-[A-Za-z0-9][A-Za-z0-9._-]*.md`, at most 255 bytes: it triggers.
    Valid,
    /// Starts with `task-` and ends with `.md` but breaks the rule: kept as data, never
    /// triggers, journaled once as `task.ignored`. The text says why, as a clause
    /// ("has a space (0x20) …").
    Ignored(String),
    /// Anything else (`note.md`, `.task-1.md.swp`, `4913`): plain data, nothing said.
    Other,
}

/// Classify the inbox name `name` (raw bytes, not necessarily UTF-8) per docs/SPEC.md §5: only
/// `task-[A-Za-z0-9][A-Za-z0-9._-]*\.md` of at most [`MAX_TASK_NAME`] bytes triggers, so no
/// name that reaches a hook, an agent's environment or a placeholder can carry shell syntax.
pub fn classify_task_name(name: &[u8]) -> TaskName {
    let Some(stem) = name
        .strip_prefix(b"task-")
        .and_then(|r| r.strip_suffix(b".md"))
    else {
        return TaskName::Other;
    };
    if name.len() > MAX_TASK_NAME {
        return TaskName::Ignored(format!(
            "is {} bytes long (at most {MAX_TASK_NAME})",
            name.len()
        ));
    }
    let Some(first) = stem.first() else {
        return TaskName::Ignored("has nothing between `task-` and `.md`".into());
    };
    if !first.is_ascii_alphanumeric() {
        return TaskName::Ignored(format!(
            "has {} right after `task-` (a letter or digit must come first)",
            describe_byte(*first)
        ));
    }
    match stem
        .iter()
        .find(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')))
    {
        Some(b) => TaskName::Ignored(format!(
            "has {} (only letters, digits, `.`, `_` and `-` may follow `task-`)",
            describe_byte(*b)
        )),
        None => TaskName::Valid,
    }
}

/// `the character '$' (0x24)`, `a space (0x20)`, `the byte 0xff`, for `task.ignored` reasons.
fn describe_byte(b: u8) -> String {
    match b {
        b' ' => "a space (0x20)".into(),
        b'\n' => "a newline (0x0a)".into(),
        b'\t' => "a tab (0x09)".into(),
        0x21..=0x7e => format!("the character '{}' (0x{b:02x})", b as char),
        _ => format!("the byte 0x{b:02x}"),
    }
}

/// Is `name` a task name that triggers (docs/SPEC.md §5)?
pub fn is_task_name(name: &[u8]) -> bool {
    classify_task_name(name) == TaskName::Valid
}

/// A name that would work instead of the refused task name `name`: every byte outside
/// `[A-Za-z0-9._]` becomes `-`, runs of `-` collapse, it starts with a letter or digit (`1`
/// if none is left), cut to [`MAX_TASK_NAME`] bytes. `task-my plan $(x).md` →
/// `task-my-plan-x-.md`.
pub fn suggest_task_name(name: &[u8]) -> String {
    let stem = name
        .strip_prefix(b"task-")
        .and_then(|r| r.strip_suffix(b".md"))
        .unwrap_or(name);
    let mut out = String::new();
    for b in stem {
        let c = if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_') {
            *b as char
        } else {
            '-'
        };
        if out.is_empty() && !c.is_ascii_alphanumeric() {
            continue;
        }
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    if out.is_empty() {
        out.push('1');
    }
    out.truncate(MAX_TASK_NAME - "task-.md".len());
    format!("task-{out}.md")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_names() {
        let long = format!("task-{}.md", "a".repeat(MAX_TASK_NAME - 8));
        let too_long = format!("task-{}.md", "a".repeat(MAX_TASK_NAME - 7));
        let table: &[(&[u8], Option<&str>)] = &[
            (b"task-1.md", None),
            (b"task-root.md", None),
            (b"task-A_b-c.d.md", None),
            (long.as_bytes(), None),
            (b"task-.md", Some("nothing between")),
            (b"task-.x.md", Some("the character '.' (0x2e) right after")),
            (b"task-a b.md", Some("a space (0x20)")),
            (b"task-$(touch x).md", Some("the character '$' (0x24)")),
            (b"task-`id`.md", Some("the character '`' (0x60)")),
            (b"task-a;b.md", Some("the character ';' (0x3b)")),
            (b"task-a'b.md", Some("the character ''' (0x27)")),
            (b"task-a\"b.md", Some("the character '\"' (0x22)")),
            (b"task-a\nb.md", Some("a newline (0x0a)")),
            (b"task-\xff.md", Some("the byte 0xff right after")),
            (b"task-caf\xc3\xa9.md", Some("the byte 0xc3")),
            (too_long.as_bytes(), Some("256 bytes long")),
        ];
        for (name, want) in table {
            let got = classify_task_name(name);
            match want {
                None => assert_eq!(got, TaskName::Valid, "{name:?}"),
                Some(part) => match &got {
                    TaskName::Ignored(r) => assert!(r.contains(part), "{name:?}: {r}"),
                    other => panic!("{name:?}: {other:?}"),
                },
            }
            if let TaskName::Ignored(_) = got {
                let s = suggest_task_name(name);
                assert!(is_task_name(s.as_bytes()), "{name:?} -> {s}");
            }
        }
        for other in [
            &b".task-1.md"[..],
            b"task-1.md.swp",
            b"task-1.tmp",
            b"4913",
            b"result.md",
        ] {
            assert_eq!(classify_task_name(other), TaskName::Other, "{other:?}");
        }
        assert_eq!(
            suggest_task_name(b"task-my plan $(x).md"),
            "task-my-plan-x-.md"
        );
        assert_eq!(suggest_task_name(b"task-.md"), "task-1.md");
        assert_eq!(suggest_task_name(b"task-\xff.md"), "task-1.md");
    }
}
