//! Pure model of the smith tree (docs/SPEC.md §1, §4): smith indices, full ids and the
//! child-name rules.
//!
//! A *full id* is `smith-root` followed by zero or more `/smith-NNN` (`smith-root/smith-001`);
//! its *level* is its number of `/` (the root is level 0). A child dir's name is `smith-` and
//! three or more ASCII digits (§4 rule 3). How deep the tree may grow and how many children a
//! smith may have are limits of the mount (`limits.max_level`, default
//! [`DEFAULT_MAX_LEVEL`]; `limits.max_children`, default [`DEFAULT_MAX_CHILDREN`]), applied by
//! `policy::check_new_child`.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Index of a registered smith in the daemon's registry. Stable for the life of a mount;
/// never reused for another smith while the mount lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SmithIdx(pub u32);

/// The root smith's id and full id (§1).
pub const ROOT_ID: &str = "smith-root";

/// What every child name starts with (§4 rule 3).
pub const CHILD_PREFIX: &str = "smith-";

/// `limits.max_level` when `config.json` does not set it (§8): children down to level 3.
pub const DEFAULT_MAX_LEVEL: u8 = 3;

/// `limits.max_children` when `config.json` does not set it (§8).
pub const DEFAULT_MAX_CHILDREN: u32 = 5;

/// The number of a child dir name, or `None` if `name` is not a valid child name (§4 rule 3 →
/// EINVAL).
///
/// Valid: `smith-` followed by three or more ASCII digits and nothing else (no sign, no spaces),
/// whose value fits in a `u32`. `smith-000` is a valid name, as docs/SPEC.md §4 rule 3 reads (three
/// digits, and 0 is above every number a smith without children has used); the scheduler and
/// `why` still suggest `smith-001` first (docs/PROTOCOL-NOTES.md). Extra leading
/// zeros are accepted (`smith-0042` is 42, as "three or more digits" allows); the strictly
/// increasing rule compares numbers, so `smith-042` and `smith-0042` can never both exist.
pub fn parse_child_name(name: &OsStr) -> Option<u32> {
    let digits = numbered_digits(name)?;
    let mut n: u32 = 0;
    for d in digits {
        n = n.checked_mul(10)?.checked_add(u32::from(d - b'0'))?;
    }
    Some(n)
}

/// Is `name` `smith-` and three or more digits, whatever their value? (A number too large for
/// [`parse_child_name`] is still a numbered name: `why` then says the number is the problem.)
pub fn is_numbered_name(name: &OsStr) -> bool {
    numbered_digits(name).is_some()
}

fn numbered_digits(name: &OsStr) -> Option<&[u8]> {
    let digits = name.as_bytes().strip_prefix(CHILD_PREFIX.as_bytes())?;
    (digits.len() >= 3 && digits.iter().all(u8::is_ascii_digit)).then_some(digits)
}

/// The canonical name of child number `n`: `smith-` and `n` zero-padded to three digits
/// (`1` → `smith-001`, `1234` → `smith-1234`). For every `n`,
/// `parse_child_name(child_name(n)) == Some(n)`.
pub fn child_name(n: u32) -> String {
    format!("{CHILD_PREFIX}{n:03}")
}

/// A smith's full id: `smith-root`, `smith-root/smith-001`, … (§1). Always valid: made by
/// [`FullId::parse`], [`FullId::root`] or [`FullId::child`]. Shown, serialized and compared as
/// its text, so it can stand wherever the text stood.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FullId(String);

impl FullId {
    /// `smith-root`.
    pub fn root() -> FullId {
        FullId(ROOT_ID.to_owned())
    }

    /// `s` if it is `smith-root` followed by zero or more `/NAME` with NAME a valid child name
    /// ([`parse_child_name`]); `None` otherwise.
    pub fn parse(s: &str) -> Option<FullId> {
        let mut parts = s.split('/');
        if parts.next() != Some(ROOT_ID) {
            return None;
        }
        parts
            .all(|p| parse_child_name(OsStr::new(p)).is_some())
            .then(|| FullId(s.to_owned()))
    }

    /// The full id of the child named `name` (a valid child name), or `None` when `name` is not
    /// one.
    pub fn child(&self, name: &str) -> Option<FullId> {
        parse_child_name(OsStr::new(name))?;
        Some(FullId(format!("{}/{name}", self.0)))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Is this `smith-root`?
    pub fn is_root(&self) -> bool {
        self.0 == ROOT_ID
    }

    /// Its level: the number of `/` (the root is 0).
    pub fn level(&self) -> u8 {
        u8::try_from(self.0.matches('/').count()).unwrap_or(u8::MAX)
    }

    /// The parent's full id; `None` for the root.
    pub fn parent(&self) -> Option<FullId> {
        self.0.rsplit_once('/').map(|(p, _)| FullId(p.to_owned()))
    }

    /// Its short id, the last part: `smith-001` of `smith-root/smith-001`, `smith-root`.
    pub fn short(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// Its parts from the root down: `smith-root`, `smith-001`, ….
    pub fn parts(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// Is this smith strictly above `other` in the tree?
    pub fn is_ancestor_of(&self, other: &FullId) -> bool {
        other
            .0
            .strip_prefix(self.0.as_str())
            .is_some_and(|rest| rest.starts_with('/'))
    }

    /// Its smith dir relative to the mount root: `smith-root` → `smiths/smith-root`,
    /// `smith-root/smith-001/smith-002` → `smiths/smith-root/children/smith-001/children/smith-002`.
    pub fn smith_dir_rel(&self) -> PathBuf {
        PathBuf::from(self.smith_path())
    }

    /// [`FullId::smith_dir_rel`] as text, for sentences: `smiths/smith-root/children/smith-001`.
    pub fn smith_path(&self) -> String {
        format!("smiths/{}", self.0.replace('/', "/children/"))
    }
}

impl fmt::Display for FullId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for FullId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl std::ops::Deref for FullId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for FullId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for FullId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for FullId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for FullId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl From<FullId> for String {
    fn from(f: FullId) -> String {
        f.0
    }
}

impl std::str::FromStr for FullId {
    type Err = BadFullId;
    fn from_str(s: &str) -> Result<FullId, BadFullId> {
        FullId::parse(s).ok_or_else(|| BadFullId(s.to_owned()))
    }
}

impl serde::Serialize for FullId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for FullId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FullId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Text that is not a full id (see [`FullId::parse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadFullId(pub String);

impl fmt::Display for BadFullId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not a full id (smith-root, smith-root/smith-001, …)",
            self.0
        )
    }
}

impl std::error::Error for BadFullId {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_names_table() {
        let cases: &[(&[u8], Option<u32>)] = &[
            (b"smith-001", Some(1)),
            (b"smith-042", Some(42)),
            (b"smith-999", Some(999)),
            (b"smith-1000", Some(1000)),
            (b"smith-0042", Some(42)),
            (b"smith-4294967295", Some(u32::MAX)),
            (b"smith-4294967296", None),
            (b"smith-99999999999999999999", None),
            (b"smith-000", Some(0)),
            (b"smith-0000", Some(0)),
            (b"smith-01", None),
            (b"smith-1", None),
            (b"smith-", None),
            (b"smith-+01", None),
            (b"smith--01", None),
            (b"smith-+001", None),
            (b"smith-001 ", None),
            (b" smith-001", None),
            (b"smith-00a", None),
            (b"Smith-001", None),
            (b"smith_001", None),
            (b"smith-root", None),
            (b"smith-\xd9\xa1\xd9\xa2\xd9\xa3", None), // Arabic-Indic digits
            (b"smith-\xff01", None),
            (b"", None),
        ];
        for (name, want) in cases {
            assert_eq!(parse_child_name(OsStr::from_bytes(name)), *want, "{name:?}");
        }
        assert!(is_numbered_name(OsStr::new("smith-99999999999999999999")));
        assert!(!is_numbered_name(OsStr::new("smith-01")));
        assert_eq!(child_name(1), "smith-001");
        assert_eq!(child_name(42), "smith-042");
        assert_eq!(child_name(1000), "smith-1000");
        assert_eq!(child_name(0), "smith-000");
    }

    #[test]
    fn full_ids_table() {
        let cases: &[(&str, Option<u8>)] = &[
            ("smith-root", Some(0)),
            ("smith-root/smith-001", Some(1)),
            ("smith-root/smith-001/smith-0042/smith-007", Some(3)),
            ("smith-root/", None),
            ("smith-root//smith-001", None),
            ("/smith-root", None),
            ("smith-001", None),
            ("smith-root/smith-01", None),
            ("smith-root/smith-root", None),
            ("smith-root/smith-001/", None),
            ("smith-rootx", None),
            ("", None),
        ];
        for (s, level) in cases {
            assert_eq!(FullId::parse(s).map(|f| f.level()), *level, "{s}");
        }
        let f = FullId::parse("smith-root/smith-001/smith-002").unwrap();
        assert_eq!(f.short(), "smith-002");
        assert_eq!(f.parent().unwrap(), "smith-root/smith-001");
        assert_eq!(FullId::root().parent(), None);
        assert_eq!(FullId::root().short(), "smith-root");
        assert_eq!(
            f.smith_path(),
            "smiths/smith-root/children/smith-001/children/smith-002"
        );
        assert_eq!(
            FullId::root().smith_dir_rel(),
            PathBuf::from("smiths/smith-root")
        );
        assert!(FullId::root().is_ancestor_of(&f));
        assert!(!f.is_ancestor_of(&f));
        let s1 = FullId::parse("smith-root/smith-001").unwrap();
        let s10 = FullId::parse("smith-root/smith-0010").unwrap();
        assert!(!s1.is_ancestor_of(&s10));
        assert_eq!(
            s1.child("smith-003").unwrap(),
            "smith-root/smith-001/smith-003"
        );
        assert_eq!(s1.child("x"), None);
        assert_eq!(
            serde_json::to_string(&s1).unwrap(),
            "\"smith-root/smith-001\""
        );
        assert!(serde_json::from_str::<FullId>("\"smith-001\"").is_err());
        assert_eq!(format!("{s1}"), "smith-root/smith-001");
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn child_name_round_trips(n in 0u32..) {
                prop_assert_eq!(parse_child_name(OsStr::new(&child_name(n))), Some(n));
            }

            #[test]
            fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
                let mut name = b"smith-".to_vec();
                name.extend_from_slice(&bytes);
                let _ = parse_child_name(OsStr::from_bytes(&name));
                let _ = parse_child_name(OsStr::from_bytes(&bytes));
            }
        }
    }
}
