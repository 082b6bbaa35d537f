//! The environment the sandbox gives a run (docs/SPEC.md §12, "home/"): its `home/` as `HOME`,
//! the XDG directories and the agent CLIs' own variables inside it, `TMPDIR=/tmp`, and `USER` /
//! `LOGNAME` of the run's passwd entry. They come after the daemon's environment and before
//! `agent.env` (§5), which may override any of them.

use std::path::Path;

/// `(name, value)` for a run of the smith whose dir is `smith_dir` (its path as the run sees
/// it), as user `user`.
pub fn run_env(smith_dir: &Path, user: &str) -> Vec<(String, String)> {
    let home = smith_dir.join(super::tree::HOME);
    let sub = |rel: &str| home.join(rel).to_string_lossy().into_owned();
    vec![
        ("HOME".into(), home.to_string_lossy().into_owned()),
        ("XDG_CONFIG_HOME".into(), sub(".config")),
        ("XDG_CACHE_HOME".into(), sub(".cache")),
        ("XDG_DATA_HOME".into(), sub(".local/share")),
        ("XDG_STATE_HOME".into(), sub(".local/state")),
        // Claude Code: its config and sessions (default ~/.claude).
        ("CLAUDE_CONFIG_DIR".into(), sub(".claude")),
        // Codex: config.toml, auth.json, sessions (default ~/.codex).
        ("CODEX_HOME".into(), sub(".codex")),
        // Gemini CLI: the directory its .gemini/ lives in (default ~).
        (
            "GEMINI_CLI_HOME".into(),
            home.to_string_lossy().into_owned(),
        ),
        ("TMPDIR".into(), "/tmp".into()),
        ("USER".into(), user.into()),
        ("LOGNAME".into(), user.into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_points_into_home() {
        let env = run_env(Path::new("/t/smiths/smith-root"), "smith");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("HOME"), Some("/t/smiths/smith-root/home"));
        for k in [
            "XDG_CONFIG_HOME",
            "XDG_CACHE_HOME",
            "XDG_DATA_HOME",
            "CLAUDE_CONFIG_DIR",
            "CODEX_HOME",
            "GEMINI_CLI_HOME",
        ] {
            assert!(
                get(k).is_some_and(|v| v.starts_with("/t/smiths/smith-root/home")),
                "{k}"
            );
        }
        assert_eq!(get("TMPDIR"), Some("/tmp"));
        assert_eq!(
            (get("USER"), get("LOGNAME")),
            (Some("smith"), Some("smith"))
        );
    }
}
