//! The value grammars of rate-limit headers: counts (`-1` = unknown),
//! Go-style durations (`6m0s`, `1.5s`, `20ms`, or bare seconds), and
//! RFC 3339 instants read against an injected wall clock. Every parser
//! returns `Err(Malformed)` instead of panicking, whatever the bytes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A header value that does not follow its grammar (ignored and counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// Longest reset or wait taken from a header: anything above a year is
/// garbage, not a window (the same bound as `backoff`'s Retry-After).
pub(crate) const ABSURD: Duration = Duration::from_secs(365 * 24 * 3600);

const NS_PER_SEC: u128 = 1_000_000_000;

/// A count of requests or tokens. `-1` means "unknown" (Azure OpenAI sends
/// it for limits it does not report) and gives `Ok(None)`; any other
/// negative, a fraction, an overflow or a non-number is malformed.
pub fn count(v: &str) -> Result<Option<u64>, Malformed> {
    let t = v.trim();
    if t == "-1" {
        return Ok(None);
    }
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Malformed);
    }
    t.parse::<u64>().map(Some).map_err(|_| Malformed)
}

/// A non-negative decimal number (`12`, `1.5`, `.5`) in nanoseconds of
/// `unit_ns`, exact to the nanosecond (extra fraction digits are dropped).
fn decimal_ns(t: &[u8], unit_ns: u128) -> Result<u128, Malformed> {
    let (int, frac) = match t.iter().position(|&b| b == b'.') {
        Some(p) => (&t[..p], &t[p + 1..]),
        None => (t, &t[t.len()..]),
    };
    if int.is_empty() && frac.is_empty() || !int.iter().chain(frac).all(u8::is_ascii_digit) || int.len() > 20 {
        return Err(Malformed);
    }
    let mut whole: u128 = 0;
    for &b in int {
        whole = whole * 10 + u128::from(b - b'0');
    }
    let mut ns = whole.checked_mul(unit_ns).ok_or(Malformed)?;
    let mut scale = unit_ns;
    for &b in frac.iter().take(30) {
        scale /= 10;
        if scale == 0 {
            break;
        }
        ns += u128::from(b - b'0') * scale;
    }
    Ok(ns)
}

fn bounded(ns: u128) -> Result<Duration, Malformed> {
    if ns > ABSURD.as_nanos() {
        return Err(Malformed);
    }
    Ok(Duration::from_nanos(ns as u64))
}

/// A non-negative decimal number of milliseconds (`retry-after-ms`).
pub fn millis(v: &str) -> Result<Duration, Malformed> {
    bounded(decimal_ns(v.trim().as_bytes(), 1_000_000)?)
}

/// A Go-style duration as OpenAI sends in `x-ratelimit-reset-*`: one or more
/// `<decimal><unit>` parts with units `h`, `m`, `s`, `ms`, `us`/`µs`, `ns`
/// (`6m0s`, `1.5s`, `20ms`, `1h2m3.5s`), or a bare decimal number of seconds
/// (Azure sends `55`). Negative, empty, unit-less parts after the first, and
/// values above a year are malformed.
pub fn duration(v: &str) -> Result<Duration, Malformed> {
    let t = v.trim().as_bytes();
    if t.is_empty() {
        return Err(Malformed);
    }
    if t.iter().all(|&b| b.is_ascii_digit() || b == b'.') {
        return bounded(decimal_ns(t, NS_PER_SEC)?);
    }
    let mut total: u128 = 0;
    let mut i = 0;
    while i < t.len() {
        let start = i;
        while i < t.len() && (t[i].is_ascii_digit() || t[i] == b'.') {
            i += 1;
        }
        let num = &t[start..i];
        let ustart = i;
        while i < t.len() && !(t[i].is_ascii_digit() || t[i] == b'.') {
            i += 1;
        }
        let unit_ns: u128 = match &t[ustart..i] {
            b"h" => 3600 * NS_PER_SEC,
            b"m" => 60 * NS_PER_SEC,
            b"s" => NS_PER_SEC,
            b"ms" => 1_000_000,
            // `µs` (micro sign) and `μs` (Greek mu), as Go prints and accepts.
            b"us" | [0xC2, 0xB5, b's'] | [0xCE, 0xBC, b's'] => 1_000,
            b"ns" => 1,
            _ => return Err(Malformed),
        };
        if num.is_empty() {
            return Err(Malformed);
        }
        total = total.checked_add(decimal_ns(num, unit_ns)?).ok_or(Malformed)?;
    }
    bounded(total)
}

/// Time from `wall` until the RFC 3339 instant `v`
/// (`2025-01-01T00:00:30Z`, `2025-01-01T01:00:30.5+01:00`); an instant in the
/// past gives zero. Anthropic sends its `*-reset` values in this form.
pub fn until_instant(v: &str, wall: SystemTime) -> Result<Duration, Malformed> {
    let at_ns = rfc3339_unix_ns(v.trim().as_bytes())?;
    let wall_ns = match wall.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    };
    let d = at_ns - wall_ns;
    if d <= 0 {
        return Ok(Duration::ZERO);
    }
    bounded(d as u128)
}

/// A reset value in whichever form it came: an RFC 3339 instant (it has a
/// `-` after the year) or a duration. Providers are not always consistent
/// across endpoints and proxies, and both forms are unambiguous.
pub fn reset(v: &str, wall: SystemTime) -> Result<Duration, Malformed> {
    let t = v.trim();
    if t.len() >= 10 && t.as_bytes()[4] == b'-' {
        until_instant(t, wall)
    } else {
        duration(t)
    }
}

fn digits(s: &[u8], at: usize, n: usize) -> Result<i64, Malformed> {
    let part = s.get(at..at + n).ok_or(Malformed)?;
    if !part.iter().all(u8::is_ascii_digit) {
        return Err(Malformed);
    }
    Ok(part.iter().fold(0i64, |a, &b| a * 10 + i64::from(b - b'0')))
}

fn expect(s: &[u8], at: usize, what: &[u8]) -> Result<(), Malformed> {
    match s.get(at) {
        Some(b) if what.contains(b) => Ok(()),
        _ => Err(Malformed),
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// `date-time` of RFC 3339 §5.6 as nanoseconds since the Unix epoch. A leap
/// second (`:60`) reads as the last nanosecond of the minute.
fn rfc3339_unix_ns(s: &[u8]) -> Result<i128, Malformed> {
    let y = digits(s, 0, 4)?;
    expect(s, 4, b"-")?;
    let mo = digits(s, 5, 2)?;
    expect(s, 7, b"-")?;
    let d = digits(s, 8, 2)?;
    expect(s, 10, b"Tt ")?;
    let h = digits(s, 11, 2)?;
    expect(s, 13, b":")?;
    let mi = digits(s, 14, 2)?;
    expect(s, 16, b":")?;
    let sec = digits(s, 17, 2)?;
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 60 {
        return Err(Malformed);
    }
    let mut i = 19;
    let mut frac_ns: i128 = 0;
    if s.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        let mut scale = 100_000_000i128;
        while let Some(b) = s.get(i).filter(|b| b.is_ascii_digit()) {
            frac_ns += i128::from(b - b'0') * scale;
            scale /= 10;
            i += 1;
        }
        if i == start {
            return Err(Malformed);
        }
    }
    let offset_s: i64 = match s.get(i) {
        Some(b'Z' | b'z') if i + 1 == s.len() => 0,
        Some(&sign @ (b'+' | b'-')) if i + 6 == s.len() => {
            let oh = digits(s, i + 1, 2)?;
            expect(s, i + 3, b":")?;
            let om = digits(s, i + 4, 2)?;
            if oh > 23 || om > 59 {
                return Err(Malformed);
            }
            let o = oh * 3600 + om * 60;
            if sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return Err(Malformed),
    };
    let (sec, frac_ns) = if sec == 60 { (59, 999_999_999) } else { (sec, frac_ns) };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    Ok(i128::from(secs) * NS_PER_SEC as i128 + frac_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(d: Duration) -> u128 {
        d.as_millis()
    }

    #[test]
    fn counts() {
        assert_eq!(count("60"), Ok(Some(60)));
        assert_eq!(count(" 0 "), Ok(Some(0)));
        assert_eq!(count("-1"), Ok(None), "Azure's unknown");
        assert_eq!(count("18446744073709551615"), Ok(Some(u64::MAX)));
        for bad in [
            "",
            " ",
            "-2",
            "-0",
            "+5",
            "1.5",
            "1e3",
            "18446744073709551616",
            "abc",
            "5 5",
            "٣",
        ] {
            assert_eq!(count(bad), Err(Malformed), "{bad:?}");
        }
    }

    #[test]
    fn go_durations() {
        let table: &[(&str, u128)] = &[
            ("6m0s", 360_000),
            ("1.5s", 1_500),
            ("20ms", 20),
            ("1h2m3.5s", 3_723_500),
            ("0s", 0),
            ("0", 0),
            ("55", 55_000),
            ("2.316s", 2_316),
            ("59.639s", 59_639),
            (".5s", 500),
            ("1.s", 1_000),
            ("1500us", 1),
            ("1500µs", 1),
            ("2000000ns", 2),
            ("1m30s", 90_000),
            ("  7s ", 7_000),
            ("8760h", 31_536_000_000),
        ];
        for (v, want) in table {
            assert_eq!(duration(v).map(ms), Ok(*want), "{v}");
        }
        assert_eq!(duration("1.123456789123s"), Ok(Duration::new(1, 123_456_789)));
        for bad in [
            "",
            "s",
            "-1s",
            "-1",
            "+1s",
            "1d",
            "1 s",
            "1sx",
            "1.2.3s",
            "..",
            "5m5",
            "8761h",
            "1e3s",
            "99999999999999999999999999h",
            "1h-2m",
            "m5",
        ] {
            assert_eq!(duration(bad), Err(Malformed), "{bad:?}");
        }
        assert_eq!(millis("1500"), Ok(Duration::from_millis(1500)));
        assert_eq!(millis("0.5"), Ok(Duration::from_micros(500)));
        assert_eq!(millis("-5"), Err(Malformed));
        assert_eq!(millis("1e3"), Err(Malformed));
    }

    fn wall() -> SystemTime {
        // 2025-01-01T00:00:00Z
        UNIX_EPOCH + Duration::from_secs(1_735_689_600)
    }

    #[test]
    fn rfc3339_instants() {
        let table: &[(&str, u128)] = &[
            ("2025-01-01T00:00:30Z", 30_000),
            ("2025-01-01t00:00:30z", 30_000),
            ("2025-01-01 00:00:30Z", 30_000),
            ("2025-01-01T00:00:01.25Z", 1_250),
            ("2025-01-01T01:00:30+01:00", 30_000),
            ("2024-12-31T23:00:30-01:00", 30_000),
            ("2024-12-31T23:59:59Z", 0),
            ("1970-01-01T00:00:00Z", 0),
            ("2025-03-01T00:00:00Z", 59 * 86_400_000),
            ("2024-12-31T23:59:60Z", 0),
            ("2025-01-01T00:00:00.000000000001Z", 0),
        ];
        for (v, want) in table {
            assert_eq!(until_instant(v, wall()).map(ms), Ok(*want), "{v}");
        }
        assert_eq!(
            until_instant("2025-01-01T00:00:00.5Z", wall()),
            Ok(Duration::from_millis(500))
        );
        // Leap years: 2024-02-29 exists, 2025-02-29 and 2100-02-29 do not.
        assert!(until_instant("2024-02-29T00:00:00Z", wall()).is_ok());
        for bad in [
            "",
            "2025-02-29T00:00:00Z",
            "2100-02-29T00:00:00Z",
            "2025-13-01T00:00:00Z",
            "2025-00-01T00:00:00Z",
            "2025-01-32T00:00:00Z",
            "2025-01-01T24:00:00Z",
            "2025-01-01T00:60:00Z",
            "2025-01-01T00:00:61Z",
            "2025-01-01T00:00:00",
            "2025-01-01T00:00:00.Z",
            "2025-01-01T00:00:00+0100",
            "2025-01-01T00:00:00+24:00",
            "2025-01-01T00:00:00Zjunk",
            "2025-01-01",
            "2027-01-01T00:00:00Z",
            "Wed, 01 Jan 2025 00:00:30 GMT",
            "２０２５-01-01T00:00:00Z",
        ] {
            assert_eq!(until_instant(bad, wall()), Err(Malformed), "{bad:?}");
        }
        // Before the epoch is simply in the past.
        let early = UNIX_EPOCH - Duration::from_secs(10);
        assert_eq!(
            until_instant("1970-01-01T00:00:05Z", early),
            Ok(Duration::from_secs(15))
        );
    }

    #[test]
    fn reset_takes_either_form() {
        assert_eq!(reset("2025-01-01T00:00:30Z", wall()), Ok(Duration::from_secs(30)));
        assert_eq!(reset("30s", wall()), Ok(Duration::from_secs(30)));
        assert_eq!(reset("30", wall()), Ok(Duration::from_secs(30)));
        assert_eq!(reset("2025-01-0", wall()), Err(Malformed));
    }

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2025, 1, 1), 20_089);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
    }
}
