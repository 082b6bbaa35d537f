//! Property-based fuzzing (issue 6, "Fuzzing") of the four parsers that take untrusted text:
//! the path classifier (`policy::classify`), the `/proc` parsers (`sys::procfs`), the
//! config parser (`config::Config::parse`, `SmithConfig::parse`) and the `.smithfs/ctl` command
//! parser (`fs::control::parse_command`).
//!
//! Every target checks "no panic" plus properties that a sane parser must keep (normalisation,
//! round trips, error messages that name what is wrong). The number of cases per target is
//! `SMITHFS_FUZZ_CASES` (default 5000, about a second in all); CI uses the default, a long run
//! sets e.g. `SMITHFS_FUZZ_CASES=200000`.

use std::collections::BTreeMap;
use std::ffi::OsStr;

use proptest::prelude::*;
use proptest::test_runner::Config as PtConfig;

use smithfs::config::{Config, SmithConfig};
use smithfs::fs::control::{parse_command, Command};
use smithfs::policy::{classify, Area, Depth, RootArea, SmithRef, Zone};
use smithfs::sys::procfs::{
    parse_cgroup, parse_mountinfo, parse_mountinfo_line, parse_stat, parse_status, unescape_octal,
};
use smithfs::tree::model::FullId;
use smithfs::tree::model::SmithIdx;

fn cases() -> u32 {
    std::env::var("SMITHFS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000)
}

fn cfg() -> PtConfig {
    PtConfig {
        cases: cases(),
        failure_persistence: None,
        ..PtConfig::default()
    }
}

// ------------------------------------------------------------------------------------------
// policy::classify
// ------------------------------------------------------------------------------------------

/// A registry of `smith-root` and, under every registered smith, `smith-001` … `smith-003` down
/// to level 3 (what a real tree looks like; `smith-004` and deeper levels are unregistered).
fn registry(id: &str) -> Option<SmithRef> {
    let parts: Vec<&str> = id.split('/').collect();
    if parts.first() != Some(&"smith-root") || parts.len() > 4 {
        return None;
    }
    let mut idx = 0u32;
    let mut parent = None;
    for p in &parts[1..] {
        let n = match *p {
            "smith-001" => 1,
            "smith-002" => 2,
            "smith-003" => 3,
            _ => return None,
        };
        parent = Some(SmithIdx(idx));
        idx = idx * 4 + n;
    }
    Some(SmithRef {
        idx: SmithIdx(idx),
        parent,
        level: (parts.len() - 1) as u8,
    })
}

fn nothing_registered(_: &str) -> Option<SmithRef> {
    None
}

/// Path components drawn mostly from the names that matter, plus arbitrary text.
fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "smiths", "smith-root", "children", "smith-001", "smith-002", "smith-003",
            "smith-004", "smith-0001", "inbox", "private", "outbox", "conversations",
            ".claude", "config.json", "smith.md", "results", "templates", "agents",
            ".smithfs", ".smithfs-state", "ctl", "x", "CLAUDE.md",
        ])
        .prop_map(str::to_owned),
        1 => prop::sample::select(vec![".", "..", ""]).prop_map(str::to_owned),
        1 => "[^/\u{0}]{1,12}",
    ]
}

fn path() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(component(), 0..12)
}

/// Resolve `.`, `..` (clamped at the root) and empty components.
fn normalise(parts: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in parts {
        match p.as_str() {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            _ => out.push(p.clone()),
        }
    }
    out
}

#[test]
fn classify_fuzz() {
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    runner
        .run(&(path(), any::<bool>()), |(parts, leading_slash)| {
            let joined = parts.join("/");
            let p = if leading_slash {
                format!("/{joined}")
            } else {
                joined.clone()
            };
            let z = classify(&p, registry);
            // Normalisation: `.`, empty components and `..` never change the answer.
            let norm = normalise(&parts).join("/");
            prop_assert_eq!(z, classify(&norm, registry), "{} vs {}", p, norm);
            // `..` never climbs above the mount root.
            prop_assert_eq!(z, classify(&format!("../../{norm}"), registry));
            // Doubled slashes and `./` are the same path.
            let noisy = normalise(&parts).join("//./");
            prop_assert_eq!(z, classify(&noisy, registry));
            // Structure: with nothing registered there is no smith zone at all, and each step is
            // `child_zone` of the previous one.
            let n = normalise(&parts);
            let mut step = Zone::root();
            for c in &n {
                step = step.child_zone(OsStr::new(c));
            }
            prop_assert_eq!(step, classify(&norm, nothing_registered));
            prop_assert!(matches!(step, Zone::Outside { .. }), "{:?}", step);
            // The reserved state dir keeps its area however it is reached.
            if n.first().map(String::as_str) == Some(".smithfs-state") {
                let reserved = matches!(
                    z,
                    Zone::Outside {
                        area: RootArea::Reserved,
                        ..
                    }
                );
                prop_assert!(reserved, "{:?}", z);
            }
            Ok(())
        })
        .unwrap();
}

/// Entries strictly inside a smith's area belong to that smith and area, whatever follows.
#[test]
fn classify_areas_are_owned() {
    let areas = [
        ("inbox", Area::Inbox),
        ("private", Area::Private),
        ("outbox", Area::Outbox),
        ("conversations", Area::Conversations),
        (".claude", Area::Claude),
    ];
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    runner
        .run(
            &(
                prop::collection::vec(1u32..=3, 0..4),
                0usize..areas.len(),
                prop::collection::vec("[a-zA-Z0-9._-]{1,10}", 1..5),
            ),
            |(chain, a, rest)| {
                let mut id = "smith-root".to_string();
                let mut dir = "smiths/smith-root".to_string();
                for n in &chain {
                    id.push_str(&format!("/smith-{n:03}"));
                    dir.push_str(&format!("/children/smith-{n:03}"));
                }
                let want = registry(&id).unwrap();
                let rest: Vec<String> = rest.into_iter().filter(|r| r != "..").collect();
                prop_assume!(!rest.is_empty());
                let p = format!("{dir}/{}/{}", areas[a].0, rest.join("/"));
                let z = classify(&p, registry);
                let normal_rest = normalise(&rest);
                match z {
                    Zone::Smith(s) => {
                        prop_assert_eq!(s.owner, want.idx, "{}", p);
                        prop_assert_eq!(s.owner_level, want.level);
                        prop_assert_eq!(s.owner_parent, want.parent);
                        prop_assert_eq!(s.area, areas[a].1);
                        let depth = if normal_rest.is_empty() {
                            Depth::Top
                        } else {
                            Depth::Inner
                        };
                        prop_assert_eq!(s.depth, depth, "{}", p);
                    }
                    other => prop_assert!(false, "{} gave {:?}", p, other),
                }
                // A smith dir's name elsewhere (private/children/smith-001) is private data.
                let fake = format!("{dir}/private/children/smith-001/inbox/x");
                match classify(&fake, registry) {
                    Zone::Smith(s) => {
                        prop_assert_eq!(s.owner, want.idx);
                        prop_assert_eq!(s.area, Area::Private);
                    }
                    other => prop_assert!(false, "{} gave {:?}", fake, other),
                }
                Ok(())
            },
        )
        .unwrap();
}

// ------------------------------------------------------------------------------------------
// sys::procfs
// ------------------------------------------------------------------------------------------

/// Real /proc files of this machine: every one must parse, and mutations of them must not panic.
fn real_proc_samples() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name();
        if !name.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        for (kind, file) in [("stat", "stat"), ("status", "status"), ("cgroup", "cgroup")] {
            if let Ok(b) = std::fs::read(e.path().join(file)) {
                out.push((kind, b));
            }
        }
        if out.len() > 600 {
            break;
        }
    }
    if let Ok(b) = std::fs::read("/proc/self/mountinfo") {
        out.push(("mountinfo", b));
    }
    out
}

fn parse_kind(kind: &str, b: &[u8]) -> Result<(), String> {
    match kind {
        "stat" => parse_stat(b).map(|_| ()).map_err(|e| e.to_string()),
        "status" => parse_status(b).map(|_| ()).map_err(|e| e.to_string()),
        "cgroup" => parse_cgroup(b).map(|_| ()).map_err(|e| e.to_string()),
        _ => parse_mountinfo(b).map(|_| ()).map_err(|e| e.to_string()),
    }
}

#[test]
fn procfs_parses_every_real_file() {
    let samples = real_proc_samples();
    assert!(samples.len() > 10);
    for (kind, b) in &samples {
        if let Err(e) = parse_kind(kind, b) {
            // A process may exit between reads (empty file): only real content must parse.
            assert!(b.is_empty(), "{kind}: {e}\n{}", String::from_utf8_lossy(b));
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
    Dup(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (
            any::<usize>(),
            prop::sample::select(vec![
                b' ', b'\n', b'(', b')', b':', b'\\', b'-', b'0', b'9', 0
            ])
        )
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Mutation::Dup(i, n)),
    ]
}

fn mutate(mut b: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let len = b.len().max(1);
        match *m {
            Mutation::Flip(i, x) if !b.is_empty() => b[i % len] = x,
            Mutation::Insert(i, x) => b.insert(i % (b.len() + 1), x),
            Mutation::Delete(i) if !b.is_empty() => {
                b.remove(i % len);
            }
            Mutation::Truncate(i) => b.truncate(i % len),
            Mutation::Dup(i, n) if !b.is_empty() => {
                let s = i % len;
                let e = (s + n).min(b.len());
                let chunk = b[s..e].to_vec();
                b.splice(s..s, chunk);
            }
            _ => {}
        }
    }
    b
}

#[test]
fn procfs_mutated_real_files_never_panic() {
    let samples = real_proc_samples();
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    runner
        .run(
            &(0..samples.len(), prop::collection::vec(mutation(), 1..8)),
            |(i, ms)| {
                let (kind, b) = &samples[i];
                let m = mutate(b.clone(), &ms);
                // Any parser on any mutated file: an answer or an error with a message.
                for k in ["stat", "status", "cgroup", "mountinfo"] {
                    if let Err(e) = parse_kind(k, &m) {
                        prop_assert!(!e.is_empty());
                        prop_assert!(e.len() < 400, "{} error too long: {}", kind, e);
                    }
                }
                for line in m.split(|c| *c == b'\n') {
                    let _ = parse_mountinfo_line(line);
                    let _ = unescape_octal(line);
                }
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn procfs_cgroup_round_trips() {
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    runner
        .run(
            &(
                prop::collection::vec("[a-zA-Z0-9._@-]{1,12}", 0..6),
                any::<bool>(),
            ),
            |(parts, deleted)| {
                let path = format!("/{}", parts.join("/"));
                let text = format!(
                    "12:cpu,cpuacct:/x\n1:name=systemd:/y\n0::{path}{}\n",
                    if deleted { " (deleted)" } else { "" }
                );
                let c = parse_cgroup(text.as_bytes())
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(c.v2.as_deref(), Some(std::path::Path::new(&path)));
                prop_assert_eq!(c.v2_deleted, deleted);
                prop_assert_eq!(c.v1.len(), 2);
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn procfs_status_round_trips() {
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    runner
        .run(
            &(
                1i32..,
                0i32..,
                prop::collection::vec(1i32.., 1..4),
                prop::array::uniform4(any::<u32>()),
                prop::collection::vec(any::<u32>(), 0..5),
            ),
            |(tgid, ppid, nspid, uids, groups)| {
                let j = |v: &[String]| v.join("\t");
                let text = format!(
                    "Name:\tx y\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{tgid}\nNgid:\t0\nPid:\t{tgid}\nPPid:\t{ppid}\n\
                     TracerPid:\t0\nUid:\t{}\nGid:\t{}\nFDSize:\t64\nGroups:\t{} \nNStgid:\t{}\nNSpid:\t{}\n",
                    j(&uids.iter().map(u32::to_string).collect::<Vec<_>>()),
                    j(&uids.iter().rev().map(u32::to_string).collect::<Vec<_>>()),
                    groups.iter().map(u32::to_string).collect::<Vec<_>>().join(" "),
                    j(&nspid.iter().map(i32::to_string).collect::<Vec<_>>()),
                    j(&nspid.iter().map(i32::to_string).collect::<Vec<_>>()),
                );
                let s = parse_status(text.as_bytes()).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
                prop_assert_eq!(s.tgid, tgid);
                prop_assert_eq!(s.ppid, ppid);
                prop_assert_eq!(s.uid.real, uids[0]);
                prop_assert_eq!(s.uid.fs, uids[3]);
                prop_assert_eq!(s.gid.real, uids[3]);
                prop_assert_eq!(&s.groups, &groups);
                prop_assert_eq!(s.nspid.as_deref(), Some(&nspid[..]));
                Ok(())
            },
        )
        .unwrap();
}

// ------------------------------------------------------------------------------------------
// config::Config::parse
// ------------------------------------------------------------------------------------------

/// JSON values shaped like config.json: the schema's keys with values of any type, plus
/// misspelled keys, at any nesting level.
fn json_leaf() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value as V;
    prop_oneof![
        Just(V::Null),
        any::<bool>().prop_map(V::Bool),
        any::<i64>().prop_map(V::from),
        (0u64..10).prop_map(V::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(V::Null, V::Number)),
        prop::sample::select(vec![
            "",
            "read-only",
            "read-write",
            "auto",
            "cgroup",
            "ancestry",
            "{mount}",
            "{nope}",
            "result.published",
            "hook.exited",
            "bash",
        ])
        .prop_map(|s| V::String(s.into())),
        "\\PC{0,8}".prop_map(V::String),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec![
            "agent", "command", "env", "timeout_secs", "retries", "kill_grace_secs", "scheduler",
            "max_concurrent", "limits", "max_level", "max_children", "max_open_files_per_smith",
            "operator", "identity",
            "hooks", "hook_timeout_secs", "result.published", "run.exited", "hook.exited",
            "smith.created", "access.denied",
        ])
        .prop_map(str::to_owned),
        1 => "[a-z_.]{1,10}",
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    json_leaf().prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn config_parse_fuzz_structured() {
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    runner
        .run(
            &prop::collection::btree_map(key(), json_value(), 0..8),
            |doc| {
                let text = serde_json::to_string(&doc).unwrap();
                match Config::parse(&text) {
                    Ok(c) => {
                        // Whatever is accepted must survive its own round trip.
                        let again = serde_json::to_string(&c).unwrap();
                        let c2 = Config::parse(&again)
                            .map_err(|e| TestCaseError::fail(format!("{e}: {again}")))?;
                        prop_assert_eq!(c, c2);
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        prop_assert!(msg.starts_with("config.json: "), "{}", msg);
                        prop_assert!(!msg.contains('\n'), "one line: {}", msg);
                    }
                }
                let _ = SmithConfig::parse(&text);
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn config_parse_fuzz_text() {
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    runner
        .run(&"[{}\\[\\]\":, a-z0-9_.\\\\\n-]{0,80}", |text| {
            if let Err(e) = Config::parse(&text) {
                prop_assert!(e.to_string().starts_with("config.json: "));
            }
            let _ = SmithConfig::parse(&text);
            Ok(())
        })
        .unwrap();
}

/// A valid config with one value replaced by a wrong type: the message names that key's path.
#[test]
fn config_errors_name_the_key_path() {
    let leaves: Vec<(&str, serde_json::Value)> = vec![
        ("agent.timeout_secs", serde_json::json!(10)),
        ("agent.retries", serde_json::json!(1)),
        ("agent.kill_grace_secs", serde_json::json!(1)),
        ("scheduler.max_concurrent", serde_json::json!(2)),
        ("limits.max_level", serde_json::json!(3)),
        ("limits.max_children", serde_json::json!(5)),
        ("limits.max_open_files_per_smith", serde_json::json!(100)),
        ("hook_timeout_secs", serde_json::json!(5)),
        ("operator", serde_json::json!("read-write")),
        ("identity", serde_json::json!("auto")),
    ];
    let bad = prop_oneof![
        Just(serde_json::json!("seven")),
        Just(serde_json::json!(-1)),
        Just(serde_json::json!([1])),
        Just(serde_json::json!({"x": 1})),
        Just(serde_json::json!(true)),
        Just(serde_json::json!(1.5)),
    ];
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    runner
        .run(
            &(
                0..leaves.len(),
                bad,
                prop::collection::vec(any::<bool>(), leaves.len()),
            ),
            |(which, bad, keep)| {
                let mut doc = serde_json::json!({});
                for (i, (path, v)) in leaves.iter().enumerate() {
                    if i != which && !keep[i] {
                        continue;
                    }
                    let v = if i == which { bad.clone() } else { v.clone() };
                    let mut at = &mut doc;
                    let parts: Vec<&str> = path.split('.').collect();
                    for p in &parts[..parts.len() - 1] {
                        at = at
                            .as_object_mut()
                            .unwrap()
                            .entry(p.to_string())
                            .or_insert(serde_json::json!({}));
                    }
                    at[parts[parts.len() - 1]] = v;
                }
                let text = serde_json::to_string_pretty(&doc).unwrap();
                let e = Config::parse(&text).expect_err(&text).to_string();
                prop_assert!(
                    e.contains(leaves[which].0),
                    "{} does not name {}: {}",
                    e,
                    leaves[which].0,
                    text
                );
                Ok(())
            },
        )
        .unwrap();
}

/// A misspelled key anywhere is refused and named.
#[test]
fn config_unknown_keys_are_named() {
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    runner
        .run(
            &(
                prop::sample::select(vec!["", "agent", "scheduler", "limits"]),
                "[a-z]{1,8}x",
            ),
            |(section, key)| {
                let mut doc =
                    serde_json::json!({"agent": {"retries": 1}, "limits": {}, "scheduler": {}});
                let path = if section.is_empty() {
                    doc[key.as_str()] = serde_json::json!(1);
                    key.clone()
                } else {
                    doc[section][key.as_str()] = serde_json::json!(1);
                    format!("{section}.{key}")
                };
                let e = Config::parse(&doc.to_string())
                    .expect_err("unknown key")
                    .to_string();
                prop_assert!(e.contains(&format!("unknown key {path}")), "{}", e);
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn config_valid_documents_round_trip() {
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    runner
        .run(
            &(
                prop::option::of(prop::collection::vec(
                    prop::sample::select(vec!["bash", "{mount}/a.sh", "{full_id}", "-c", "{ x }"]),
                    1..4,
                )),
                prop::collection::btree_map("[A-Z_]{1,6}", "\\PC{0,6}", 0..3),
                1u64..100_000,
                any::<u32>(),
                1u32..64,
                any::<u8>(),
                any::<u32>(),
                prop::option::of(1u32..),
                prop::option::of(prop::collection::vec(
                    prop::collection::vec(prop::sample::select(vec!["sh", "{smith_id}", "x"]), 1..3),
                    0..3,
                )),
            ),
            |(command, env, timeout, retries, maxc, level, children, open_files, hooks)| {
                let mut doc = serde_json::json!({
                    "agent": {"command": command, "env": env, "timeout_secs": timeout, "retries": retries},
                    "scheduler": {"max_concurrent": maxc},
                    "limits": {"max_level": level, "max_children": children, "max_open_files_per_smith": open_files},
                });
                if let Some(h) = &hooks {
                    doc["hooks"] = serde_json::json!({ "run.exited": h });
                }
                let c = Config::parse(&doc.to_string()).map_err(|e| TestCaseError::fail(format!("{e}: {doc}")))?;
                prop_assert_eq!(&c.agent.command, &command.map(|v| v.into_iter().map(str::to_owned).collect::<Vec<_>>()));
                let env2: BTreeMap<String, String> = env;
                prop_assert_eq!(&c.agent.env, &env2);
                prop_assert_eq!(c.agent.timeout_secs, timeout);
                prop_assert_eq!(c.scheduler.max_concurrent, maxc);
                prop_assert_eq!(c.limits.max_level, level);
                prop_assert_eq!(c.limits.max_children, children);
                prop_assert_eq!(c.limits.max_open_files_per_smith, open_files);
                Ok(())
            },
        )
        .unwrap();
}

// ------------------------------------------------------------------------------------------
// fs::control::parse_command
// ------------------------------------------------------------------------------------------

fn full_id() -> impl Strategy<Value = String> {
    prop::collection::vec(1u32..100_000, 0..4).prop_map(|ns| {
        let mut s = "smith-root".to_string();
        for n in ns {
            s.push_str(&format!("/smith-{n:03}"));
        }
        s
    })
}

#[test]
fn ctl_parse_fuzz() {
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    let line = prop_oneof![
        "\\PC{0,60}",
        (
            prop::sample::select(vec!["bind", "cancel", "BIND", "kill", ""]),
            "[ \t\n]{0,3}",
            prop_oneof![full_id(), "[a-z0-9/-]{0,30}"],
            "[ \t\n]{0,3}",
            prop::option::of("[a-z]{1,5}")
        )
            .prop_map(|(v, w1, id, w2, extra)| format!(
                "{w1}{v} {id}{w2}{}",
                extra.map(|e| format!(" {e}")).unwrap_or_default()
            )),
    ];
    runner
        .run(&line, |line| {
            match parse_command(&line) {
                Ok(cmd) => {
                    let words: Vec<&str> = line.split_whitespace().collect();
                    if cmd == Command::Reload {
                        prop_assert_eq!(words, vec!["reload"], "{:?}", line);
                        return Ok(());
                    }
                    prop_assert_eq!(words.len(), 2, "{:?}", line);
                    let (verb, id) = match &cmd {
                        Command::Bind(id) => ("bind", id),
                        Command::Cancel(id) => ("cancel", id),
                        Command::Retry(id) => ("retry", id),
                        Command::Reload => unreachable!("handled above"),
                    };
                    prop_assert_eq!(words[0], verb);
                    prop_assert_eq!(words[1], id.as_str());
                    prop_assert!(FullId::parse(id).is_some());
                }
                Err(msg) => {
                    prop_assert!(!msg.is_empty());
                    prop_assert!(!msg.contains('\n') || line.contains('\n'), "{:?}", msg);
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn ctl_valid_commands_parse() {
    let mut runner = proptest::test_runner::TestRunner::new(cfg());
    runner
        .run(
            &(any::<bool>(), full_id(), "[ \t]{0,3}", "[ \t\n]{0,3}"),
            |(bind, id, pre, post)| {
                let verb = if bind { "bind" } else { "cancel" };
                let line = format!("{pre}{verb} {id}{post}");
                let want = if bind {
                    Command::Bind(FullId::parse(&id).unwrap())
                } else {
                    Command::Cancel(FullId::parse(&id).unwrap())
                };
                prop_assert_eq!(parse_command(&line), Ok(want));
                // Any one malformed component makes it an error.
                let broken = format!("{verb} {id}/smith-1");
                prop_assert!(parse_command(&broken).is_err());
                let broken = format!("{verb} {}", id.replacen("smith-root", "smith-rooT", 1));
                prop_assert!(parse_command(&broken).is_err());
                Ok(())
            },
        )
        .unwrap();
}
