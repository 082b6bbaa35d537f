//! The module map of `docs/ARCHITECTURE.md`, checked against the code: every path into the crate
//! (`use crate::…`, and `crate::a::b` written in code) from a file under `src/` must be one the
//! map's "May import" column allows its top-level module (an "Architecture Invariant" in
//! rust-analyzer's sense). The table is read from the document itself, so the map and the code
//! cannot drift apart; every top-level module must have a row.
//!
//! How the column is read: each backticked path is allowed together with everything under it
//! (`fs::Scheduling` allows `crate::fs::Scheduling` and `crate::fs::Scheduling::new`, not
//! `crate::fs::rebuild`; braces group as in a `use`: `` `policy::{Rule, zone}` ``); the words
//! "every module" allow the whole crate; a module always imports itself. A `use crate::fs;` (or
//! `crate::fs::*`) is an import of the whole module and needs `fs` itself. Paths written through
//! `super::` stay inside a module and are not checked; comments, strings and character literals
//! are skipped.

#![cfg(test)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Paths of the crate that a module may reach although its row does not list them, each with
/// its reason. Keep this short.
const EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// Names a "May import" cell may give that are not modules of the crate: external crates.
const EXTERNAL: &[&str] = &["libc", "nix", "rustix", "std"];

/// A path into the crate, as segments (`["fs", "Scheduling"]`).
type CratePath = Vec<String>;

/// One row of the module map: the paths a module may import, or every module.
#[derive(Debug, Default)]
struct Allowed {
    everything: bool,
    paths: Vec<CratePath>,
}

impl Allowed {
    fn allows(&self, module: &str, path: &[String]) -> bool {
        self.everything
            || path.first().is_some_and(|m| m == module)
            || self.paths.iter().any(|p| path.starts_with(p))
    }
}

/// Replaces comments, string and character literals with spaces (line breaks are kept, so line
/// numbers still count).
fn code_only(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, s: &[char]| {
        for c in s {
            out.push(if *c == '\n' { '\n' } else { ' ' });
        }
    };
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            let end = b[i..]
                .iter()
                .position(|c| *c == '\n')
                .map_or(b.len(), |n| i + n);
            blank(&mut out, &b[i..end]);
            i = end;
        } else if c == '/' && next == Some('*') {
            let (mut depth, mut j) = (0usize, i);
            while j < b.len() {
                if b[j] == '/' && b.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if b[j] == '*' && b.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, &b[i..j.min(b.len())]);
            i = j;
        } else if c == '"' || ((c == 'r' || c == 'b') && is_raw_or_byte_string(&b, i)) {
            let end = string_end(&b, i);
            blank(&mut out, &b[i..end]);
            i = end;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            let end = if next == Some('\\') {
                b[i + 3..]
                    .iter()
                    .position(|c| *c == '\'')
                    .map_or(b.len(), |n| i + 3 + n + 1)
            } else if b.get(i + 2) == Some(&'\'') {
                i + 3
            } else {
                i + 1
            };
            blank(&mut out, &b[i..end]);
            i = end;
        } else if c.is_alphanumeric() || c == '_' {
            // A whole identifier, so that `r` or `b` inside one never starts a string.
            let end = b[i..]
                .iter()
                .position(|c| !(c.is_alphanumeric() || *c == '_'))
                .map_or(b.len(), |n| i + n);
            out.extend(&b[i..end]);
            i = end;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Does a string literal start at `i` with a prefix (`r"`, `r#"`, `b"`, `br"`, `br#"`)?
fn is_raw_or_byte_string(b: &[char], i: usize) -> bool {
    let mut j = i;
    if b[j] == 'b' {
        j += 1;
    }
    if b.get(j) == Some(&'r') {
        j += 1;
        while b.get(j) == Some(&'#') {
            j += 1;
        }
    }
    j > i && b.get(j) == Some(&'"')
}

/// The index just past the string literal starting at `i` (with its prefix, if any).
fn string_end(b: &[char], i: usize) -> usize {
    let mut j = i;
    let mut raw = false;
    while b[j] == 'b' || b[j] == 'r' {
        raw |= b[j] == 'r';
        j += 1;
    }
    let hashes = b[j..].iter().take_while(|c| **c == '#').count();
    j += hashes + 1;
    while j < b.len() {
        match b[j] {
            '\\' if !raw => j += 2,
            '"' if b[j + 1..]
                .iter()
                .take(hashes)
                .filter(|c| **c == '#')
                .count()
                == hashes =>
            {
                return j + 1 + hashes;
            }
            _ => j += 1,
        }
    }
    b.len()
}

/// Skips whitespace from `i`.
fn ws(b: &[char], mut i: usize) -> usize {
    while i < b.len() && b[i].is_whitespace() {
        i += 1;
    }
    i
}

/// An identifier at `i` (after whitespace): it and the index past it.
fn ident(b: &[char], i: usize) -> Option<(String, usize)> {
    let i = ws(b, i);
    let n = b[i..]
        .iter()
        .take_while(|c| c.is_alphanumeric() || **c == '_')
        .count();
    (n > 0).then(|| (b[i..i + n].iter().collect(), i + n))
}

/// The paths of a `use` tree starting at `i` after the prefix `prefix` (`a::b`, `a::{b, c::d}`,
/// `self`, `*`, `a as b`), appended to `out`; returns the index past it.
fn use_tree(b: &[char], i: usize, prefix: &[String], out: &mut Vec<CratePath>) -> usize {
    let mut path = prefix.to_vec();
    let mut i = ws(b, i);
    loop {
        if b.get(i) == Some(&'{') {
            i += 1;
            loop {
                i = ws(b, i);
                match b.get(i) {
                    Some('}') => return i + 1,
                    Some(',') => i += 1,
                    None => return i,
                    // Anything a tree cannot start with is stepped over.
                    _ => i = use_tree(b, i, &path, out).max(i + 1),
                }
            }
        }
        if b.get(i) == Some(&'*') {
            out.push(path);
            return i + 1;
        }
        let Some((name, after)) = ident(b, i) else {
            if !path.is_empty() {
                out.push(path);
            }
            return i;
        };
        if name != "self" {
            path.push(name);
        }
        i = ws(b, after);
        if b.get(i) == Some(&':') && b.get(i + 1) == Some(&':') {
            i = ws(b, i + 2);
            continue;
        }
        out.push(path);
        // `as name`: the alias is no path.
        if let Some(("as", after)) = ident(b, i).as_ref().map(|(n, a)| (n.as_str(), *a)) {
            return ident(b, after).map_or(after, |(_, a)| a);
        }
        return i;
    }
}

/// Every path into the crate in the source text `src`: after each `crate::` (not part of a
/// longer identifier), comments and literals left out.
fn crate_paths(src: &str) -> Vec<(usize, CratePath)> {
    let code = code_only(src);
    let b: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 7 <= b.len() {
        let at_word = i == 0 || !(b[i - 1].is_alphanumeric() || b[i - 1] == '_');
        if at_word && b[i..i + 7].iter().copied().eq("crate::".chars()) {
            let line = b[..i].iter().filter(|c| **c == '\n').count() + 1;
            let mut paths = Vec::new();
            i = use_tree(&b, i + 7, &[], &mut paths);
            out.extend(paths.into_iter().map(|p| (line, p)));
        } else {
            i += 1;
        }
    }
    out
}

/// The module map of `doc` (the first table after `## Module map` whose header has "May
/// import"): top-level module name → what it may import. Errors name the row.
fn module_map(doc: &str) -> Result<BTreeMap<String, Allowed>, String> {
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Module map"))
        .ok_or("no `## Module map` section")?;
    let mut rows = section.lines().skip_while(|l| !l.starts_with('|'));
    let header: Vec<&str> = cells(rows.next().ok_or("no table")?);
    let col = header
        .iter()
        .position(|h| h.trim() == "May import")
        .ok_or("no `May import` column")?;
    let mut map = BTreeMap::new();
    for row in rows.skip(1).take_while(|l| l.starts_with('|')) {
        let cells = cells(row);
        let name = backticked(cells[0])
            .into_iter()
            .next()
            .ok_or_else(|| format!("a row without a module: {row}"))?;
        let module = name
            .trim_end_matches('/')
            .trim_end_matches(".rs")
            .to_owned();
        let cell = cells
            .get(col)
            .ok_or_else(|| format!("{module}: no May import cell"))?;
        let mut allowed = Allowed {
            everything: cell.contains("every module"),
            ..Allowed::default()
        };
        // A backticked span may hold several paths: `backing config fs::{Scheduling, rebuild}`.
        for span in backticked(cell) {
            let b: Vec<char> = span.chars().collect();
            let mut i = ws(&b, 0);
            while i < b.len() {
                i = ws(&b, use_tree(&b, i, &[], &mut allowed.paths).max(i + 1));
            }
        }
        map.insert(module, allowed);
    }
    Ok(map)
}

fn cells(row: &str) -> Vec<&str> {
    let row = row.trim().trim_start_matches('|').trim_end_matches('|');
    row.split('|').collect()
}

fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The top-level module a source file belongs to (`src/fs/io.rs` → `fs`), `None` for the crate
/// root and the binary.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let module = first.trim_end_matches(".rs");
    (!matches!(module, "lib" | "main")).then(|| module.to_owned())
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read src").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Every edge of `files` (path, text) that `map` does not allow, as one line each; and the
/// modules that have no row.
fn violations(map: &BTreeMap<String, Allowed>, files: &[(String, String, String)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (module, name, text) in files {
        let Some(allowed) = map.get(module) else {
            bad.push(format!(
                "{name}: module `{module}` has no row in the module map"
            ));
            continue;
        };
        for (line, path) in crate_paths(text) {
            let excepted = EXCEPTIONS
                .iter()
                .any(|(m, p, _)| m == module && path.join("::").starts_with(p) && !p.is_empty());
            if !allowed.allows(module, &path) && !excepted {
                bad.push(format!(
                    "{name}:{line}: `{module}` may not import `crate::{}`",
                    path.join("::")
                ));
            }
        }
    }
    bad
}

#[test]
fn imports_follow_the_architecture_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("read the map");
    let map = module_map(&doc).expect("the module map parses");
    let src = root.join("src");
    let mut files = Vec::new();
    for p in rust_files(&src) {
        let Some(module) = module_of(&src, &p) else {
            continue;
        };
        let text = std::fs::read_to_string(&p).expect("read source");
        let name = p.strip_prefix(root).unwrap_or(&p).display().to_string();
        files.push((module, name, text));
    }
    // Every name the map gives is a module of the crate or an external crate: a typo in the
    // map would otherwise allow nothing and hide a row that is too strict.
    let modules: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
    for (module, allowed) in &map {
        for p in &allowed.paths {
            let first = p.first().map_or("", String::as_str);
            assert!(
                modules.contains(&first) || EXTERNAL.contains(&first) || first == module,
                "docs/ARCHITECTURE.md: `{module}` may import `{}`, which is no module",
                p.join("::")
            );
        }
    }
    let bad = violations(&map, &files);
    assert!(
        bad.is_empty(),
        "imports the module map (docs/ARCHITECTURE.md) does not allow: fix the import, or the \
         map if the layering changed on purpose:\n{}",
        bad.join("\n")
    );
}

const MAP: &str = "\
# Title

## Module map

| Module | Job | May import |
|---|---|---|
| `cli/` | the commands | every module |
| `fs/` | the filesystem | `backing` `policy::{Rule, zone}` (types) |
| `sched/` | the scheduler | `fs::Scheduling`, `backing time` |
| `backing.rs` | the store | `libc` only |

## Next
";

fn check(module: &str, text: &str) -> Vec<String> {
    let map = module_map(MAP).expect("map");
    violations(
        &map,
        &[(module.into(), format!("{module}/x.rs"), text.into())],
    )
}

#[test]
fn the_map_is_read_from_the_table() {
    let map = module_map(MAP).expect("map");
    assert!(map["cli"].everything);
    let fs: Vec<String> = map["fs"].paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(fs, ["backing", "policy::Rule", "policy::zone"]);
    assert_eq!(map["backing"].paths, [vec!["libc".to_owned()]]);
    let sched: Vec<String> = map["sched"].paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(sched, ["fs::Scheduling", "backing", "time"]);
    assert!(module_map("# no map\n").is_err());
}

#[test]
fn a_forbidden_edge_fails() {
    // The scheduler may use the filesystem's port, not the filesystem.
    let bad = check("sched", "use crate::fs::rebuild::scan;\n");
    assert_eq!(
        bad,
        ["sched/x.rs:1: `sched` may not import `crate::fs::rebuild::scan`"]
    );
    // The store may import nothing of the crate; written in code, not in a `use`.
    assert_eq!(
        check("backing", "fn f() {\n    crate::fs::thing();\n}\n").len(),
        1
    );
    // The whole module, when only a part is allowed.
    assert_eq!(check("sched", "use crate::fs;\n").len(), 1);
    assert_eq!(check("sched", "use crate::fs::*;\n").len(), 1);
    // Inside a group, nested, across lines.
    let bad = check(
        "fs",
        "use crate::{\n    backing,\n    policy::{Rule, rules::decide},\n};\n",
    );
    assert_eq!(
        bad,
        ["fs/x.rs:1: `fs` may not import `crate::policy::rules::decide`"]
    );
    // A module without a row.
    assert_eq!(check("ghost", "").len(), 1);
}

#[test]
fn allowed_edges_and_non_code_pass() {
    assert!(check(
        "sched",
        "use crate::fs::Scheduling;\nuse crate::backing::{self, stat};\n"
    )
    .is_empty());
    assert!(check(
        "fs",
        "use crate::fs::anything;\nuse crate::policy::{zone::Zone, Rule as R};\n"
    )
    .is_empty());
    assert!(check("cli", "use crate::{fs, sched::view};\n").is_empty());
    assert!(check("sched", "pub(crate) fn f() {}\nuse super::super::x;\n").is_empty());
    // Comments, doc comments, strings, raw strings and lifetimes are not code.
    let text =
        "// crate::fs::x\n/// [`crate::fs::y`]\n/* crate::fs::z /* nested */ crate::fs::w */\n\
                fn f<'a>(s: &'a str) -> char {\n    let _ = \"crate::fs::x\";\n    \
                let _ = r#\"crate::fs::\"x\"\"#;\n    let _ = b\"crate::fs\";\n    '\"'\n}\n";
    assert!(
        check("sched", text).is_empty(),
        "{:?}",
        check("sched", text)
    );
    // Code after a character literal that is a quote is still read.
    assert_eq!(
        check("sched", "let q = '\"'; crate::fs::rebuild();\n").len(),
        1
    );
}
