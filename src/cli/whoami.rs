//! `smithfs whoami [--json]`: the calling process's identity and rights as the daemon sees it
//! (docs/SPEC.md §6, §7). It prints `<mount>/.smithfs/whoami` (`key: value` lines: identity, full id,
//! level, smith dir, identity mode, rights per area), or with `--json` one JSON object whose keys are
//! those keys in snake case (`full id` → `full_id`), values strings (`level` a number when it is
//! one).
//! The mount is found by `util::find_mount`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{Map, Value};

use super::util::find_mount;

/// Name of the control directory at the mount root (docs/SPEC.md §7).
pub const CONTROL_DIR: &str = ".smithfs";

/// Arguments of `smithfs whoami`.
#[derive(Debug, Args)]
pub struct WhoamiArgs {
    /// Print one JSON object instead of `key: value` lines.
    #[arg(long)]
    pub json: bool,
    /// The smithfs mount (default: the nearest above the working directory, then $SMITH_MOUNT,
    /// then ./.agent-smith).
    #[arg(long, value_name = "DIR")]
    pub mount: Option<PathBuf>,
}

/// Run `smithfs whoami`: print the caller's identity; exit 0, or 1 with one line when no mount is
/// found or the file cannot be read.
pub fn run(args: WhoamiArgs) -> Result<ExitCode> {
    let mount = find_mount(args.mount.as_deref())?;
    let file = mount.join(CONTROL_DIR).join("whoami");
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("cannot read {}", file.display()))?;
    if args.json {
        let json = serde_json::to_string_pretty(&to_json(&parse_pairs(&text)))?;
        println!("{json}");
    } else {
        print!("{text}");
        if !text.ends_with('\n') && !text.is_empty() {
            println!();
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The `key: value` lines of a `.smithfs/` file, in order (pure). The key is everything before the
/// first `:`, trimmed; the value the rest, trimmed. Blank lines and lines without `:` are skipped.
pub fn parse_pairs(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let k = k.trim();
            (!k.is_empty()).then(|| (k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// The value of `key` in `whoami` text (pure), e.g. `identity mode` → `cgroup`.
pub fn lookup(text: &str, key: &str) -> Option<String> {
    parse_pairs(text)
        .into_iter()
        .find(|(k, _)| snake(k) == snake(key))
        .map(|(_, v)| v)
}

/// `whoami` pairs as a JSON object (pure): keys snake-cased (runs of non-alphanumerics → `_`,
/// lower case), values strings, or numbers when the value is a whole number (`level`,
/// `daemon_pid`, `pid`, …: issue 11); a repeated key keeps its first value.
pub fn to_json(pairs: &[(String, String)]) -> Value {
    let mut map = Map::new();
    for (k, v) in pairs {
        let key = snake(k);
        if map.contains_key(&key) {
            continue;
        }
        let digits = !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
        let value = match v.parse::<u64>() {
            Ok(n) if digits => Value::from(n),
            _ => Value::from(v.as_str()),
        };
        map.insert(key, value);
    }
    Value::Object(map)
}

fn snake(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if c.is_alphanumeric() {
            out.extend(c.to_lowercase());
        } else if !out.is_empty() && !out.ends_with('_') {
            out.push('_');
        }
    }
    while out.ends_with('_') {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHOAMI: &str = "identity: smith\nfull id: smith-root/smith-001\nlevel: 1\n\
smith dir: /m/smiths/smith-root/children/smith-001\nidentity mode: ancestry\n\
rights private/: read, write, create, delete\nrights inbox/: read\n\nnot a pair\n";

    #[test]
    fn pairs_and_lookup() {
        let p = parse_pairs(WHOAMI);
        assert_eq!(p.len(), 7);
        assert_eq!(
            p[1],
            ("full id".to_string(), "smith-root/smith-001".to_string())
        );
        assert_eq!(lookup(WHOAMI, "identity mode").as_deref(), Some("ancestry"));
        assert_eq!(lookup(WHOAMI, "Identity Mode").as_deref(), Some("ancestry"));
        assert_eq!(lookup(WHOAMI, "missing"), None);
        assert_eq!(lookup("", "identity"), None);
    }

    #[test]
    fn json_shape() {
        let v = to_json(&parse_pairs(WHOAMI));
        assert_eq!(v["identity"], "smith");
        assert_eq!(v["full_id"], "smith-root/smith-001");
        assert_eq!(v["level"], 1);
        assert_eq!(v["identity_mode"], "ancestry");
        assert_eq!(v["rights_private"], "read, write, create, delete");
        let op = to_json(&parse_pairs(
            "identity: operator\nlevel: none\ndaemon pid: 4242\nsmith id: 007x\n",
        ));
        assert_eq!(op["level"], "none");
        assert_eq!(op["daemon_pid"], 4242);
        assert_eq!(op["smith_id"], "007x");
    }

    #[test]
    fn snake_table() {
        for (k, want) in [
            ("full id", "full_id"),
            ("Identity Mode", "identity_mode"),
            ("rights outbox/", "rights_outbox"),
            ("  x--y  ", "x_y"),
            ("", ""),
        ] {
            assert_eq!(snake(k), want, "{k:?}");
        }
    }
}
