//! Denial records: the most recent denial per identity, for `.smithfs/why` (PROTOCOL.md §7).
//! Per identity, not per process: a denial in one process is explained to the next `cat`.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::identity::Identity;

/// One recorded denial (PROTOCOL.md §3: identity, pid, operation, path, rule, alternative).
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
    /// The text of `.smithfs/why`: the explanation in one sentence first, then key: value lines.
    pub fn render(&self) -> String {
        let errno = nix::errno::Errno::from_raw(self.errno);
        format!(
            "{} {}\nidentity: {}\npid: {}\ntime: {}\noperation: {}\npath: {}\nerrno: {:?}\nrule: {}\nalternative: {}\n",
            self.why, self.alternative, self.who, self.pid, self.time, self.op, self.path, errno,
            self.rule, self.alternative
        )
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

/// The most recent denial of each identity.
#[derive(Debug, Default)]
pub struct WhyStore {
    map: Mutex<HashMap<Key, DenialRecord>>,
}

impl WhyStore {
    /// Remember `rec` as the latest denial of `who`.
    pub fn record(&self, who: Identity, rec: DenialRecord) {
        self.map.lock().insert(key(who, rec.uid), rec);
    }

    /// The latest denial of `who` (calling uid `uid`).
    pub fn latest(&self, who: Identity, uid: u32) -> Option<DenialRecord> {
        self.map.lock().get(&key(who, uid)).cloned()
    }
}
