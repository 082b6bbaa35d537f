//! Smith ids on the command line (docs/SPEC.md §6): a full id (`smith-root/smith-001`) or any
//! unambiguous short form — a short id only one smith has (`smith-001`), or a unique suffix of
//! a full id (`smith-001/smith-002`, `1/smith-002`) — and the store path of a smith dir
//! (`smiths/smith-root/children/smith-001`). Ambiguous and unknown ids are usage errors (exit 2)
//! whose one line lists the candidates.

use std::fmt;

/// A usage error: bad arguments or an unknown or ambiguous smith (docs/SPEC.md §6: exit 2).
/// `cli::run` maps it to exit code 2; its text is the one line printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Return early with a [`UsageError`] (exit 2), formatted like `bail!`.
macro_rules! usage {
    ($($arg:tt)*) => {
        return Err(anyhow::Error::new($crate::cli::ids::UsageError(format!($($arg)*))))
    };
}
pub(crate) use usage;

/// How many candidates an error line names before it says how many more there are.
const SHOWN: usize = 8;

/// `a, b, c` of the first [`SHOWN`] names, then `… (N more)`.
fn list(names: &[&str]) -> String {
    let mut out = names
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        out.push_str(&format!(" … ({} more)", names.len() - SHOWN));
    }
    out
}

/// `smiths/smith-root/children/smith-001[/…]` (a store path, with or without a trailing
/// slash or leading `./`) → `smith-root/smith-001`; anything else unchanged.
fn from_store_path(q: &str) -> String {
    let q = q.trim_start_matches("./").trim_end_matches('/');
    match q.strip_prefix("smiths/") {
        Some(rest) => rest.split("/children/").collect::<Vec<_>>().join("/"),
        None => q.to_string(),
    }
}

/// Resolve `query` among the full ids `known` (docs/SPEC.md §6), in this order: an exact full
/// id; a smith-dir path; the smiths whose full id ends with `/query` (whole components: a short
/// id or a component suffix); the smiths whose full id ends with `query` (any characters).
/// The first rule with exactly one match wins; a rule with several matches is ambiguous.
///
/// # Errors
/// [`UsageError`]: `query` is empty, ambiguous (the line lists the matching full ids) or
/// unknown (the line lists the known full ids).
pub fn resolve<'a>(known: &[&'a str], query: &str) -> Result<&'a str, UsageError> {
    let q = from_store_path(query.trim());
    if q.is_empty() {
        return Err(UsageError("an empty smith id".into()));
    }
    if let Some(exact) = known.iter().find(|k| **k == q) {
        return Ok(exact);
    }
    let component = format!("/{q}");
    let rules: [&dyn Fn(&str) -> bool; 2] = [&|k| k.ends_with(&component), &|k| k.ends_with(&*q)];
    for rule in rules {
        let hits: Vec<&'a str> = known.iter().copied().filter(|k| rule(k)).collect();
        match hits.as_slice() {
            [one] => return Ok(one),
            [] => {}
            many => {
                return Err(UsageError(format!(
                    "smith id `{query}` is ambiguous: {} (name one by its full id)",
                    list(many)
                )))
            }
        }
    }
    if known.is_empty() {
        return Err(UsageError(format!(
            "no such smith `{query}`: the tree has no smiths"
        )));
    }
    Err(UsageError(format!(
        "no such smith `{query}`; smiths: {}",
        list(known)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_table() {
        let known = [
            "smith-root",
            "smith-root/smith-001",
            "smith-root/smith-002",
            "smith-root/smith-002/smith-001",
            "smith-root/smith-002/smith-003",
        ];
        let rows: &[(&str, Result<&str, &str>)] = &[
            ("smith-root", Ok("smith-root")),
            ("smith-root/smith-001", Ok("smith-root/smith-001")),
            ("smith-002", Ok("smith-root/smith-002")),
            ("smith-003", Ok("smith-root/smith-002/smith-003")),
            ("smith-002/smith-001", Ok("smith-root/smith-002/smith-001")),
            ("2/smith-001", Ok("smith-root/smith-002/smith-001")),
            ("003", Ok("smith-root/smith-002/smith-003")),
            (
                "smiths/smith-root/children/smith-002/",
                Ok("smith-root/smith-002"),
            ),
            ("./smiths/smith-root", Ok("smith-root")),
            ("root", Ok("smith-root")),
            ("smith-001", Err("ambiguous")),
            ("1", Err("ambiguous")),
            ("smith-009", Err("no such smith")),
            ("", Err("empty")),
        ];
        for (q, want) in rows {
            match (resolve(&known, q), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, *w, "{q}"),
                (Err(e), Err(w)) => assert!(e.0.contains(w), "{q}: {e}"),
                (got, w) => panic!("{q}: got {got:?}, want {w:?}"),
            }
        }
        let e = resolve(&known, "smith-001").unwrap_err();
        assert_eq!(
            e.0,
            "smith id `smith-001` is ambiguous: smith-root/smith-001, \
             smith-root/smith-002/smith-001 (name one by its full id)"
        );
        assert!(resolve(&[], "smith-root").is_err());
        let many: Vec<String> = (1..=12)
            .map(|i| format!("smith-root/smith-{i:03}"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let e = resolve(&many, "smith-").unwrap_err();
        assert!(e.0.contains("(4 more)"), "{e}");
        assert!(!e.0.contains('\n'));
    }
}
