//! The pages of `smithfs ui` (docs/SPEC.md §14): the tree, a smith, a run's log, the event stream,
//! a new task for the root, and the actions (retry, cancel, accept, new task) with their
//! confirmation and result pages. Every page is plain HTML that works without JavaScript; the
//! script (`assets/ui.js`) only refreshes the live parts and asks `confirm()` before an action.
//!
//! Smith ids and run ids come from the URL and are only used once found: a smith id must be one
//! the status lists (exactly), a run id `run-N` whose directory exists; anything else is 404, so
//! no `../` ever reaches a path.

use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::html::{self, badge, esc, log_text, Shell};
use super::http::{self, link, Request, Resp, Target};
use super::App;
use crate::sched::view::{human_duration, SmithRow, StatusDoc};

/// How much of a log a page shows, and fetches per step further back (64 KiB).
pub const LOG_TAIL: u64 = 64 << 10;
/// The most one Range request gets.
const MAX_RANGE: u64 = 1 << 20;
/// How much of the journal's end the event page and a smith's denials read (8 MiB).
const JOURNAL_TAIL: u64 = 8 << 20;
/// The most rows the event page shows.
const EVENT_ROWS: usize = 500;
/// The most denials a smith's page lists.
const DENIALS: usize = 20;
/// How much of a task or result file is shown.
const FILE_SHOWN: u64 = 256 << 10;
/// How much of a smith's tasks a page shows in all, and how many of them (notes UI11).
const TASKS_SHOWN: u64 = 1 << 20;
const TASK_FILES_SHOWN: usize = 50;
/// How much of a smith's diff a page shows (its `--stat`, its whole diff), and of its commits.
const DIFF_STAT_SHOWN: usize = 64 << 10;
const DIFF_SHOWN: usize = 2 << 20;
const COMMITS_SHOWN: usize = 64 << 10;
/// The most lines of a diff a page renders (each becomes an element).
const DIFF_LINES_SHOWN: usize = 20_000;

const CSS: &str = include_str!("assets/ui.css");
const JS: &str = include_str!("assets/ui.js");

/// Answer a GET (or HEAD).
pub fn get(app: &App, req: &Request, t: &Target) -> Resp {
    match t.path.as_str() {
        "/" => tree_page(app),
        "/frag/tree" => with_doc(app, |doc, _| http::html(200, tree_fragment(app, doc))),
        "/api/tick" => tick(app),
        "/smith" => with_smith(app, t, |doc, row| smith_page(app, doc, row)),
        "/frag/smith" => with_smith(app, t, |doc, row| {
            http::html(200, status_fragment(app, doc, row, mounted(app)))
        }),
        "/log" => with_run(app, t, |row, run, path| log_page(app, row, run, &path, t)),
        "/raw" => with_run(app, t, |_, _, path| raw(req, &path)),
        "/events" => events_page(app, t),
        "/frag/events" => events_fragment(app, t),
        "/task" => task_page(app),
        "/static/ui.css" => http::respond(200, "text/css; charset=utf-8", CSS.into()),
        "/static/ui.js" => http::respond(200, "text/javascript; charset=utf-8", JS.into()),
        _ => not_found(),
    }
}

fn not_found() -> Resp {
    http::text(404, "not found")
}

/// Is the tree mounted now (a dead mount counts as not)?
fn mounted(app: &App) -> bool {
    app.fleet.mounted().unwrap_or(false)
}

fn shell<'a>(app: &App, title: &'a str, kind: &'a str, dir: &'a str, refresh: bool) -> Shell<'a> {
    Shell {
        title,
        dir,
        mounted: mounted(app),
        refresh,
        kind,
    }
}

/// A page saying what cannot be read (the status of a dead mount …).
fn error_page(app: &App, status: u16, msg: &str) -> Resp {
    let dir = app.dir_display();
    let body = format!("<p class=\"error\">{}</p>", esc(msg));
    http::html(
        status,
        html::page(&shell(app, "error", "other", &dir, true), &body),
    )
}

fn with_doc(app: &App, f: impl FnOnce(&StatusDoc, SystemTime) -> Resp) -> Resp {
    match app.fleet.status() {
        Ok(doc) => f(&doc, SystemTime::now()),
        Err(e) => error_page(app, 503, &e),
    }
}

/// The smith named by `?id=` (exactly as the status lists it), or 404.
fn with_smith(app: &App, t: &Target, f: impl FnOnce(&StatusDoc, &SmithRow) -> Resp) -> Resp {
    let Some(id) = t.get("id") else {
        return not_found();
    };
    with_doc(app, |doc, _| match doc.smith(id) {
        Some(row) => f(doc, row),
        None => not_found(),
    })
}

/// Is `run` a run id (`run-` and digits)?
fn is_run_id(run: &str) -> bool {
    run.strip_prefix("run-")
        .is_some_and(|d| !d.is_empty() && d.len() <= 10 && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The smith of `?id=` and its run `?run=` (a run id whose directory exists), with its log's
/// path; else 404.
fn with_run(app: &App, t: &Target, f: impl FnOnce(&SmithRow, &str, PathBuf) -> Resp) -> Resp {
    let run = t.get("run").unwrap_or("").to_string();
    if !is_run_id(&run) {
        return not_found();
    }
    with_smith(app, t, |_, row| {
        let Some(sd) = super::smith_path(app.fleet.dir(), &row.full_id) else {
            return not_found();
        };
        let dir = sd.join("conversations").join(&run);
        if !dir.is_dir() {
            return not_found();
        }
        f(row, &run, dir.join("messages.log"))
    })
}

/// `{"journal": END, "mounted": BOOL, "error": …}`: what the script polls to know when to
/// refresh (a new journal line, a mount or unmount).
fn tick(app: &App) -> Resp {
    let (mounted, error) = match app.fleet.mounted() {
        Ok(m) => (m, None),
        Err(e) => (false, Some(e)),
    };
    let end = app.fleet.journal_end().unwrap_or(0);
    let v = serde_json::json!({"journal": end, "mounted": mounted, "error": error});
    http::respond(200, "application/json", v.to_string().into_bytes())
}

// ---- the tree --------------------------------------------------------------------------------

fn tree_page(app: &App) -> Resp {
    with_doc(app, |doc, _| {
        let dir = app.dir_display();
        let body = format!(
            "<h1>The tree</h1><section id=\"tree\" data-live=\"frag/tree\">{}</section>",
            tree_fragment(app, doc)
        );
        http::html(
            200,
            html::page(&shell(app, "tree", "tree", &dir, true), &body),
        )
    })
}

/// Seconds since `ts` (RFC 3339), if it parses.
fn since(ts: Option<&str>, now: SystemTime) -> Option<u64> {
    let t = crate::time::parse(ts?)?;
    Some(now.duration_since(t).map_or(0, |d| d.as_secs()))
}

/// A running smith whose current run has written nothing for `stalled_after`: seconds silent.
fn stalled(app: &App, row: &SmithRow, now: SystemTime) -> Option<u64> {
    if row.state != "running" {
        return None;
    }
    let lr = row.last_run.as_ref()?;
    if lr.ended.is_some() {
        return None;
    }
    let started = since(Some(&lr.started), now)?;
    let log = lr.log.as_deref().map(|l| app.fleet.dir().join(l));
    let quiet = log
        .and_then(|p| std::fs::metadata(p).ok())
        .and_then(|m| m.modified().ok())
        .map_or(started, |m| {
            now.duration_since(m)
                .map_or(0, |d| d.as_secs())
                .min(started)
        });
    (quiet >= app.stalled_after.as_secs()).then_some(quiet)
}

/// How the last run ended (`exit 3 (exit)`, `signal 9 (timeout)`), or that it runs.
fn last_exit(row: &SmithRow) -> String {
    let Some(lr) = &row.last_run else {
        return "-".into();
    };
    if lr.ended.is_none() {
        return format!("{} live", lr.run_id);
    }
    let mut s = match (lr.exit_code, lr.signal) {
        (_, Some(sig)) => format!("signal {sig}"),
        (Some(c), None) => format!("exit {c}"),
        (None, None) => "no exit".into(),
    };
    if let Some(r) = &lr.reason {
        let _ = write!(s, " ({r})");
    }
    s
}

const STATES: [&str; 7] = [
    "running",
    "queued",
    "waiting",
    "idle",
    "done",
    "failed",
    "cancelled",
];

/// The counts per state, the table of every smith (in tree order), and the stalled count.
fn tree_fragment(app: &App, doc: &StatusDoc) -> String {
    let now = SystemTime::now();
    let mut rows = String::new();
    let mut n_stalled = 0;
    fn walk<'a>(doc: &'a StatusDoc, row: &'a SmithRow, out: &mut Vec<&'a SmithRow>) {
        out.push(row);
        for k in doc.children(&row.full_id) {
            walk(doc, k, out);
        }
    }
    let mut order = Vec::with_capacity(doc.smiths.len());
    for r in doc.smiths.iter().filter(|s| s.parent.is_none()) {
        walk(doc, r, &mut order);
    }
    for row in order {
        let quiet = stalled(app, row, now);
        n_stalled += usize::from(quiet.is_some());
        let class = match (row.state.as_str(), quiet) {
            ("failed", _) => "failed",
            (_, Some(_)) => "stalled",
            _ => "",
        };
        let in_state = since(row.state_since.as_deref(), now)
            .map(human_duration)
            .unwrap_or_else(|| "-".into());
        let stall = quiet.map_or(String::new(), |q| {
            format!(
                " <span class=\"stall\">stalled: no output for {}</span>",
                human_duration(q)
            )
        });
        let short = row.full_id.rsplit('/').next().unwrap_or(&row.full_id);
        let _ = write!(
            rows,
            "<tr class=\"{class}\" data-id=\"{id}\"><td class=\"id lvl{lvl}\">\
             <a href=\"{href}\" title=\"{id}\">{short}</a></td><td>{badge}{stall}</td>\
             <td>{in_state}</td><td>{runs}</td><td>{exit}</td><td>{result}</td></tr>",
            id = esc(&row.full_id),
            lvl = row.level.min(6),
            href = esc(&link("/smith", &[("id", &row.full_id)])),
            short = esc(short),
            badge = badge(&row.state),
            runs = row.runs,
            exit = esc(&last_exit(row)),
            result = if row.has_result { "result" } else { "-" },
        );
    }
    let mut counts = format!("<p class=\"counts\">{} smiths:", doc.smiths.len());
    for st in STATES {
        let n = doc.smiths.iter().filter(|s| s.state == st).count();
        let _ = write!(
            counts,
            " <span class=\"count\" data-state=\"{st}\">{} {n}</span>",
            badge(st)
        );
    }
    if n_stalled > 0 {
        let _ = write!(
            counts,
            " <span class=\"count stall\" data-state=\"stalled\">stalled {n_stalled}</span>"
        );
    }
    counts.push_str("</p>");
    if !doc.agent_configured {
        counts.push_str(
            "<p class=\"warn\">no agent configured: tasks wait (set agent.command in \
             config.json, or init --agent)</p>",
        );
    }
    format!(
        "{counts}<table class=\"tree\"><thead><tr><th>smith</th><th>state</th><th>in state</th>\
         <th>runs</th><th>last exit</th><th>result</th></tr></thead><tbody>{rows}</tbody></table>"
    )
}

// ---- a smith ---------------------------------------------------------------------------------

/// The first `max` bytes (at most [`FILE_SHOWN`]) of the file at `rel` in smith directory `sd` as safe text, or
/// `None` when it cannot be read. Only a regular file is read, and no symlink below `sd` is
/// followed: the files are a smith's to make, and a FIFO would park the worker thread in its
/// open, a symlink point the operator's read anywhere (`backing::read_head`; notes H23).
fn file_text(sd: &Path, rel: &Path, max: u64) -> Option<String> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(sd)
        .ok()?;
    let max = max.min(FILE_SHOWN);
    let buf = crate::backing::read_head(dir.as_fd(), rel, max).ok()?;
    let mut s = log_text(&buf);
    if buf.len() as u64 == max {
        s.push_str("\n… (cut)");
    }
    Some(s)
}

/// A hidden `token` input and the others, then a submit button, posting to `/action`.
fn action_form(app: &App, fields: &[(&str, &str)], extra: &str, button: &str, ask: &str) -> String {
    let mut f = format!(
        "<form method=\"post\" action=\"action\" class=\"action\" data-confirm=\"{}\">\
         <input type=\"hidden\" name=\"token\" value=\"{}\">\
         <input type=\"hidden\" name=\"confirmed\" value=\"\">",
        esc(ask),
        esc(&app.token)
    );
    for (k, v) in fields {
        let _ = write!(
            f,
            "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
            esc(k),
            esc(v)
        );
    }
    let _ = write!(
        f,
        "{extra}<button type=\"submit\" name=\"do\" value=\"{}\">{}</button></form>",
        esc(button),
        esc(button)
    );
    f
}

/// The status fields of a smith and, on a mount, its actions.
fn status_fragment(app: &App, doc: &StatusDoc, row: &SmithRow, mounted: bool) -> String {
    let now = SystemTime::now();
    let mut s = String::from("<dl class=\"fields\">");
    let mut field = |k: &str, v: String| {
        let _ = write!(s, "<dt>{}</dt><dd>{}</dd>", esc(k), v);
    };
    field("state", badge(&row.state));
    if let Some(q) = stalled(app, row, now) {
        field(
            "stalled",
            format!(
                "<span class=\"stall\">no output for {}</span>",
                human_duration(q)
            ),
        );
    }
    field(
        "in state",
        since(row.state_since.as_deref(), now)
            .map(human_duration)
            .unwrap_or_else(|| "-".into()),
    );
    field(
        "parent",
        row.parent.as_deref().map_or("-".into(), |p| {
            format!(
                "<a href=\"{}\">{}</a>",
                esc(&link("/smith", &[("id", p)])),
                esc(p)
            )
        }),
    );
    field("level", row.level.to_string());
    field("runs", row.runs.to_string());
    field(
        "result",
        if row.has_result { "present" } else { "none" }.into(),
    );
    if let Some(lr) = &row.last_run {
        field(
            "last run",
            format!(
                "<a href=\"{}\">{}</a> (wake {}, {})",
                esc(&link("/log", &[("id", &row.full_id), ("run", &lr.run_id)])),
                esc(&lr.run_id),
                esc(&lr.wake),
                esc(&last_exit(row))
            ),
        );
        field("started", esc(&lr.started));
        field("ended", esc(lr.ended.as_deref().unwrap_or("-")));
        if let Some(e) = &lr.error {
            field("error", log_text(e.as_bytes()));
        }
    }
    s.push_str("</dl>");
    let kids: Vec<&SmithRow> = doc.children(&row.full_id).collect();
    if !kids.is_empty() {
        s.push_str("<p class=\"children\">children:");
        for k in kids {
            let _ = write!(
                s,
                " <a href=\"{}\">{}</a> {}",
                esc(&link("/smith", &[("id", &k.full_id)])),
                esc(k.full_id.rsplit('/').next().unwrap_or("")),
                badge(&k.state)
            );
        }
        s.push_str("</p>");
    }
    if !mounted {
        return s;
    }
    s.push_str("<div class=\"actions\">");
    let id = row.full_id.as_str();
    if matches!(row.state.as_str(), "failed" | "cancelled") {
        s.push_str(&action_form(
            app,
            &[("action", "retry"), ("id", id)],
            "",
            "Retry",
            &format!("Retry {id}? It runs again on its newest task."),
        ));
    }
    if !matches!(row.state.as_str(), "done" | "failed" | "cancelled") {
        s.push_str(&action_form(
            app,
            &[("action", "cancel"), ("id", id)],
            "",
            "Cancel",
            &format!("Cancel {id} and its whole subtree?"),
        ));
    }
    if app.fleet.has_project() {
        let branch = crate::workspace::branch(id);
        s.push_str(&action_form(
            app,
            &[("action", "accept"), ("id", id)],
            &format!(
                "<label>branch <input type=\"text\" name=\"branch\" value=\"{}\"></label> ",
                esc(&branch)
            ),
            "Accept",
            &format!("Accept {id}'s work as a branch of the repository?"),
        ));
    }
    s.push_str("</div>");
    s
}

/// The runs of a smith dir, in order (`conversations/run-*`).
fn runs_of(smith_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(smith_dir.join("conversations"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| is_run_id(n))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A run's `meta.json`, if readable.
fn meta(run_dir: &Path) -> Option<serde_json::Value> {
    let t = std::fs::read_to_string(run_dir.join("meta.json")).ok()?;
    serde_json::from_str(&t).ok()
}

fn meta_str(m: &serde_json::Value, k: &str) -> String {
    match m.get(k) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Null) | None => "-".into(),
        Some(v) => v.to_string(),
    }
}

/// The last [`LOG_TAIL`] bytes of a log: (bytes, offset of the first, size).
fn log_tail(path: &Path, before: Option<u64>) -> (Vec<u8>, u64, u64) {
    let Ok(mut f) = std::fs::File::open(path) else {
        return (Vec::new(), 0, 0);
    };
    let size = f.metadata().map_or(0, |m| m.len());
    let end = before.unwrap_or(size).min(size);
    let start = end.saturating_sub(LOG_TAIL);
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(start)).is_ok() {
        let _ = f.take(end - start).read_to_end(&mut buf);
    }
    let end = start + buf.len() as u64;
    (buf, start, end)
}

/// A `<pre>` with a log's tail that the script extends (live, and further back on demand).
fn log_block(row: &SmithRow, run: &str, path: &Path, ended: bool, before: Option<u64>) -> String {
    let (bytes, start, end) = log_tail(path, before);
    let src = link("/raw", &[("id", &row.full_id), ("run", run)]);
    let earlier = if start > 0 {
        format!(
            "<p class=\"earlier\"><a id=\"log-earlier\" href=\"{}\">earlier output ({} bytes \
             before)</a></p>",
            esc(&link(
                "/log",
                &[
                    ("id", &row.full_id),
                    ("run", run),
                    ("before", &start.to_string())
                ]
            )),
            start
        )
    } else {
        String::new()
    };
    format!(
        "{earlier}<pre id=\"log\" class=\"log\" data-src=\"{}\" data-start=\"{start}\" \
         data-end=\"{end}\" data-ended=\"{}\" data-follow=\"{}\">{}</pre>",
        esc(&src),
        u8::from(ended),
        u8::from(before.is_none()),
        log_text(&bytes)
    )
}

/// The `access.denied` lines of the journal's last [`JOURNAL_TAIL`] that name `full`, newest
/// first (the denials `why` showed it).
fn denials(app: &App, full: &str) -> Vec<serde_json::Value> {
    let mut out: Vec<serde_json::Value> = journal_tail(app)
        .into_iter()
        .filter(|v| {
            v.get("event")
                .and_then(|e| e.as_str())
                .is_some_and(|e| e.starts_with("access.denied"))
                && v.get("smith").and_then(|s| s.as_str()) == Some(full)
        })
        .collect();
    out.reverse();
    out.truncate(DENIALS);
    out
}

/// The journal lines of the last [`JOURNAL_TAIL`] bytes, oldest first.
fn journal_tail(app: &App) -> Vec<serde_json::Value> {
    let end = app.fleet.journal_end().unwrap_or(0);
    let from = end.saturating_sub(JOURNAL_TAIL);
    let (bytes, _) = app.fleet.journal_from(from).unwrap_or_default();
    parse_lines(&bytes, from > 0)
}

/// Complete JSON lines of `bytes`; `skip_first`: the first line may be cut (a window's start).
fn parse_lines(bytes: &[u8], skip_first: bool) -> Vec<serde_json::Value> {
    let end = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let mut lines = bytes[..end].split(|b| *b == b'\n');
    if skip_first {
        lines.next();
    }
    lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect()
}

fn smith_page(app: &App, doc: &StatusDoc, row: &SmithRow) -> Resp {
    let is_mounted = mounted(app);
    let Some(sd) = super::smith_path(app.fleet.dir(), &row.full_id) else {
        return not_found();
    };
    let id = &row.full_id;
    let mut b = format!(
        "<h1>{}</h1><section id=\"status\" data-live=\"{}\">{}</section>",
        esc(id),
        esc(&link("/frag/smith", &[("id", id)])),
        status_fragment(app, doc, row, is_mounted)
    );
    // The output of the current (or last) run, live.
    let runs = runs_of(&sd);
    let current = row
        .last_run
        .as_ref()
        .map(|lr| lr.run_id.clone())
        .filter(|r| is_run_id(r) && sd.join("conversations").join(r).is_dir())
        .or_else(|| runs.last().cloned());
    b.push_str("<section><h2>Output</h2>");
    match &current {
        Some(run) => {
            let dir = sd.join("conversations").join(run);
            let ended = meta(&dir).is_some_and(|m| m.get("end").is_some_and(|e| !e.is_null()));
            let _ = write!(
                b,
                "<p>{} {} · <a href=\"{}\">its own page</a></p>",
                esc(run),
                if ended { "(ended)" } else { "(live)" },
                esc(&link("/log", &[("id", id), ("run", run)]))
            );
            b.push_str(&log_block(row, run, &dir.join("messages.log"), ended, None));
        }
        None => b.push_str("<p>not run yet</p>"),
    }
    b.push_str("</section>");
    // Earlier runs.
    if !runs.is_empty() {
        b.push_str(
            "<section><h2>Runs</h2><table class=\"runs\"><thead><tr><th>run</th><th>wake</th>\
             <th>started</th><th>ended</th><th>exit</th><th>signal</th><th>error</th></tr>\
             </thead><tbody>",
        );
        for run in runs.iter().rev() {
            let m = meta(&sd.join("conversations").join(run)).unwrap_or_default();
            let _ = write!(
                b,
                "<tr><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td></tr>",
                esc(&link("/log", &[("id", id), ("run", run)])),
                esc(run),
                esc(&meta_str(&m, "wake")),
                esc(&meta_str(&m, "start")),
                esc(&meta_str(&m, "end")),
                esc(&meta_str(&m, "exit_code")),
                esc(&meta_str(&m, "signal")),
                log_text(meta_str(&m, "error").as_bytes()),
            );
        }
        b.push_str("</tbody></table></section>");
    }
    // Tasks and result.
    b.push_str("<section><h2>Tasks</h2>");
    let mut tasks: Vec<(String, PathBuf)> = std::fs::read_dir(sd.join("inbox"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| {
                    let name = e.file_name();
                    (
                        name.to_string_lossy().into_owned(),
                        Path::new("inbox").join(name),
                    )
                })
                .filter(|(n, _)| n.starts_with("task-") && n.ends_with(".md"))
                .collect()
        })
        .unwrap_or_default();
    tasks.sort();
    if tasks.is_empty() {
        b.push_str("<p>no task</p>");
    }
    // A smith's inbox is its parent's to fill: the page shows the newest names first, up to
    // TASK_FILES_SHOWN of them and TASKS_SHOWN bytes in all (notes UI11).
    let mut shown_bytes: u64 = 0;
    let total = tasks.len();
    for (n, (name, path)) in tasks.iter().rev().enumerate() {
        if n >= TASK_FILES_SHOWN || shown_bytes >= TASKS_SHOWN {
            let _ = write!(
                b,
                "<p class=\"cut\">… {} more task file(s) not shown (of {total}; the inbox has \
                 them all)</p>",
                total - n
            );
            break;
        }
        let text = file_text(&sd, path, TASKS_SHOWN - shown_bytes).unwrap_or_default();
        shown_bytes += text.len() as u64;
        let _ = write!(
            b,
            "<h3>{}</h3><pre class=\"file\">{}</pre>",
            log_text(name.as_bytes()),
            text
        );
    }
    b.push_str("</section><section><h2>Result</h2>");
    match file_text(&sd, Path::new("outbox/result.md"), FILE_SHOWN) {
        Some(t) => {
            let _ = write!(b, "<pre class=\"file result\">{t}</pre>");
        }
        None => b.push_str("<p>no result yet</p>"),
    }
    b.push_str("</section>");
    // Denials.
    b.push_str("<section><h2>Denials (why)</h2>");
    let ds = denials(app, id);
    if ds.is_empty() {
        b.push_str("<p>none recorded in the journal's recent lines</p>");
    } else {
        b.push_str(
            "<table class=\"events\"><thead><tr><th>time</th><th>operation</th><th>path</th>\
             <th>rule</th><th>errno</th><th>pid</th></tr></thead><tbody>",
        );
        for d in &ds {
            let g = |k: &str| meta_str(d, k);
            let _ = write!(
                b,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&g("ts")),
                log_text(g("op").as_bytes()),
                log_text(g("path").as_bytes()),
                log_text(g("rule").as_bytes()),
                esc(&g("errno")),
                esc(&g("pid"))
            );
        }
        b.push_str("</tbody></table>");
    }
    b.push_str("</section>");
    // The project: diff and commits.
    if app.fleet.has_project() {
        b.push_str("<section><h2>Changes</h2>");
        let cut_note = |what: &str| {
            format!(
                "<p class=\"cut\">… {what} cut here: <code>smithfs diff {} {}</code> shows it \
                 all</p>",
                esc(&app.dir_display()),
                esc(id)
            )
        };
        match app.fleet.diff(id, true, DIFF_STAT_SHOWN) {
            Ok((stat, _)) if stat.trim().is_empty() => b.push_str("<p>no changes</p>"),
            Ok((stat, stat_cut)) => {
                let _ = write!(b, "<pre class=\"stat\">{}</pre>", log_text(stat.as_bytes()));
                if stat_cut {
                    b.push_str(&cut_note("the list of changed files"));
                }
                match app.fleet.diff(id, false, DIFF_SHOWN) {
                    Ok((d, cut)) => {
                        let (shown, lines_cut) = html::diff(&d, DIFF_LINES_SHOWN);
                        b.push_str(&shown);
                        if cut || lines_cut {
                            b.push_str(&cut_note("the diff"));
                        }
                    }
                    Err(e) => {
                        let _ = write!(b, "<p class=\"error\">{}</p>", log_text(e.as_bytes()));
                    }
                }
            }
            Err(e) => {
                let _ = write!(b, "<p class=\"error\">{}</p>", log_text(e.as_bytes()));
            }
        }
        b.push_str("<h3>Commits</h3>");
        match app.fleet.commits(id, COMMITS_SHOWN) {
            Ok((c, _)) if c.trim().is_empty() => b.push_str("<p>none since its base</p>"),
            Ok((c, cut)) => {
                let _ = write!(b, "<pre class=\"commits\">{}</pre>", log_text(c.as_bytes()));
                if cut {
                    b.push_str(&cut_note("the list of commits"));
                }
            }
            Err(e) => {
                let _ = write!(b, "<p class=\"error\">{}</p>", log_text(e.as_bytes()));
            }
        }
        b.push_str("</section>");
    }
    let dir = app.dir_display();
    http::html(
        200,
        html::page(&shell(app, id, "smith", &dir, current.is_none()), &b),
    )
}

// ---- a run's log -----------------------------------------------------------------------------

fn log_page(app: &App, row: &SmithRow, run: &str, path: &Path, t: &Target) -> Resp {
    let run_dir = path.parent().unwrap_or(path);
    let m = meta(run_dir).unwrap_or_default();
    let ended = m.get("end").is_some_and(|e| !e.is_null());
    let before = t.get("before").and_then(|b| b.parse::<u64>().ok());
    let id = &row.full_id;
    let mut b = format!(
        "<h1><a href=\"{}\">{}</a> · {}</h1><dl class=\"fields\">",
        esc(&link("/smith", &[("id", id)])),
        esc(id),
        esc(run)
    );
    for k in ["wake", "start", "end", "exit_code", "signal", "error"] {
        let _ = write!(
            b,
            "<dt>{k}</dt><dd>{}</dd>",
            log_text(meta_str(&m, k).as_bytes())
        );
    }
    b.push_str("</dl>");
    if before.is_some() {
        let _ = write!(
            b,
            "<p><a href=\"{}\">the latest output</a></p>",
            esc(&link("/log", &[("id", id), ("run", run)]))
        );
    }
    b.push_str(&log_block(row, run, path, ended, before));
    let dir = app.dir_display();
    let title = format!("{id} {run}");
    http::html(200, html::page(&shell(app, &title, "log", &dir, false), &b))
}

/// A log's bytes for `Range: bytes=…` (206 with `Content-Range`); without a range, its last
/// [`LOG_TAIL`] bytes (also 206), never a whole large file. `X-Run-Ended: 1` once its run has
/// ended (the script stops following then).
fn raw(req: &Request, path: &Path) -> Resp {
    let ended = path
        .parent()
        .and_then(meta)
        .is_some_and(|m| m.get("end").is_some_and(|e| !e.is_null()));
    let ended = http::hdr("X-Run-Ended", if ended { "1" } else { "0" });
    let Ok(mut f) = std::fs::File::open(path) else {
        return http::respond(416, "application/octet-stream", Vec::new())
            .with_header(http::hdr("Content-Range", "bytes */0"))
            .with_header(ended);
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let range = match http::byte_range(http::header(req, "Range"), len) {
        Ok(Some(r)) => r,
        Ok(None) => (len.saturating_sub(LOG_TAIL), len),
        Err(()) => {
            return http::respond(416, "application/octet-stream", Vec::new())
                .with_header(http::hdr("Content-Range", &format!("bytes */{len}")))
                .with_header(ended)
        }
    };
    let (start, end) = (range.0, range.1.min(range.0 + MAX_RANGE));
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(start)).is_ok() {
        let _ = f.take(end - start).read_to_end(&mut buf);
    }
    let last = start + buf.len() as u64;
    let cr = if buf.is_empty() {
        format!("bytes */{len}")
    } else {
        format!("bytes {start}-{}/{len}", last - 1)
    };
    http::respond(206, "application/octet-stream", buf)
        .with_header(http::hdr("Content-Range", &cr))
        .with_header(http::hdr("Accept-Ranges", "bytes"))
        .with_header(ended)
}

// ---- the event stream ------------------------------------------------------------------------

/// Does journal line `v` pass the filters: `smith` (that smith and its subtree, as `events
/// --smith`) and `event` (exactly, or every event it begins when it ends with `.`)?
fn passes(v: &serde_json::Value, smith: &str, event: &str) -> bool {
    let s = v.get("smith").and_then(|x| x.as_str()).unwrap_or("");
    let e = v.get("event").and_then(|x| x.as_str()).unwrap_or("");
    let smith_ok =
        smith.is_empty() || s == smith || s.strip_prefix(smith).is_some_and(|r| r.starts_with('/'));
    let event_ok = event.is_empty() || e == event || (event.ends_with('.') && e.starts_with(event));
    smith_ok && event_ok
}

/// One journal line as a table row: time, event, smith (a link), the other fields.
fn event_row(v: &serde_json::Value) -> String {
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("");
    let smith = s("smith");
    let smith_cell = if smith.is_empty() {
        "-".to_string()
    } else {
        format!(
            "<a href=\"{}\">{}</a>",
            esc(&link("/smith", &[("id", smith)])),
            esc(smith)
        )
    };
    let mut rest = String::new();
    if let Some(obj) = v.as_object() {
        for (k, val) in obj {
            if matches!(k.as_str(), "ts" | "event" | "smith") || val.is_null() {
                continue;
            }
            let text = match val {
                serde_json::Value::String(t) => t.clone(),
                other => other.to_string(),
            };
            let _ = write!(rest, "{k}={} ", text);
        }
    }
    let event = s("event");
    let class = match event {
        "run.exited" if v.get("exit_code").and_then(|c| c.as_i64()).unwrap_or(0) != 0 => "bad",
        "run.timed_out" | "run.cancelled" | "run.interrupted" | "access.denied" => "bad",
        "result.published" => "good",
        _ => "",
    };
    format!(
        "<tr class=\"{class}\"><td>{}</td><td>{}</td><td>{smith_cell}</td><td>{}</td></tr>",
        esc(s("ts")),
        esc(event),
        log_text(rest.trim_end().as_bytes())
    )
}

/// The events every filter offers (docs/SPEC.md §5, §7).
const EVENTS: [&str; 20] = [
    "run.",
    "run.started",
    "run.exited",
    "run.timed_out",
    "run.cancelled",
    "run.interrupted",
    "task.assigned",
    "task.ignored",
    "result.published",
    "children.settled",
    "smith.created",
    "access.denied",
    "access.denied.suppressed",
    "hook.exited",
    "trigger.dropped",
    "fleet.done",
    "workspace.committed",
    "config.reloaded",
    "mount.",
    "daemon.",
];

fn events_page(app: &App, t: &Target) -> Resp {
    let smith = t.get("smith").unwrap_or("").trim().to_string();
    let event = t.get("event").unwrap_or("").trim().to_string();
    let end = app.fleet.journal_end().unwrap_or(0);
    let from = end.saturating_sub(JOURNAL_TAIL);
    let (bytes, after) = app.fleet.journal_from(from).unwrap_or_default();
    let lines = parse_lines(&bytes, from > 0);
    let matching: Vec<&serde_json::Value> =
        lines.iter().filter(|v| passes(v, &smith, &event)).collect();
    let ids: Vec<String> = app
        .fleet
        .status()
        .map(|d| d.smiths.into_iter().map(|s| s.full_id).collect())
        .unwrap_or_default();
    let mut b = String::from(
        "<h1>Events</h1><form method=\"get\" action=\"events\" class=\"filter\">\
         <label>smith <select name=\"smith\"><option value=\"\">all</option>",
    );
    for id in &ids {
        let _ = write!(
            b,
            "<option value=\"{0}\"{1}>{0}</option>",
            esc(id),
            if *id == smith { " selected" } else { "" }
        );
    }
    b.push_str(
        "</select></label> <label>event <select name=\"event\"><option value=\"\">all</option>",
    );
    for e in EVENTS {
        let label = if e.ends_with('.') {
            format!("{e}*")
        } else {
            e.to_string()
        };
        let _ = write!(
            b,
            "<option value=\"{}\"{}>{}</option>",
            esc(e),
            if e == event { " selected" } else { "" },
            esc(&label)
        );
    }
    let shown = matching.len().min(EVENT_ROWS);
    let _ = write!(
        b,
        "</select></label> <button type=\"submit\">filter</button></form>\
         <p class=\"note\">newest first; {shown} of {} matching lines in the journal's last {} \
         MiB</p><table class=\"events\"><thead><tr><th>time</th><th>event</th><th>smith</th>\
         <th>fields</th></tr></thead><tbody id=\"events\" data-src=\"{}\" data-from=\"{after}\">",
        matching.len(),
        JOURNAL_TAIL >> 20,
        esc(&link(
            "/frag/events",
            &[("smith", &smith), ("event", &event)]
        ))
    );
    for v in matching.iter().rev().take(EVENT_ROWS) {
        b.push_str(&event_row(v));
    }
    b.push_str("</tbody></table>");
    let dir = app.dir_display();
    http::html(
        200,
        html::page(&shell(app, "events", "events", &dir, true), &b),
    )
}

/// The rows of the journal after `?from=` that pass the filters, newest first, with the new
/// end in `X-Journal-End`.
fn events_fragment(app: &App, t: &Target) -> Resp {
    let smith = t.get("smith").unwrap_or("");
    let event = t.get("event").unwrap_or("");
    let Some(from) = t.get("from").and_then(|f| f.parse::<u64>().ok()) else {
        return http::text(400, "bad request: from=OFFSET");
    };
    let end = app.fleet.journal_end().unwrap_or(0);
    // Far behind (a long sleep): only the recent part.
    let from = from.max(end.saturating_sub(JOURNAL_TAIL));
    let (bytes, after) = app.fleet.journal_from(from).unwrap_or_default();
    // Only complete lines; a torn tail is read again next time.
    let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let next = after - (bytes.len() - complete) as u64;
    let rows: String = parse_lines(&bytes[..complete], false)
        .iter()
        .filter(|v| passes(v, smith, event))
        .rev()
        .take(EVENT_ROWS)
        .map(event_row)
        .collect();
    http::html(200, rows).with_header(http::hdr("X-Journal-End", &next.to_string()))
}

// ---- a new task and the actions ---------------------------------------------------------------

fn task_page(app: &App) -> Resp {
    let dir = app.dir_display();
    let mut b = String::from("<h1>A new task for the root</h1>");
    if mounted(app) {
        b.push_str(&action_form(
            app,
            &[("action", "task")],
            "<label>title <input type=\"text\" name=\"title\" required></label>\
             <label>description <textarea name=\"text\" rows=\"12\" required></textarea></label>",
            "Write the task",
            "Write this task into the root's inbox? The root runs on it.",
        ));
    } else {
        b.push_str("<p>not mounted: a task can only be written into a mounted tree</p>");
    }
    http::html(
        200,
        html::page(&shell(app, "new task", "other", &dir, false), &b),
    )
}

/// Answer a POST (its token and origin already checked): `/action` with `action=retry|cancel|
/// accept|task`. Without `confirmed=1` (no JavaScript asked) the answer is a page whose button
/// says "Confirm"; with it, the action is done and its result shown.
pub fn post(app: &App, t: &Target, form: &[(String, String)]) -> Resp {
    if t.path != "/action" {
        return not_found();
    }
    let f = |k: &str| http::get(form, k).unwrap_or("");
    let action = f("action");
    let id = f("id");
    let dir = app.dir_display();
    if !matches!(action, "retry" | "cancel" | "accept" | "task") {
        return http::text(400, "bad request: no such action");
    }
    if action != "task" {
        let known = app
            .fleet
            .status()
            .map(|d| d.smith(id).is_some())
            .unwrap_or(false);
        if !known {
            return not_found();
        }
    }
    if !mounted(app) {
        return error_page(
            app,
            409,
            "not mounted: the tree is read-only (mount it to act on it)",
        );
    }
    let what = match action {
        "retry" => format!("Retry {id}?"),
        "cancel" => format!("Cancel {id} and its whole subtree?"),
        "accept" => format!(
            "Accept {id}'s work as branch {} of the repository?",
            if f("branch").is_empty() {
                crate::workspace::branch(id)
            } else {
                f("branch").to_string()
            }
        ),
        _ => format!("Write the task “{}” into the root's inbox?", f("title")),
    };
    if f("confirmed") != "1" {
        let mut fields: Vec<(&str, &str)> = vec![("confirmed", "1")];
        for k in ["action", "id", "branch", "title", "text"] {
            if let Some(v) = http::get(form, k) {
                fields.push((k, v));
            }
        }
        let mut b = format!("<h1>Confirm</h1><p>{}</p>", esc(&what));
        b.push_str(&format!(
            "<form method=\"post\" action=\"action\"><input type=\"hidden\" name=\"token\" \
             value=\"{}\">",
            esc(&app.token)
        ));
        for (k, v) in fields {
            let _ = write!(
                b,
                "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
                esc(k),
                esc(v)
            );
        }
        b.push_str("<button type=\"submit\">Confirm</button></form>");
        let back = if id.is_empty() {
            link("/", &[])
        } else {
            link("/smith", &[("id", id)])
        };
        let _ = write!(b, "<p><a href=\"{}\">back</a></p>", esc(&back));
        return http::html(
            200,
            html::page(&shell(app, "confirm", "other", &dir, false), &b),
        );
    }
    let branch = Some(f("branch")).filter(|b| !b.trim().is_empty());
    let outcome = match action {
        "retry" => app.fleet.retry(id),
        "cancel" => app.fleet.cancel(id),
        "accept" => app.fleet.accept(id, branch.map(str::trim)),
        _ => app.fleet.new_task(f("title"), f("text")),
    };
    let (status, class, msg) = match &outcome {
        Ok(m) => (200, "ok", m.as_str()),
        Err(e) => (409, "error", e.as_str()),
    };
    let back = if id.is_empty() {
        link("/", &[])
    } else {
        link("/smith", &[("id", id)])
    };
    let b = format!(
        "<h1>{}</h1><pre class=\"outcome {class}\" id=\"outcome\">{}</pre><p><a href=\"{}\">back</a></p>",
        esc(action),
        log_text(msg.as_bytes()),
        esc(&back)
    );
    http::html(
        status,
        html::page(&shell(app, action, "other", &dir, false), &b),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_and_filters() {
        assert!(is_run_id("run-0001"));
        assert!(!is_run_id("run-"));
        assert!(!is_run_id("../run-1"));
        assert!(!is_run_id("run-1/.."));
        let v =
            serde_json::json!({"ts": "T", "event": "run.exited", "smith": "smith-root/smith-001"});
        assert!(passes(&v, "", ""));
        assert!(passes(&v, "smith-root", "run."));
        assert!(passes(&v, "smith-root/smith-001", "run.exited"));
        assert!(!passes(&v, "smith-root/smith-00", ""));
        assert!(!passes(&v, "", "run.started"));
        let row = event_row(&serde_json::json!({"ts": "T", "event": "task.ignored",
            "smith": "smith-root", "path": "inbox/task-<b>\u{1b}[2J.md"}));
        assert!(
            row.contains("path=inbox/task-&lt;b&gt;\u{241b}[2J.md"),
            "{row}"
        );
        assert_eq!(parse_lines(b"{\"a\":1}\n{\"b\":2}\n{\"c\"", true).len(), 1);
        assert_eq!(parse_lines(b"{\"a\":1}\n{\"b\":2}\n", false).len(), 2);
    }
}
