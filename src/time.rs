//! Timestamps of the journal, `meta.json` and `status.json`: RFC 3339 UTC with microseconds
//! (`2026-11-30T07:31:13.123456Z`), so run starts and ends can be ordered within a second;
//! seconds only ([`rfc3339`]) for denials and `meta.json`'s creation time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Format `t` as RFC 3339 UTC with microseconds.
pub fn format(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let base = rfc3339(d.as_secs() as i64);
    // `base` ends in `Z`; put the fraction before it.
    let stem = base.strip_suffix('Z').unwrap_or(&base);
    format!("{stem}.{:06}Z", d.subsec_micros())
}

/// The current time, formatted by [`format()`].
pub fn now() -> String {
    format(SystemTime::now())
}

/// Parse `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+00:00)` (what [`format()`] and
/// [`rfc3339`] write). Other offsets are refused: smithfs writes UTC only.
pub fn parse(s: &str) -> Option<SystemTime> {
    let s = s.strip_suffix('Z').or_else(|| s.strip_suffix("+00:00"))?;
    let (date, clock) = s.split_once('T')?;
    let mut d = date.splitn(3, '-');
    let y: i64 = d.next()?.parse().ok()?;
    let m: i64 = d.next()?.parse().ok()?;
    let day: i64 = d.next()?.parse().ok()?;
    let (hms, frac) = match clock.split_once('.') {
        Some((a, b)) => (a, b),
        None => (clock, ""),
    };
    let mut c = hms.splitn(3, ':');
    let hh: i64 = c.next()?.parse().ok()?;
    let mm: i64 = c.next()?.parse().ok()?;
    let ss: i64 = c.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        if !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
        digits.parse().ok()?
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// `st_mtime` of a `stat` as a `SystemTime`.
pub fn mtime(st: &libc::stat) -> SystemTime {
    let secs = u64::try_from(st.st_mtime).unwrap_or(0);
    let nanos = u32::try_from(st.st_mtime_nsec).unwrap_or(0);
    UNIX_EPOCH + Duration::new(secs, nanos)
}

/// The current time as RFC 3339 UTC with seconds (`2026-11-30T07:31:13Z`).
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    rfc3339(secs)
}

/// Format seconds since the epoch as RFC 3339 UTC.
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for secs in [0u64, 951_782_400, 1_795_930_273] {
            for micros in [0u32, 1, 999_999] {
                let t = UNIX_EPOCH + Duration::new(secs, micros * 1000);
                assert_eq!(parse(&format(t)), Some(t), "{}", format(t));
            }
        }
        assert_eq!(
            parse("2026-11-29T05:31:13Z"),
            Some(UNIX_EPOCH + Duration::from_secs(1_795_930_273))
        );
        assert_eq!(parse("2026-11-30 07:31:13Z"), None);
        assert_eq!(parse("2026-13-30T07:31:13Z"), None);
        assert_eq!(parse("2026-11-30T07:31:13.1x2Z"), None);
    }
}

#[cfg(test)]
mod rfc3339_tests {
    use super::rfc3339;

    #[test]
    fn formats_rfc3339() {
        for (secs, want) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_795_930_273, "2026-11-29T05:31:13Z"),
        ] {
            assert_eq!(rfc3339(secs), want);
        }
    }
}
