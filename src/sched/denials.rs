//! The rate limit of `access.denied` (docs/SPEC.md §7): per identity, at most [`FULL_PER_SECOND`]
//! denials a second are journaled in full (and fire their hooks); the rest of that second are
//! counted and journaled as one `access.denied.suppressed` line with `count`, once the second is
//! over. One smith retrying a forbidden open in a loop then writes at most 21 lines a second.
//!
//! Pure bookkeeping with the second passed in, so it is tested without a clock; the scheduler
//! calls [`DenialLimiter::admit`] on the filesystem's thread (before the bounded trigger queue,
//! which a storm would otherwise fill) and [`DenialLimiter::flush`] on its own tick.

use std::collections::HashMap;

use crate::tree::model::SmithIdx;
pub use crate::trigger::Suppressed;

/// Denials a second per identity journaled in full.
pub const FULL_PER_SECOND: u32 = 20;

/// One identity's current second.
#[derive(Debug)]
struct Window {
    second: u64,
    full: u32,
    suppressed: u64,
}

/// Per identity key, the denials of its current second.
#[derive(Debug)]
pub struct DenialLimiter {
    windows: HashMap<Option<SmithIdx>, Window>,
    /// Journaled in full per identity and second.
    per_second: u32,
}

impl Default for DenialLimiter {
    /// [`FULL_PER_SECOND`] in full.
    fn default() -> Self {
        DenialLimiter::allowing(FULL_PER_SECOND)
    }
}

impl DenialLimiter {
    /// A limiter that admits `per_second` events in full per identity and second (the same
    /// limit for other events than denials: `result.published`, notes H24).
    pub fn allowing(per_second: u32) -> Self {
        DenialLimiter {
            windows: HashMap::new(),
            per_second,
        }
    }

    /// Account one denial of the smith `smith` (`None`: the operator or Unknown, which share one
    /// allowance as they share `"smith": null` in the journal) in Unix second `second`.
    /// Returns whether to journal it in full, and the previous second's suppressed count of
    /// that identity when this denial is the first of a new second.
    pub fn admit(&mut self, smith: Option<SmithIdx>, second: u64) -> (bool, Option<Suppressed>) {
        let w = self.windows.entry(smith).or_insert(Window {
            second,
            full: 0,
            suppressed: 0,
        });
        let mut done = None;
        if w.second != second {
            if w.suppressed > 0 {
                done = Some(Suppressed {
                    smith,
                    second: w.second,
                    count: w.suppressed,
                });
            }
            *w = Window {
                second,
                full: 0,
                suppressed: 0,
            };
        }
        if w.full < self.per_second {
            w.full += 1;
            (true, done)
        } else {
            w.suppressed += 1;
            (false, done)
        }
    }

    /// The suppressed counts of every second before `now` not reported yet; forgets windows
    /// older than that, so memory stays bounded by the identities denied in the last second.
    pub fn flush(&mut self, now: u64) -> Vec<Suppressed> {
        let mut out = Vec::new();
        self.windows.retain(|smith, w| {
            if w.second >= now {
                return true;
            }
            if w.suppressed > 0 {
                out.push(Suppressed {
                    smith: *smith,
                    second: w.second,
                    count: w.suppressed,
                });
            }
            false
        });
        out.sort_by_key(|d| (d.second, d.smith.map(|s| s.0)));
        out
    }

    /// Is a suppressed count waiting for its second to end?
    pub fn pending(&self) -> bool {
        self.windows.values().any(|w| w.suppressed > 0)
    }
}

/// The current Unix second.
pub fn now_second() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twenty_in_full_then_one_count_per_identity_and_second() {
        let mut l = DenialLimiter::default();
        let a = Some(SmithIdx(1));
        let mut full = 0;
        for _ in 0..100 {
            let (admit, done) = l.admit(a, 10);
            assert_eq!(done, None);
            full += usize::from(admit);
        }
        assert_eq!(full, FULL_PER_SECOND as usize);
        // Another identity in the same second has its own allowance.
        assert!(l.admit(None, 10).0);
        assert!(l.pending());
        // The first denial of the next second reports the last one's count.
        let (admit, done) = l.admit(a, 11);
        assert!(admit);
        assert_eq!(
            done,
            Some(Suppressed {
                smith: a,
                second: 10,
                count: 80
            })
        );
        for _ in 0..30 {
            l.admit(a, 11);
        }
        // Flushing in second 11 reports nothing of second 11 yet; in 12 it does, once.
        assert_eq!(l.flush(11), vec![]);
        let got = l.flush(12);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].second, got[0].count), (11, 11));
        assert_eq!(l.flush(13), vec![]);
        assert!(!l.pending());
        assert!(l.windows.is_empty());
    }
}
