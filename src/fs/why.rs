//! Denial records: the last [`HISTORY`] denials per identity, for `.smithfs/why` (docs/SPEC.md
//! §7). Per identity, not per process: a denial in one process is explained to the next `cat`.
//! Shown most recent first, except that within one second denials of writes and creates come
//! before denials of reads and listings, so an agent's own failed write is not hidden by the
//! directory scans its CLI makes right after it.

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;

use crate::identity::Identity;

/// One recorded denial (docs/SPEC.md §3: identity, pid, operation, path, rule, alternative).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenialRecord {
    /// The denied identity's full id, `operator` or `unknown`.
    pub who: String,
    /// The smith, if the identity was one.
    pub smith: Option<crate::tree::model::SmithIdx>,
    /// The calling thread.
    pub pid: u32,
    /// The caller's uid.
    pub uid: u32,
    /// RFC 3339 time.
    pub time: String,
    /// The operation (`open for writing`, `unlink`, `mkdir` …).
    pub op: String,
    /// Mount-relative path of the object.
    pub path: String,
    /// The errno returned.
    pub errno: i32,
    /// The rule id.
    pub rule: String,
    /// One sentence: what was refused and who may.
    pub why: String,
    /// What the caller may do instead.
    pub alternative: String,
}

impl DenialRecord {
    /// One record of `.smithfs/why`: the explanation in one sentence first, then key: value
    /// lines. `errno: none` for a record that refused nothing (a task name kept as data).
    pub fn render(&self) -> String {
        let errno = match self.errno {
            0 => "none".to_string(),
            e => format!("{:?}", nix::errno::Errno::from_raw(e)),
        };
        format!(
            "{} {}\nidentity: {}\npid: {}\ntime: {}\noperation: {}\npath: {}\nerrno: {}\nrule: {}\nalternative: {}\n",
            self.why, self.alternative, self.who, self.pid, self.time, self.op, self.path, errno,
            self.rule, self.alternative
        )
    }

    /// Is this the denial of a read or a listing (as opposed to a write, a create, a delete…)?
    pub fn is_read(&self) -> bool {
        matches!(
            self.op.as_str(),
            "open for reading" | "list" | "readdir" | "getxattr" | "listxattr" | "readlink"
        )
    }

    /// The second of `time` (`2026-01-01T00:00:05.123456Z` → `2026-01-01T00:00:05`).
    fn second(&self) -> &str {
        self.time.split('.').next().unwrap_or(&self.time)
    }
}

/// Key of a denial record: the smith, or for the operator the calling uid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Smith(crate::tree::model::SmithIdx),
    Operator(u32),
    Unknown,
}

fn key(who: Identity, uid: u32) -> Key {
    match who {
        Identity::Smith(s) => Key::Smith(s),
        Identity::Operator => Key::Operator(uid),
        Identity::Unknown => Key::Unknown,
    }
}

/// Denials kept per identity (docs/SPEC.md §7).
pub const HISTORY: usize = 10;

/// The last [`HISTORY`] denials of each identity, oldest first.
#[derive(Debug, Default)]
pub struct WhyStore {
    map: Mutex<HashMap<Key, VecDeque<DenialRecord>>>,
}

impl WhyStore {
    /// Remember `rec` as the latest denial of `who`, forgetting the oldest beyond [`HISTORY`].
    pub fn record(&self, who: Identity, rec: DenialRecord) {
        let mut map = self.map.lock();
        let q = map.entry(key(who, rec.uid)).or_default();
        if q.len() == HISTORY {
            q.pop_front();
        }
        q.push_back(rec);
    }

    /// The recent denials of `who` (calling uid `uid`) in `why`'s order: most recent first,
    /// and within one second writes, creates and deletes before reads and listings.
    pub fn recent(&self, who: Identity, uid: u32) -> Vec<DenialRecord> {
        let mut v: Vec<DenialRecord> = self
            .map
            .lock()
            .get(&key(who, uid))
            .map(|q| q.iter().rev().cloned().collect())
            .unwrap_or_default();
        // Stable: records of one second and class keep their most-recent-first order.
        v.sort_by(|a, b| {
            b.second()
                .cmp(a.second())
                .then(a.is_read().cmp(&b.is_read()))
        });
        v
    }

    /// `.smithfs/why` for `who`: its recent denials rendered, separated by a blank line; `None`
    /// if there are none.
    pub fn render(&self, who: Identity, uid: u32) -> Option<String> {
        let recs = self.recent(who, uid);
        (!recs.is_empty()).then(|| {
            recs.iter()
                .map(DenialRecord::render)
                .collect::<Vec<_>>()
                .join("\n")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(op: &str, time: &str, path: &str) -> DenialRecord {
        DenialRecord {
            who: "smith-root".into(),
            smith: Some(crate::tree::model::SmithIdx(0)),
            pid: 1,
            uid: 0,
            time: time.into(),
            op: op.into(),
            path: path.into(),
            errno: libc::EACCES,
            rule: "r".into(),
            why: "w".into(),
            alternative: "a".into(),
        }
    }

    #[test]
    fn history_of_ten_writes_before_reads_of_the_same_second() {
        let w = WhyStore::default();
        let who = Identity::Smith(crate::tree::model::SmithIdx(0));
        for i in 0..12 {
            w.record(
                who,
                rec(
                    "open for reading",
                    &format!("2026-01-01T00:00:0{}.5Z", i / 10),
                    &format!("old{i}"),
                ),
            );
        }
        assert_eq!(w.recent(who, 0).len(), HISTORY);
        // The failed write, then the CLI's listings in the same second.
        w.record(
            who,
            rec(
                "open for writing",
                "2026-01-01T00:00:05.100000Z",
                "the-write",
            ),
        );
        w.record(who, rec("list", "2026-01-01T00:00:05.200000Z", "scan1"));
        w.record(who, rec("list", "2026-01-01T00:00:05.300000Z", "scan2"));
        let got: Vec<String> = w.recent(who, 0).into_iter().map(|r| r.path).collect();
        assert_eq!(&got[..3], ["the-write", "scan2", "scan1"]);
        assert_eq!(got.len(), HISTORY);
        // A later second comes first, whatever its class.
        w.record(who, rec("list", "2026-01-01T00:00:06.000000Z", "later"));
        assert_eq!(w.recent(who, 0)[0].path, "later");
        let text = w.render(who, 0).unwrap_or_default();
        assert_eq!(text.matches("identity: smith-root").count(), HISTORY);
        assert!(w.render(Identity::Operator, 0).is_none());
    }
}
