//! Upstream's `duration.HumanDuration`: the short ages kubectl shows (`5s`, `2m10s`, `3h`, `5d`,
//! `2y10d`), and the `<unknown>` / `<invalid>` placeholders around it.

use jiff::{SignedDuration, Timestamp};

const NANOS_PER_SEC: i128 = 1_000_000_000;

/// The human form of a duration. Up to two seconds in the future still reads `0s` (clock skew);
/// further in the future is `<invalid>`.
pub fn human_duration(d: SignedDuration) -> String {
    let nanos = d.as_nanos();
    // Go converts through float seconds and truncates toward zero.
    let seconds = nanos / NANOS_PER_SEC;
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 || nanos < 0 {
        return "0s".to_string();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Upstream's `translateTimestampSince`: the age of a timestamp at `now`, `<unknown>` when unset.
pub fn since(t: Option<Timestamp>, now: Timestamp) -> String {
    match t {
        None => "<unknown>".to_string(),
        Some(t) => human_duration(now.duration_since(t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_duration_table() {
        let cases: &[(i64, &str)] = &[
            (-5, "<invalid>"),
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (1, "1s"),
            (59, "59s"),
            (60, "60s"),
            (119, "119s"),
            (120, "2m"),
            (130, "2m10s"),
            (9 * 60 + 59, "9m59s"),
            (10 * 60, "10m"),
            (10 * 60 + 59, "10m"),
            (179 * 60 + 59, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (7 * 3600 + 59 * 60 + 59, "7h59m"),
            (8 * 3600, "8h"),
            (47 * 3600 + 3599, "47h"),
            (48 * 3600, "2d"),
            (49 * 3600, "2d1h"),
            (7 * 86400 + 23 * 3600, "7d23h"),
            (8 * 86400, "8d"),
            (5 * 86400, "5d"),
            (729 * 86400, "729d"),
            (730 * 86400, "2y"),
            (740 * 86400, "2y10d"),
            (8 * 365 * 86400 - 1, "7y364d"),
            (8 * 365 * 86400, "8y"),
            (20 * 365 * 86400, "20y"),
        ];
        for (secs, want) in cases {
            assert_eq!(
                human_duration(SignedDuration::from_secs(*secs)),
                *want,
                "{secs}s"
            );
        }
        // Fractions truncate toward zero, as Go's float conversion does.
        assert_eq!(human_duration(SignedDuration::from_millis(1999)), "1s");
        assert_eq!(human_duration(SignedDuration::from_millis(-1999)), "0s");
        assert_eq!(
            human_duration(SignedDuration::from_millis(-2000)),
            "<invalid>"
        );
    }

    #[test]
    fn since_placeholder() {
        let now: Timestamp = "2024-01-01T00:00:00Z".parse().expect("ts");
        assert_eq!(since(None, now), "<unknown>");
        let t: Timestamp = "2023-12-31T23:57:50Z".parse().expect("ts");
        assert_eq!(since(Some(t), now), "2m10s");
    }
}
