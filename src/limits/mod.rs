//! Resource limits (docs/SPEC.md §5 "Resource limits", §8 `limits`): the value types of
//! `config.json` (sizes with a `K`/`M`/`G` suffix, `cpu_max` as cgroup v2 writes it) and the
//! cgroup backends that enforce `limits.per_smith` and `limits.per_subtree` ([`cgroup`]).
//!
//! The model, on every backend: each smith's cgroup is an inner node that carries the
//! *subtree* limits and never holds processes; its leaf `self/` holds the smith's own processes
//! and carries the *per-smith* limits; the children's nodes nest below the smith's node. The
//! kernel's hierarchical accounting then makes a subtree's limit bound everything below it,
//! whatever the children's own limits say (docs/PROTOCOL-NOTES.md, L1–L4).

pub mod cgroup;
pub mod live;
pub mod storage;

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes: a JSON integer, or a string of digits with an optional `K`, `M` or `G`
/// suffix (powers of 1024, as cgroup v2's `memory.max` reads them; `k`/`m`/`g` too, and an
/// optional trailing `B`/`iB`). docs/SPEC.md §8: "Sizes are bytes or strings with a K/M/G suffix".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Size(pub u64);

impl Size {
    /// The number of bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for Size {
    type Err = String;

    /// `"512"`, `"64K"`, `"100M"`, `"2G"`, `"1GiB"`. Errors: one sentence for the config message.
    fn from_str(s: &str) -> Result<Size, String> {
        let t = s.trim();
        let bad = || format!("{s:?} is not a size (bytes, or digits with a K, M or G suffix)");
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, suffix) = t.split_at(split);
        if digits.is_empty() {
            return Err(bad());
        }
        let n: u64 = digits.parse().map_err(|_| bad())?;
        let shift = match suffix.to_ascii_uppercase().as_str() {
            "" | "B" => 0,
            "K" | "KB" | "KIB" => 10,
            "M" | "MB" | "MIB" => 20,
            "G" | "GB" | "GIB" => 30,
            _ => return Err(bad()),
        };
        n.checked_mul(1u64 << shift)
            .map(Size)
            .ok_or_else(|| format!("{s:?} is too large"))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
            if n != 0 && n % (1u64 << shift) == 0 {
                return write!(f, "{}{unit}", n >> shift);
            }
        }
        write!(f, "{n}")
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes, or a string with a K, M or G suffix")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Size, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// `cpu_max` as cgroup v2's `cpu.max` writes it: `"QUOTA PERIOD"` in microseconds
/// (`"50000 100000"` = half a CPU), `"QUOTA"` (period 100000) or `"max"`/`"max PERIOD"` (no
/// limit). Quota and period are at least 1000 µs, the period at most 1 000 000 µs (the kernel's
/// bounds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuMax {
    /// Microseconds of CPU time per period; `None` = `max`.
    pub quota_us: Option<u64>,
    /// The period, microseconds.
    pub period_us: u64,
}

impl CpuMax {
    /// The default period of cgroup v2 and v1 (100 ms).
    pub const DEFAULT_PERIOD_US: u64 = 100_000;

    /// The text for cgroup v2's `cpu.max`: `"50000 100000"`, `"max 100000"`.
    pub fn v2_text(self) -> String {
        match self.quota_us {
            Some(q) => format!("{q} {}", self.period_us),
            None => format!("max {}", self.period_us),
        }
    }

    /// CPUs' worth of time this allows (`None`: unlimited), e.g. 0.5.
    pub fn cpus(self) -> Option<f64> {
        #[allow(clippy::cast_precision_loss)]
        self.quota_us.map(|q| q as f64 / self.period_us as f64)
    }
}

impl FromStr for CpuMax {
    type Err = String;

    fn from_str(s: &str) -> Result<CpuMax, String> {
        let bad = || {
            format!("{s:?} is not a cpu.max value (\"QUOTA PERIOD\" in microseconds, e.g. \"50000 100000\", or \"max\")")
        };
        let mut parts = s.split_whitespace();
        let quota = parts.next().ok_or_else(bad)?;
        let period = match parts.next() {
            Some(p) => p.parse::<u64>().map_err(|_| bad())?,
            None => CpuMax::DEFAULT_PERIOD_US,
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        let quota_us = match quota {
            "max" => None,
            q => Some(q.parse::<u64>().map_err(|_| bad())?),
        };
        if !(1000..=1_000_000).contains(&period) {
            return Err(format!(
                "{s:?}: the period must be 1000 to 1000000 microseconds"
            ));
        }
        if quota_us.is_some_and(|q| q < 1000) {
            return Err(format!(
                "{s:?}: the quota must be at least 1000 microseconds"
            ));
        }
        Ok(CpuMax {
            quota_us,
            period_us: period,
        })
    }
}

impl fmt::Display for CpuMax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.v2_text())
    }
}

impl Serialize for CpuMax {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.v2_text())
    }
}

impl<'de> Deserialize<'de> for CpuMax {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CpuMax, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = CpuMax;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string \"QUOTA PERIOD\" in microseconds, or \"max\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<CpuMax, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// `limits.per_smith` / `limits.per_subtree` (docs/SPEC.md §5, §8): `null` (or absent) = no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CgroupLimits {
    /// Memory (bytes): `memory.max` (v2) / `memory.limit_in_bytes` (v1); beyond it the OOM
    /// killer picks a process of the cgroup's subtree. At least 1 MiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<Size>,
    /// Processes and threads: `pids.max`; a fork beyond it fails with `EAGAIN`. At least 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
    /// CPU bandwidth: `cpu.max` (v2) / `cpu.cfs_quota_us` + `cpu.cfs_period_us` (v1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_max: Option<CpuMax>,
}

/// The smallest `memory_max` accepted (a smaller one could not even exec a shell).
pub const MIN_MEMORY_MAX: u64 = 1 << 20;

/// A cgroup controller a limit needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Controller {
    /// `memory_max`.
    Memory,
    /// `pids_max`.
    Pids,
    /// `cpu_max`.
    Cpu,
}

impl Controller {
    /// The controller's kernel name (`memory`, `pids`, `cpu`).
    pub fn as_str(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
        }
    }

    /// All three, in a fixed order.
    pub const ALL: [Controller; 3] = [Controller::Memory, Controller::Pids, Controller::Cpu];
}

impl CgroupLimits {
    /// True if no limit is set.
    pub fn is_empty(&self) -> bool {
        self.memory_max.is_none() && self.pids_max.is_none() && self.cpu_max.is_none()
    }

    /// The controllers these limits need, with the first key (`memory_max` …) that needs each.
    pub fn controllers(&self) -> Vec<Controller> {
        let mut out = Vec::new();
        if self.memory_max.is_some() {
            out.push(Controller::Memory);
        }
        if self.pids_max.is_some() {
            out.push(Controller::Pids);
        }
        if self.cpu_max.is_some_and(|c| c.quota_us.is_some()) {
            out.push(Controller::Cpu);
        }
        out
    }

    /// Checks the values; `path` is `limits.per_smith` or `limits.per_subtree`. Errors: the key
    /// path and what is wrong, e.g. `("limits.per_smith.pids_max", "must be at least 1")`.
    pub fn validate(&self, path: &str) -> Result<(), (String, String)> {
        if let Some(m) = self.memory_max {
            if m.0 < MIN_MEMORY_MAX {
                return Err((
                    format!("{path}.memory_max"),
                    format!("{m} is below the smallest memory limit, 1M"),
                ));
            }
        }
        if self.pids_max == Some(0) {
            return Err((format!("{path}.pids_max"), "must be at least 1".into()));
        }
        Ok(())
    }

    /// These limits, each no higher than `outer`'s (the limits of an enclosing cgroup): a
    /// cgroup can never use more than its ancestors allow, so a higher value is clamped (the
    /// kernel would bound it anyway; clamping makes the files say so). Returns the clamped
    /// limits and the keys that were clamped (`memory_max` …).
    pub fn clamped_to(&self, outer: &CgroupLimits) -> (CgroupLimits, Vec<&'static str>) {
        let mut out = *self;
        let mut clamped = Vec::new();
        if let (Some(a), Some(b)) = (self.memory_max, outer.memory_max) {
            if a > b {
                out.memory_max = Some(b);
                clamped.push("memory_max");
            }
        }
        if let (Some(a), Some(b)) = (self.pids_max, outer.pids_max) {
            if a > b {
                out.pids_max = Some(b);
                clamped.push("pids_max");
            }
        }
        if let (Some(a), Some(b)) = (self.cpu_max, outer.cpu_max) {
            let over = match (a.cpus(), b.cpus()) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(x), Some(y)) => x > y,
            };
            if over {
                out.cpu_max = Some(b);
                clamped.push("cpu_max");
            }
        }
        (out, clamped)
    }
}

/// `limits.per_smith` and `limits.per_subtree` together: what the cgroup backends enforce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CgroupPlan {
    /// On each smith's `self/` leaf (already clamped to `per_subtree`).
    pub per_smith: CgroupLimits,
    /// On each smith's node.
    pub per_subtree: CgroupLimits,
}

impl CgroupPlan {
    /// The plan of `per_smith` and `per_subtree` (the per-smith limits clamped to the subtree's:
    /// the leaf is inside the node). Returns the keys of `per_smith` that were clamped.
    pub fn new(
        per_smith: CgroupLimits,
        per_subtree: CgroupLimits,
    ) -> (CgroupPlan, Vec<&'static str>) {
        let (own, clamped) = per_smith.clamped_to(&per_subtree);
        (
            CgroupPlan {
                per_smith: own,
                per_subtree,
            },
            clamped,
        )
    }

    /// True if no cgroup limit is configured.
    pub fn is_empty(&self) -> bool {
        self.per_smith.is_empty() && self.per_subtree.is_empty()
    }

    /// Every controller either level needs, sorted, without repeats.
    pub fn controllers(&self) -> Vec<Controller> {
        let mut c = self.per_smith.controllers();
        c.extend(self.per_subtree.controllers());
        c.sort();
        c.dedup();
        c
    }

    /// The first configured key that needs `c`, for messages (`limits.per_subtree.memory_max`).
    pub fn key_needing(&self, c: Controller) -> String {
        let key = match c {
            Controller::Memory => "memory_max",
            Controller::Pids => "pids_max",
            Controller::Cpu => "cpu_max",
        };
        let level = if self.per_smith.controllers().contains(&c) {
            "per_smith"
        } else {
            "per_subtree"
        };
        format!("limits.{level}.{key}")
    }

    /// The first configured key at all, for messages (`limits.per_smith.pids_max`).
    pub fn first_key(&self) -> Option<String> {
        self.controllers().first().map(|c| self.key_needing(*c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        for (text, want) in [
            ("0", Ok(0)),
            ("512", Ok(512)),
            ("64K", Ok(64 << 10)),
            ("64k", Ok(64 << 10)),
            ("100M", Ok(100 << 20)),
            ("2G", Ok(2 << 30)),
            ("1GiB", Ok(1 << 30)),
            (" 3 M", Err(())),
            ("3 M", Err(())),
            ("", Err(())),
            ("M", Err(())),
            ("-1", Err(())),
            ("1.5G", Err(())),
            ("12X", Err(())),
            ("1T", Err(())),
            ("99999999999999999999", Err(())),
            ("17179869184G", Err(())),
        ] {
            let got = text.parse::<Size>().map(Size::bytes).map_err(|_| ());
            assert_eq!(got, want, "{text:?}");
        }
        assert_eq!(Size(64 << 20).to_string(), "64M");
        assert_eq!(Size(1000).to_string(), "1000");
        assert_eq!(Size(0).to_string(), "0");
    }

    #[test]
    fn cpu_max_values() {
        let ok = |q: Option<u64>, p: u64| {
            Ok(CpuMax {
                quota_us: q,
                period_us: p,
            })
        };
        for (text, want) in [
            ("50000 100000", ok(Some(50_000), 100_000)),
            ("50000", ok(Some(50_000), 100_000)),
            ("max", ok(None, 100_000)),
            ("max 20000", ok(None, 20_000)),
            ("200000 100000", ok(Some(200_000), 100_000)),
            ("999 100000", Err(())),
            ("5000 999", Err(())),
            ("5000 2000000", Err(())),
            ("half", Err(())),
            ("", Err(())),
            ("1 2 3", Err(())),
            ("-5 100000", Err(())),
        ] {
            let got = text.parse::<CpuMax>().map_err(|_| ());
            assert_eq!(got, want, "{text:?}");
        }
        let c: CpuMax = "50000 100000".parse().expect("cpu");
        assert_eq!(c.cpus(), Some(0.5));
        assert_eq!(c.v2_text(), "50000 100000");
    }

    fn lim(m: Option<u64>, p: Option<u64>, c: Option<&str>) -> CgroupLimits {
        CgroupLimits {
            memory_max: m.map(Size),
            pids_max: p,
            cpu_max: c.map(|c| c.parse().expect("cpu")),
        }
    }

    #[test]
    fn clamping_to_the_enclosing_limits() {
        let rows = [
            (
                lim(None, None, None),
                lim(Some(1 << 30), None, None),
                lim(None, None, None),
                vec![],
            ),
            (
                lim(Some(2 << 30), Some(10), Some("50000 100000")),
                lim(Some(1 << 30), Some(20), Some("25000 100000")),
                lim(Some(1 << 30), Some(10), Some("25000 100000")),
                vec!["memory_max", "cpu_max"],
            ),
            (
                lim(None, Some(100), Some("max")),
                lim(None, Some(50), Some("10000 20000")),
                lim(None, Some(50), Some("10000 20000")),
                vec!["pids_max", "cpu_max"],
            ),
            (
                lim(Some(1 << 20), None, Some("10000 20000")),
                lim(Some(1 << 30), None, Some("max")),
                lim(Some(1 << 20), None, Some("10000 20000")),
                vec![],
            ),
        ];
        for (i, (own, outer, want, keys)) in rows.into_iter().enumerate() {
            let (got, clamped) = own.clamped_to(&outer);
            assert_eq!(got, want, "row {i}");
            assert_eq!(clamped, keys, "row {i}");
        }
    }

    #[test]
    fn validation_names_the_key() {
        assert_eq!(
            lim(Some(4096), None, None).validate("limits.per_smith"),
            Err((
                "limits.per_smith.memory_max".into(),
                "4K is below the smallest memory limit, 1M".into()
            ))
        );
        assert_eq!(
            lim(None, Some(0), None).validate("limits.per_subtree"),
            Err((
                "limits.per_subtree.pids_max".into(),
                "must be at least 1".into()
            ))
        );
        assert!(lim(Some(1 << 20), Some(1), Some("max"))
            .validate("x")
            .is_ok());
        let (plan, _) = CgroupPlan::new(lim(None, Some(5), None), lim(Some(1 << 30), None, None));
        assert_eq!(
            plan.controllers(),
            vec![Controller::Memory, Controller::Pids]
        );
        assert_eq!(
            plan.key_needing(Controller::Memory),
            "limits.per_subtree.memory_max"
        );
        assert_eq!(
            plan.key_needing(Controller::Pids),
            "limits.per_smith.pids_max"
        );
        assert!(lim(None, None, Some("max")).controllers().is_empty());
    }
}
