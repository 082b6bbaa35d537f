//! `agent.secrets_file` (docs/SPEC.md §12, "Secrets"): `KEY=VALUE` lines the daemon reads at
//! mount and gives to every run's environment; never stored in the tree, and masked in
//! `messages.log` by the output pump ([`Masker`]).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What a secret's value is replaced with in `messages.log`.
pub const MASK: &[u8] = b"***";

/// Values shorter than this are given to runs but not masked: masking `1` or `yes` everywhere
/// would make every log unreadable (docs/PROTOCOL-NOTES.md, the secrets note).
pub const MIN_MASKED: usize = 4;

/// The secrets of one mount: `(KEY, VALUE)` in file order.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    vars: Vec<(String, String)>,
}

impl std::fmt::Debug for Secrets {
    /// Names only: a value never reaches a log through `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.vars.iter().map(|(k, _)| k))
            .finish()
    }
}

impl Secrets {
    /// Read `path` for the store at `store` (both as the daemon sees them). The file must be an
    /// absolute path outside the store, a regular file (no symlink), of mode 0600 or narrower
    /// and owned by one of `operators` (root, the daemon's uid, the mounting user). Errors: one
    /// line naming `agent.secrets_file` and what is wrong.
    pub fn load(path: &Path, store: &Path, operators: &[u32]) -> Result<Secrets, String> {
        let key = "config.json: agent.secrets_file";
        if !path.is_absolute() {
            return Err(format!("{key}: {} is not an absolute path", path.display()));
        }
        let meta = std::fs::symlink_metadata(path)
            .map_err(|e| format!("{key}: {}: {e}", path.display()))?;
        if !meta.file_type().is_file() {
            return Err(format!(
                "{key}: {} is not a regular file (a symlink is refused too)",
                path.display()
            ));
        }
        let real =
            std::fs::canonicalize(path).map_err(|e| format!("{key}: {}: {e}", path.display()))?;
        let store_real = std::fs::canonicalize(store).unwrap_or_else(|_| store.to_path_buf());
        if real.starts_with(&store_real) {
            return Err(format!(
                "{key}: {} is inside the tree, where smiths could read it; keep it outside {}",
                path.display(),
                store_real.display()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(format!(
                "{key}: {} has mode {:04o}; make it 0600 (`chmod 600 {}`)",
                path.display(),
                meta.mode() & 0o7777,
                path.display()
            ));
        }
        if !operators.contains(&meta.uid()) {
            return Err(format!(
                "{key}: {} is owned by uid {}, not by the operator (root or the user who mounts)",
                path.display(),
                meta.uid()
            ));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("{key}: {}: {e}", path.display()))?;
        parse(&text).map_err(|e| format!("{key}: {}: {e}", path.display()))
    }

    /// The `(KEY, VALUE)` pairs, for a run's environment.
    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }

    /// No secrets?
    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// The output pump's masker of these values, or `None` when none is long enough to mask.
    pub fn masker(&self) -> Option<Masker> {
        let mut values: Vec<Vec<u8>> = self
            .vars
            .iter()
            .map(|(_, v)| v.as_bytes().to_vec())
            .filter(|v| v.len() >= MIN_MASKED)
            .collect();
        // Longest first: a value that contains another is masked whole.
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        (!values.is_empty()).then(|| Masker {
            values,
            carry: Vec::new(),
        })
    }
}

/// `KEY=VALUE` lines: blank lines and `#` comments skipped, an optional `export ` prefix, the
/// value taken verbatim after the first `=` (one pair of surrounding `"` or `'` removed). A key
/// is `[A-Za-z_][A-Za-z0-9_]*`. Errors name the line (never its value).
pub fn parse(text: &str) -> Result<Secrets, String> {
    let mut vars: Vec<(String, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim_start();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let l = l.strip_prefix("export ").unwrap_or(l);
        let Some((k, v)) = l.split_once('=') else {
            return Err(format!("line {}: not KEY=VALUE", i + 1));
        };
        let k = k.trim();
        let valid = k
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("line {}: {k:?} is not a variable name", i + 1));
        }
        let v = v.trim_end_matches(['\r']);
        let v = ['"', '\'']
            .iter()
            .find_map(|q| {
                v.strip_prefix(*q)
                    .and_then(|r| r.strip_suffix(*q))
                    .filter(|_| v.len() >= 2)
            })
            .unwrap_or(v);
        vars.retain(|(old, _)| old != k);
        vars.push((k.to_owned(), v.to_owned()));
    }
    Ok(Secrets { vars })
}

/// Masks secret values in one output stream, also across the chunks it arrives in: the bytes at
/// the end of a chunk that could begin a value are held until the next chunk (or the end).
#[derive(Clone, Debug)]
pub struct Masker {
    /// The values, longest first.
    values: Vec<Vec<u8>>,
    /// Held back from the last chunk: a proper prefix of some value.
    carry: Vec<u8>,
}

impl Masker {
    /// The next chunk of the stream, masked; what may begin a value is kept for later.
    pub fn push(&mut self, data: &[u8]) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(data);
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        'scan: while i < buf.len() {
            let rest = &buf[i..];
            for v in &self.values {
                if rest.starts_with(v) {
                    out.extend_from_slice(MASK);
                    i += v.len();
                    continue 'scan;
                }
            }
            if self
                .values
                .iter()
                .any(|v| rest.len() < v.len() && v.starts_with(rest))
            {
                self.carry = rest.to_vec();
                break;
            }
            out.push(buf[i]);
            i += 1;
        }
        out
    }

    /// The end of the stream: what was held back (it is no whole value).
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.carry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_lines() {
        let s = parse(
            "# keys\n\nAPI_KEY=sk-abc=def\nexport TOKEN=\"quoted value\"\nEMPTY=\nS='x'\nAPI_KEY=second\n",
        )
        .expect("parse");
        assert_eq!(
            s.vars(),
            [
                ("TOKEN".to_owned(), "quoted value".to_owned()),
                ("EMPTY".to_owned(), String::new()),
                ("S".to_owned(), "x".to_owned()),
                ("API_KEY".to_owned(), "second".to_owned()),
            ]
        );
        assert_eq!(format!("{s:?}"), r#"["TOKEN", "EMPTY", "S", "API_KEY"]"#);
        for (bad, line) in [("novalue\n", 1), ("A=1\n1X=2\n", 2), ("A B=1\n", 1)] {
            let e = parse(bad).expect_err(bad);
            assert!(e.starts_with(&format!("line {line}:")), "{e}");
        }
    }

    #[test]
    fn masks_across_chunks() {
        let s = parse("A=secret-one\nB=sec\nC=secret-one-longer\n").expect("parse");
        // (chunks, expected whole output)
        let cases: &[(&[&str], &str)] = &[
            (&["key secret-one here"], "key *** here"),
            (&["key secr", "et-one here"], "key *** here"),
            (&["s", "e", "c", "r", "e", "t", "-", "o", "n", "e"], "***"),
            (&["secret-one-longer!"], "***!"),
            (&["a secre"], "a secre"),
            (&["sec is short, not masked"], "sec is short, not masked"),
            (&["secret-on", "X"], "secret-onX"),
        ];
        for (chunks, want) in cases {
            let mut m = s.masker().expect("masker");
            let mut out = Vec::new();
            for c in *chunks {
                out.extend(m.push(c.as_bytes()));
            }
            out.extend(m.finish());
            assert_eq!(String::from_utf8_lossy(&out), *want, "{chunks:?}");
        }
        assert!(parse("A=abc\n").expect("parse").masker().is_none());
    }

    #[test]
    fn load_refuses_what_smiths_could_read() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().expect("tempdir");
        let store = t.path().join("tree");
        std::fs::create_dir(&store).expect("mkdir");
        let ok = t.path().join("secrets.env");
        std::fs::write(&ok, "K=value1\n").expect("write");
        std::fs::set_permissions(&ok, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let me = std::fs::metadata(&ok).expect("stat").uid();
        assert_eq!(
            Secrets::load(&ok, &store, &[me]).expect("load").vars(),
            [("K".to_owned(), "value1".to_owned())]
        );
        let inside = store.join("s.env");
        std::fs::copy(&ok, &inside).expect("copy");
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let wide = t.path().join("wide.env");
        std::fs::copy(&ok, &wide).expect("copy");
        std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        let link = t.path().join("link.env");
        std::os::unix::fs::symlink(&ok, &link).expect("symlink");
        for (path, ops, needle) in [
            (inside.as_path(), vec![me], "inside the tree"),
            (wide.as_path(), vec![me], "mode 0640"),
            (ok.as_path(), vec![me + 1], "not by the operator"),
            (link.as_path(), vec![me], "not a regular file"),
            (Path::new("rel.env"), vec![me], "not an absolute path"),
        ] {
            let e = Secrets::load(path, &store, &ops).expect_err(needle);
            assert!(
                e.starts_with("config.json: agent.secrets_file: ") && e.contains(needle),
                "{e}"
            );
        }
    }
}
