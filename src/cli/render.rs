//! The status tree and journal lines as `smithfs status`, `events` and `logs` print them for a
//! person (docs/SPEC.md §6, §7): columns, colours, and failed runs' details. The documents
//! themselves are the scheduler's (`sched::view`).

use std::time::SystemTime;

use crate::sched::journal::LastRun;
use crate::sched::queue::State;
use crate::sched::view::{human_duration, SmithRow, StatusDoc};

fn duration_of(lr: &LastRun, now: SystemTime) -> Option<u64> {
    let start = crate::time::parse(&lr.started)?;
    let end = match &lr.ended {
        Some(e) => crate::time::parse(e)?,
        None => now,
    };
    Some(end.duration_since(start).map_or(0, |d| d.as_secs()))
}

fn paint(s: &str, code: &str, color: bool) -> String {
    if color {
        format!("\x1b[{code}m{s}\x1b[0m")
    } else {
        s.to_string()
    }
}

fn state_color(state: &str) -> &'static str {
    match State::parse(state) {
        Some(State::Running) => "1;34",
        Some(State::Queued) => "36",
        Some(State::Waiting) => "33",
        Some(State::Done) => "32",
        Some(State::Failed) => "1;31",
        Some(State::Cancelled) => "35",
        Some(State::Idle) | None => "2",
    }
}

/// Pad `s` to `width` columns (by chars), then paint it: escapes never count as width, so
/// columns stay aligned with colour on.
fn cell(s: &str, width: usize, code: &str, color: bool) -> String {
    let pad = width.saturating_sub(s.chars().count());
    format!("{}{:pad$}", paint(s, code, color), "")
}

/// For a failed or cancelled smith: how its last run ended and where its log is, e.g.
/// `exit 3 (exit) log smiths/smith-root/conversations/run-0002/messages.log`.
fn failure_detail(row: &SmithRow) -> Option<String> {
    if !matches!(
        State::parse(&row.state),
        Some(State::Failed | State::Cancelled)
    ) {
        return None;
    }
    let lr = row.last_run.as_ref()?;
    let how = match (lr.exit_code, lr.signal) {
        (_, Some(sig)) => format!("signal {sig}"),
        (Some(c), None) => format!("exit {c}"),
        (None, None) => "no exit".to_string(),
    };
    let mut out = how;
    if let Some(r) = &lr.reason {
        out.push_str(&format!(" ({r})"));
    }
    if let Some(l) = &lr.log {
        out.push_str(&format!(" log {l}"));
    }
    if let Some(e) = &lr.error {
        out.push_str(&format!(": {e}"));
    }
    // A run's error quotes what a smith chose (a command a parent wrote into its child's
    // config.json): shown inert, on this one line (notes O51).
    Some(super::util::inline_safe(&out))
}

/// The status tree: one line per smith (tree drawing and full id, state, time in that state,
/// runs, the last run's duration, whether a result is present; for a failed or cancelled smith
/// also its last exit code or signal, `reason` and log path; where a cluster's run ran), then a
/// summary line. Columns
/// are padded before they are coloured. `color`: ANSI colours for a terminal.
pub fn render_tree(doc: &StatusDoc, now: SystemTime, color: bool) -> String {
    let mut out = String::new();
    let roots: Vec<&SmithRow> = doc.smiths.iter().filter(|s| s.parent.is_none()).collect();
    let width = doc
        .smiths
        .iter()
        .map(|s| s.level as usize * 3 + s.full_id.chars().count())
        .max()
        .unwrap_or(10)
        + 2;
    struct Ctx<'a> {
        doc: &'a StatusDoc,
        width: usize,
        now: SystemTime,
        color: bool,
    }
    fn walk(cx: &Ctx<'_>, row: &SmithRow, prefix: &str, branch: &str, out: &mut String) {
        let Ctx {
            doc,
            width,
            now,
            color,
        } = *cx;
        let name = format!("{prefix}{branch}{}", row.full_id);
        let dur = row
            .last_run
            .as_ref()
            .and_then(|lr| duration_of(lr, now))
            .map(human_duration)
            .unwrap_or_else(|| "-".into());
        let since = row
            .state_since
            .as_deref()
            .and_then(crate::time::parse)
            .map(|t| human_duration(now.duration_since(t).map_or(0, |d| d.as_secs())))
            .unwrap_or_else(|| "-".into());
        let result = if row.has_result {
            cell("result", 6, "32", color)
        } else {
            cell("-", 6, "2", color)
        };
        let mut line = format!(
            "{}{} {:>6}  runs {:<3} last {:>6}  {result}",
            cell(&name, width, "", false),
            cell(&row.state, 9, state_color(&row.state), color),
            since,
            row.runs,
            dur,
        );
        if let Some(d) = failure_detail(row) {
            line.push_str("  ");
            line.push_str(&paint(&d, "31", color));
        }
        // Where a run on a cluster ran (docs/SPEC.md §13): `slurm:JOBID@NODE`.
        if let Some(w) = row
            .last_run
            .as_ref()
            .and_then(|lr| lr.where_.as_deref())
            .filter(|w| *w != "local")
        {
            line.push_str("  on ");
            line.push_str(&super::util::inline_safe(w));
        }
        out.push_str(line.trim_end());
        out.push('\n');
        let kids: Vec<&SmithRow> = doc.children(&row.full_id).collect();
        let child_prefix = format!(
            "{prefix}{}",
            match branch {
                "" => "",
                "├─ " => "│  ",
                _ => "   ",
            }
        );
        for (i, k) in kids.iter().enumerate() {
            let b = if i + 1 == kids.len() {
                "└─ "
            } else {
                "├─ "
            };
            walk(cx, k, &child_prefix, b, out);
        }
    }
    let cx = Ctx {
        doc,
        width,
        now,
        color,
    };
    for r in roots {
        walk(&cx, r, "", "", &mut out);
    }
    let count = |st: &str| doc.smiths.iter().filter(|s| s.state == st).count();
    out.push_str(&format!(
        "{} smiths: {} running, {} queued, {} waiting, {} done, {} failed, {} cancelled\n",
        doc.smiths.len(),
        count("running"),
        count("queued"),
        count("waiting"),
        count("done"),
        count("failed"),
        count("cancelled"),
    ));
    if let Some(l) = &doc.limits {
        out.push_str(&limits_line(l));
        out.push('\n');
    }
    if !doc.agent_configured {
        out.push_str(&paint(
            "no agent configured: tasks wait (set agent.command in config.json, or init --agent)",
            "33",
            color,
        ));
        out.push('\n');
    }
    out
}

/// The `limits` line of `status`: the scaffold's always, every other limit when it is set
/// (`limits: max_level 3, max_children 5, max_bytes_per_smith 1M, per_subtree.pids_max 64`).
pub fn limits_line(l: &crate::config::Limits) -> String {
    let mut parts = vec![
        format!("max_level {}", l.max_level),
        format!("max_children {}", l.max_children),
    ];
    if let Some(n) = l.max_open_files_per_smith {
        parts.push(format!("max_open_files_per_smith {n}"));
    }
    if let Some(n) = l.max_bytes_per_smith {
        parts.push(format!("max_bytes_per_smith {n}"));
    }
    if let Some(n) = l.max_inodes_per_smith {
        parts.push(format!("max_inodes_per_smith {n}"));
    }
    for (name, c) in [("per_smith", &l.per_smith), ("per_subtree", &l.per_subtree)] {
        if let Some(m) = c.memory_max {
            parts.push(format!("{name}.memory_max {m}"));
        }
        if let Some(p) = c.pids_max {
            parts.push(format!("{name}.pids_max {p}"));
        }
        if let Some(cpu) = c.cpu_max {
            parts.push(format!("{name}.cpu_max \"{cpu}\""));
        }
    }
    format!("limits: {}", parts.join(", "))
}

/// One journal line for humans: `ts event smith key=value …`.
pub fn format_event(v: &serde_json::Value) -> String {
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("");
    let mut out = format!(
        "{} {:<17} {}",
        s("ts"),
        s("event"),
        v.get("smith").and_then(|x| x.as_str()).unwrap_or("-")
    );
    if let Some(obj) = v.as_object() {
        for (k, val) in obj {
            if matches!(k.as_str(), "ts" | "event" | "smith") || val.is_null() {
                continue;
            }
            let text = match val {
                // A path a smith named may hold a newline, a terminal escape or a bidi control:
                // shown quoted and escaped, so it can neither fake a journal line, drive the
                // terminal nor reorder the line (notes H40).
                serde_json::Value::String(t)
                    if t.chars()
                        .any(|c| c.is_control() || crate::ui::html::is_bidi_control(c)) =>
                {
                    let mut q = String::new();
                    for c in serde_json::Value::String(t.clone()).to_string().chars() {
                        if crate::ui::html::is_bidi_control(c) {
                            q.push_str(&format!("\\u{:04x}", c as u32));
                        } else {
                            q.push(c);
                        }
                    }
                    q
                }
                serde_json::Value::String(t) => t.clone(),
                other => other.to_string(),
            };
            out.push_str(&format!(" {k}={text}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::view::tests::doc;

    #[test]
    fn renders_a_plain_tree() {
        let out = render_tree(
            &doc(["waiting", "done", "failed"]),
            SystemTime::now(),
            false,
        );
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("smith-root ") && lines[0].contains("waiting"),
            "{out}"
        );
        assert!(
            lines[1].starts_with("├─ smith-root/smith-001") && lines[1].contains("1m05s"),
            "{out}"
        );
        assert!(
            lines[2].starts_with("└─ smith-root/smith-002")
                && lines[2].contains("failed")
                && lines[2]
                    .contains("exit 3 (exit) log smiths/x/conversations/run-0001/messages.log"),
            "{out}"
        );
        assert!(
            lines[3].contains("3 smiths") && lines[3].contains("1 failed"),
            "{out}"
        );
        assert!(!out.contains('\x1b'));
        assert!(render_tree(&doc(["done"; 3]), SystemTime::now(), true).contains("\x1b[32m"));
        let mut d = doc(["idle"; 3]);
        d.agent_configured = false;
        assert!(render_tree(&d, SystemTime::now(), false).contains("no agent configured"));
    }

    #[test]
    fn a_smiths_error_and_node_stay_inert_on_one_line() {
        let mut d = doc(["waiting", "done", "failed"]);
        let lr = d.smiths[2].last_run.as_mut().expect("a last run");
        lr.error = Some("cannot start `\u{1b}]52;c;eA==\u{7}`\nsmith-root  done".into());
        lr.where_ = Some("slurm:1@\u{1b}[2Jn1".into());
        let out = render_tree(&d, SystemTime::now(), false);
        assert!(!out.contains('\x1b') && !out.contains('\x07'), "{out}");
        assert!(
            out.contains("cannot start `^[]52;c;eA==^G`^Jsmith-root  done"),
            "{out}"
        );
        assert!(out.contains("on slurm:1@^[[2Jn1"), "{out}");
        assert_eq!(out.lines().count(), 4, "{out}");
    }

    /// The text without ANSI escapes (`ESC [ … m`).
    fn strip(s: &str) -> String {
        let mut out = String::new();
        let mut esc = false;
        for c in s.chars() {
            match c {
                '\x1b' => esc = true,
                'm' if esc => esc = false,
                _ if esc => {}
                _ => out.push(c),
            }
        }
        out
    }

    #[test]
    fn colour_keeps_columns_aligned() {
        let now = crate::time::parse("2026-01-01T00:02:05.000000Z").expect("time");
        let d = doc(["running", "done", "failed"]);
        let plain = render_tree(&d, now, false);
        let coloured = render_tree(&d, now, true);
        assert!(coloured.contains('\x1b'));
        assert_eq!(strip(&coloured), plain, "colour adds escapes only");
        // Every smith line has its state, time in state and runs at the same columns.
        let col = |l: &str, word: &str| l.find(word).map(|i| l[..i].chars().count());
        let lines: Vec<&str> = plain.lines().take(3).collect();
        let runs: Vec<Option<usize>> = lines.iter().map(|l| col(l, "runs ")).collect();
        assert!(runs[0].is_some());
        assert!(runs.windows(2).all(|w| w[0] == w[1]), "{plain}");
        assert!(lines[0].contains(" 1m00s  runs"), "time in state: {plain}");
    }

    #[test]
    fn formats_events() {
        let v = serde_json::json!({"ts": "T", "event": "run.exited", "smith": "smith-root",
            "run_id": "run-0001", "exit_code": 0, "signal": null});
        assert_eq!(
            format_event(&v),
            "T run.exited        smith-root exit_code=0 run_id=run-0001"
        );
        assert_eq!(
            format_event(&serde_json::json!({"ts": "T", "event": "task.ignored", "smith": "smith-root",
                "path": "smiths/smith-root/inbox/task-a\nT run.exited x\u{1b}[2J.md"})),
            "T task.ignored      smith-root path=\"smiths/smith-root/inbox/task-a\\nT run.exited x\\u001b[2J.md\""
        );
        assert_eq!(
            format_event(
                &serde_json::json!({"ts": "T", "event": "task.ignored", "smith": "smith-root",
                "path": "smiths/smith-root/inbox/task-\u{202e}dm.exe"})
            ),
            "T task.ignored      smith-root path=\"smiths/smith-root/inbox/task-\\u202edm.exe\""
        );
        assert_eq!(
            format_event(&serde_json::json!({"ts": "T", "event": "access.denied", "smith": null})),
            "T access.denied     -"
        );
    }
}
