//! How long an upstream asks to be left alone: `Retry-After` (delta-seconds or an
//! IMF-fixdate HTTP-date, RFC 9110 §10.2.3) and the managed APIs' `x-ratelimit-reset-*`
//! durations ("6m0s", "1s", "20ms", "1h2m3.5s").
//!
//! Pure parsing: the caller gives the current wall-clock time for dates. It must not cap
//! the result (the gateway's configuration does).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A `Retry-After` value as a wait from `now`: delta-seconds, or an HTTP-date (a date
/// already past is a zero wait). `None` when it is neither.
pub fn retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let v = std::str::from_utf8(value).ok()?.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return v.parse().ok().map(Duration::from_secs);
    }
    let at = http_date(v)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Seconds to put in a `Retry-After` header for a wait: rounded up, so a client never
/// comes back early.
pub fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// An `x-ratelimit-reset-requests` / `-tokens` value: a sequence of number-and-unit pairs
/// (`h`, `m`, `s`, `ms`, `us`, `µs`, `ns`; decimals allowed), or a bare number of seconds.
pub fn reset_duration(value: &[u8]) -> Option<Duration> {
    let v = std::str::from_utf8(value).ok()?.trim();
    if v.is_empty() {
        return None;
    }
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let mut total = 0f64;
    let mut rest = v;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += n * scale;
    }
    (total.is_finite() && total >= 0.0).then(|| Duration::from_secs_f64(total))
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn http_date(v: &str) -> Option<SystemTime> {
    let mut parts = v.split_ascii_whitespace();
    let _weekday = parts.next()?.strip_suffix(',')?;
    let day: u32 = parts.next()?.parse().ok()?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month_name = parts.next()?;
    let month = MONTHS.iter().position(|m| *m == month_name)? as u32 + 1;
    let year: i64 = parts.next()?.parse().ok()?;
    let mut hms = parts.next()?.split(':');
    let (h, m, s): (u64, u64, u64) = (
        hms.next()?.parse().ok()?,
        hms.next()?.parse().ok()?,
        hms.next()?.parse().ok()?,
    );
    if parts.next()? != "GMT" || parts.next().is_some() || hms.next().is_some() {
        return None;
    }
    if !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 || year < 1970 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = u64::try_from(days).ok()? * 86_400 + h * 3600 + m * 60 + s;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_seconds_and_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_770); // Sun, 06 Nov 1994 08:49:30 GMT
        assert_eq!(retry_after(b"7", now), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(b" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            retry_after(b"Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(b"Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past"
        );
        assert_eq!(
            retry_after(b"Thu, 01 Jan 1970 00:00:00 GMT", UNIX_EPOCH),
            Some(Duration::ZERO)
        );
        assert_eq!(
            retry_after(b"Tue, 29 Feb 2000 00:00:01 GMT", UNIX_EPOCH),
            Some(Duration::from_secs(951_782_401))
        );
        for bad in [
            &b""[..],
            b"-1",
            b"1.5",
            b"soon",
            b"Sun, 06 Nov 1994 08:49:37 PST",
        ] {
            assert_eq!(
                retry_after(bad, now),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn reset_durations() {
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(reset_duration(b"6m0s"), ms(360_000));
        assert_eq!(reset_duration(b"1s"), ms(1000));
        assert_eq!(reset_duration(b"20ms"), ms(20));
        assert_eq!(reset_duration(b"1h2m3.5s"), ms(3_723_500));
        assert_eq!(reset_duration(b"2"), ms(2000));
        assert_eq!(reset_duration(b"0.5"), ms(500));
        for bad in [&b""[..], b"5x", b"s", b"-1s", b"1d"] {
            assert_eq!(
                reset_duration(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn whole_seconds_round_up() {
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
        assert_eq!(whole_seconds(Duration::ZERO), 0);
    }
}
