//! CronJob schedules as upstream parses them (robfig/cron v3 `ParseStandard`): five fields
//! (minute hour day-of-month month day-of-week) with lists, ranges, steps, month and weekday
//! names and `?`; the descriptors `@yearly`/`@annually`, `@monthly`, `@weekly`, `@daily`/
//! `@midnight`, `@hourly` and `@every <duration>`; a `TZ=`/`CRON_TZ=` prefix. Pure: the next
//! firing time is computed from a given instant in a given time zone.

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp, ToSpan};

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The `TZ=`/`CRON_TZ=` prefix, if any.
    pub tz: Option<String>,
    pub kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Fields(Fields),
    /// `@every <duration>`: fixed interval (at least one second).
    Every(SignedDuration),
}

/// Bit sets of allowed values; `dom_star`/`dow_star` record a `*` or `?` (robfig's star bit),
/// which decides whether day-of-month and day-of-week combine with AND or OR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    pub minute: u64,
    pub hour: u64,
    pub dom: u64,
    pub month: u64,
    pub dow: u64,
    pub dom_star: bool,
    pub dow_star: bool,
}

const MONTHS: &[&str] = &[
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAYS: &[&str] = &["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

struct Bounds {
    min: u32,
    max: u32,
    names: &'static [&'static str],
    /// Value of the first name (1 for months, 0 for weekdays).
    name_base: u32,
}

const MINUTE: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
    name_base: 0,
};
const HOUR: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
    name_base: 0,
};
const DOM: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
    name_base: 0,
};
const MONTH: Bounds = Bounds {
    min: 1,
    max: 12,
    names: MONTHS,
    name_base: 1,
};
const DOW: Bounds = Bounds {
    min: 0,
    max: 6,
    names: DAYS,
    name_base: 0,
};

/// Why a schedule is refused; the texts are robfig/cron's, which the API server returns in the
/// CronJob's validation error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error("empty spec string")]
    Empty,
    #[error("expected exactly 5 fields, found {found}: {spec}")]
    FieldCount { found: usize, spec: String },
    #[error("failed to parse int from {0}: strconv.Atoi: parsing {0:?}: invalid syntax")]
    NotANumber(String),
    #[error("beginning of range ({start}) below minimum ({min}): {expr}")]
    BelowMinimum { start: u32, min: u32, expr: String },
    #[error("end of range ({end}) above maximum ({max}): {expr}")]
    AboveMaximum { end: u32, max: u32, expr: String },
    #[error("beginning of range ({start}) beyond end of range ({end}): {expr}")]
    EmptyRange { start: u32, end: u32, expr: String },
    #[error("step of range should be a positive number: {0}")]
    ZeroStep(String),
    #[error("provided bad location {0}: unknown time zone {0}")]
    UnknownTimeZone(String),
    #[error("failed to parse duration @every {0}: time: invalid duration {0:?}")]
    InvalidDuration(String),
    #[error("failed to parse duration {0}: below one second")]
    BelowOneSecond(String),
    #[error("unrecognized descriptor: {0}")]
    UnknownDescriptor(String),
}

fn value(s: &str, b: &Bounds) -> Result<u32, CronError> {
    let lower = s.to_ascii_lowercase();
    if let Some(i) = b.names.iter().position(|n| *n == lower) {
        return Ok(i as u32 + b.name_base);
    }
    s.parse::<u32>()
        .map_err(|_| CronError::NotANumber(s.to_string()))
}

/// One comma-separated part: `*`, `?`, `a`, `a-b`, with an optional `/step`.
fn range(expr: &str, b: &Bounds) -> Result<(u64, bool), CronError> {
    let (lh, step) = match expr.split_once('/') {
        Some((l, s)) => (l, Some(s)),
        None => (expr, None),
    };
    let mut star = false;
    let (start, mut end) = if lh == "*" || lh == "?" {
        star = true;
        (b.min, b.max)
    } else {
        match lh.split_once('-') {
            Some((a, z)) => (value(a, b)?, value(z, b)?),
            None => {
                let v = value(lh, b)?;
                (v, v)
            }
        }
    };
    let step = match step {
        None => 1,
        Some(s) => {
            let n = s
                .parse::<u32>()
                .map_err(|_| CronError::NotANumber(s.to_string()))?;
            // `N/step` means N through the maximum.
            if !lh.contains('-') && !star {
                end = b.max;
            }
            if n > 1 {
                star = false;
            }
            n
        }
    };
    if start < b.min {
        return Err(CronError::BelowMinimum {
            start,
            min: b.min,
            expr: expr.to_string(),
        });
    }
    if end > b.max {
        return Err(CronError::AboveMaximum {
            end,
            max: b.max,
            expr: expr.to_string(),
        });
    }
    if start > end {
        return Err(CronError::EmptyRange {
            start,
            end,
            expr: expr.to_string(),
        });
    }
    if step == 0 {
        return Err(CronError::ZeroStep(expr.to_string()));
    }
    let mut bits = 0u64;
    let mut v = start;
    while v <= end {
        bits |= 1 << v;
        v += step;
    }
    Ok((bits, star))
}

fn field(expr: &str, b: &Bounds) -> Result<(u64, bool), CronError> {
    let mut bits = 0;
    let mut star = false;
    for part in expr.split(',') {
        let (p, s) = range(part, b)?;
        bits |= p;
        star |= s;
    }
    Ok((bits, star))
}

fn fields(spec: &str) -> Result<Fields, CronError> {
    let parts: Vec<&str> = spec.split_whitespace().collect();
    if parts.len() != 5 {
        return Err(CronError::FieldCount {
            found: parts.len(),
            spec: spec.to_string(),
        });
    }
    let (minute, _) = field(parts[0], &MINUTE)?;
    let (hour, _) = field(parts[1], &HOUR)?;
    let (dom, dom_star) = field(parts[2], &DOM)?;
    let (month, _) = field(parts[3], &MONTH)?;
    let (dow, dow_star) = field(parts[4], &DOW)?;
    Ok(Fields {
        minute,
        hour,
        dom,
        month,
        dow,
        dom_star,
        dow_star,
    })
}

/// Go's `time.ParseDuration` for the units `@every` takes (h, m, s, ms).
fn go_duration(s: &str) -> Result<SignedDuration, CronError> {
    let err = || CronError::InvalidDuration(s.to_string());
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return Err(err());
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let n: f64 = rest[..num_end].parse().map_err(|_| err())?;
        let unit_end = rest[num_end..]
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .map_or(rest.len(), |i| num_end + i);
        let scale = match &rest[num_end..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return Err(err()),
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    Ok(SignedDuration::from_secs_f64(total))
}

/// Parses a schedule (`ParseStandard`).
pub fn parse(spec: &str) -> Result<Schedule, CronError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(CronError::Empty);
    }
    let mut tz = None;
    let mut rest = spec;
    if rest.starts_with("TZ=") || rest.starts_with("CRON_TZ=") {
        let (prefix, r) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        let name = prefix.split_once('=').map(|(_, n)| n).unwrap_or("");
        if TimeZone::get(name).is_err() {
            return Err(CronError::UnknownTimeZone(name.to_string()));
        }
        tz = Some(name.to_string());
        rest = r.trim();
    }
    let kind = if let Some(d) = rest.strip_prefix('@') {
        let (word, arg) = d.split_once(char::is_whitespace).unwrap_or((d, ""));
        match word {
            "yearly" | "annually" => Kind::Fields(fields("0 0 1 1 *")?),
            "monthly" => Kind::Fields(fields("0 0 1 * *")?),
            "weekly" => Kind::Fields(fields("0 0 * * 0")?),
            "daily" | "midnight" => Kind::Fields(fields("0 0 * * *")?),
            "hourly" => Kind::Fields(fields("0 * * * *")?),
            "every" => {
                let d = go_duration(arg.trim())?;
                if d < SignedDuration::from_secs(1) {
                    return Err(CronError::BelowOneSecond(rest.to_string()));
                }
                Kind::Every(d)
            }
            _ => return Err(CronError::UnknownDescriptor(rest.to_string())),
        }
    } else {
        Kind::Fields(fields(rest)?)
    };
    Ok(Schedule { tz, kind })
}

/// Whether the schedule carries its own time zone (`TZ=`/`CRON_TZ=`).
pub fn has_tz_prefix(spec: &str) -> bool {
    let s = spec.trim_start();
    s.starts_with("TZ=") || s.starts_with("CRON_TZ=")
}

fn bit(bits: u64, v: i8) -> bool {
    v >= 0 && bits & (1u64 << v) != 0
}

impl Fields {
    fn day_matches(&self, d: Date) -> bool {
        let dom = bit(self.dom, d.day());
        let dow = bit(self.dow, d.weekday().to_sunday_zero_offset());
        if self.dom_star || self.dow_star {
            dom && dow
        } else {
            dom || dow
        }
    }
}

impl Schedule {
    /// The first firing strictly after `after`, evaluated in the schedule's `TZ=` zone, else in
    /// `zone`. `None` when nothing fires within five years (e.g. `0 0 30 2 *`).
    pub fn next(&self, after: Timestamp, zone: &TimeZone) -> Option<Timestamp> {
        let zone = match &self.tz {
            Some(name) => TimeZone::get(name).ok()?,
            None => zone.clone(),
        };
        match &self.kind {
            Kind::Every(d) => {
                // robfig's ConstantDelaySchedule: rounded down to the second, plus the delay.
                let secs = after.as_second();
                Timestamp::from_second(secs).ok()?.checked_add(*d).ok()
            }
            Kind::Fields(f) => next_fields(f, after, &zone),
        }
    }
}

fn next_fields(f: &Fields, after: Timestamp, zone: &TimeZone) -> Option<Timestamp> {
    let local = after.to_zoned(zone.clone()).datetime();
    // Start at the next whole minute.
    let mut t = local
        .with()
        .second(0)
        .subsec_nanosecond(0)
        .build()
        .ok()?
        .checked_add(1.minute())
        .ok()?;
    let limit = t.year() + 5;
    while t.year() <= limit {
        if !bit(f.month, t.month()) {
            let (y, m) = if t.month() == 12 {
                (t.year() + 1, 1)
            } else {
                (t.year(), t.month() + 1)
            };
            t = DateTime::from_parts(Date::new(y, m, 1).ok()?, Time::midnight());
            continue;
        }
        if !f.day_matches(t.date()) {
            t = DateTime::from_parts(t.date().tomorrow().ok()?, Time::midnight());
            continue;
        }
        if !bit(f.hour, t.hour()) {
            t = t
                .with()
                .minute(0)
                .build()
                .ok()?
                .checked_add(1.hour())
                .ok()?;
            continue;
        }
        if !bit(f.minute, t.minute()) {
            t = t.checked_add(1.minute()).ok()?;
            continue;
        }
        let z = zone.to_ambiguous_zoned(t).compatible().ok()?;
        let ts = z.timestamp();
        if ts > after {
            return Some(ts);
        }
        t = t.checked_add(1.minute()).ok()?;
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn next_times() {
        let utc = TimeZone::UTC;
        let cases = [
            ("* * * * *", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"),
            ("* * * * *", "2026-01-01T00:00:30Z", "2026-01-01T00:01:00Z"),
            (
                "*/15 * * * *",
                "2026-01-01T00:14:59Z",
                "2026-01-01T00:15:00Z",
            ),
            ("5 4 * * *", "2026-01-01T04:05:00Z", "2026-01-02T04:05:00Z"),
            ("0 0 * * 0", "2026-01-01T00:00:00Z", "2026-01-04T00:00:00Z"),
            (
                "0 0 * * sun",
                "2026-01-01T00:00:00Z",
                "2026-01-04T00:00:00Z",
            ),
            (
                "0 12 1 JAN *",
                "2026-01-01T12:00:00Z",
                "2027-01-01T12:00:00Z",
            ),
            ("@hourly", "2026-01-01T00:59:59Z", "2026-01-01T01:00:00Z"),
            ("@daily", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
            ("@weekly", "2026-01-01T00:00:00Z", "2026-01-04T00:00:00Z"),
            ("@monthly", "2026-01-15T00:00:00Z", "2026-02-01T00:00:00Z"),
            ("@yearly", "2026-03-01T00:00:00Z", "2027-01-01T00:00:00Z"),
            (
                "@every 90s",
                "2026-01-01T00:00:00.5Z",
                "2026-01-01T00:01:30Z",
            ),
            ("0 0 29 2 *", "2026-01-01T00:00:00Z", "2028-02-29T00:00:00Z"),
            (
                "1-3/2 * * * *",
                "2026-01-01T00:01:00Z",
                "2026-01-01T00:03:00Z",
            ),
            (
                "10/20 * * * *",
                "2026-01-01T00:11:00Z",
                "2026-01-01T00:30:00Z",
            ),
            // Day of month OR day of week when both are restricted (13th or a Friday).
            ("0 0 13 * 5", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
            // AND when one of them is a star.
            ("0 0 13 * *", "2026-01-01T00:00:00Z", "2026-01-13T00:00:00Z"),
            ("0 0 ? * 1", "2026-01-01T00:00:00Z", "2026-01-05T00:00:00Z"),
            (
                "CRON_TZ=Asia/Tokyo 0 9 * * *",
                "2026-01-01T00:00:00Z",
                "2026-01-02T00:00:00Z",
            ),
            (
                "TZ=America/New_York 30 2 * * *",
                "2026-03-08T00:00:00Z",
                "2026-03-08T07:30:00Z",
            ),
        ];
        for (spec, after, want) in cases {
            let s = parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!(
                s.next(ts(after), &utc),
                Some(ts(want)),
                "{spec} after {after}"
            );
        }
    }

    #[test]
    fn zone_argument() {
        let s = parse("0 9 * * *").unwrap();
        let tokyo = TimeZone::get("Asia/Tokyo").unwrap();
        assert_eq!(
            s.next(ts("2026-01-01T00:00:00Z"), &tokyo),
            Some(ts("2026-01-02T00:00:00Z"))
        );
        // Never fires: 30 February.
        assert_eq!(
            parse("0 0 30 2 *")
                .unwrap()
                .next(ts("2026-01-01T00:00:00Z"), &tokyo),
            None
        );
    }

    #[test]
    fn rejects() {
        for spec in [
            "",
            "* * * *",
            "* * * * * *",
            "60 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "* * * 13 *",
            "* * * * 7",
            "5-1 * * * *",
            "*/0 * * * *",
            "x * * * *",
            "@fortnightly",
            "@every",
            "@every 10x",
            "CRON_TZ=Mars/Olympus * * * * *",
        ] {
            assert!(parse(spec).is_err(), "{spec:?} should be rejected");
        }
        assert!(has_tz_prefix("CRON_TZ=UTC * * * * *"));
        assert!(!has_tz_prefix("* * * * *"));
    }

    /// The messages are robfig/cron's (kubectl shows them in the CronJob's validation error).
    #[test]
    fn messages() {
        for (spec, want) in [
            ("", "empty spec string"),
            ("* * * *", "expected exactly 5 fields, found 4: * * * *"),
            ("60 * * * *", "end of range (60) above maximum (59): 60"),
            ("* * 0 * *", "beginning of range (0) below minimum (1): 0"),
            (
                "5-1 * * * *",
                "beginning of range (5) beyond end of range (1): 5-1",
            ),
            (
                "*/0 * * * *",
                "step of range should be a positive number: */0",
            ),
            (
                "x * * * *",
                "failed to parse int from x: strconv.Atoi: parsing \"x\": invalid syntax",
            ),
            ("@fortnightly", "unrecognized descriptor: @fortnightly"),
            (
                "@every 10x",
                "failed to parse duration @every 10x: time: invalid duration \"10x\"",
            ),
            (
                "@every 10ms",
                "failed to parse duration @every 10ms: below one second",
            ),
            (
                "CRON_TZ=Mars/Olympus * * * * *",
                "provided bad location Mars/Olympus: unknown time zone Mars/Olympus",
            ),
        ] {
            let e = parse(spec).expect_err(spec);
            assert_eq!(e.to_string(), want, "{spec:?}: {e:?}");
        }
    }
}
