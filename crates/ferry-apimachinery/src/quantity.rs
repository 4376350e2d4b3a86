//! Resource quantities (`resource.Quantity`): `1Gi`, `500M`, `1.5`, `100m`, `1e3`, parsed to
//! an exact number of milli-units so that storage sizes compare as upstream compares them.

use thiserror::Error;

/// Upstream's parse error text.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)]
pub struct QuantityError;

/// A parsed quantity in thousandths of its unit (bytes for storage), rounded up as upstream
/// rounds sub-milli values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity {
    pub milli: i128,
}

impl Quantity {
    /// The value in whole units, rounded up (`Quantity.Value()`).
    pub fn value(&self) -> i128 {
        let q = self.milli.div_euclid(1000);
        if self.milli.rem_euclid(1000) == 0 {
            q
        } else {
            q + 1
        }
    }
    pub fn is_positive(&self) -> bool {
        self.milli > 0
    }
}

fn pow(base: i128, exp: u32) -> i128 {
    base.checked_pow(exp).unwrap_or(i128::MAX)
}

/// Parses a quantity string.
pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(QuantityError);
    }
    let (neg, body) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (num, suffix) = body.split_at(num_end);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return Err(QuantityError);
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    // The mantissa as an integer with `scale` decimal digits after the point.
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return Err(QuantityError);
    }
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| QuantityError)?
    };
    let scale = i32::try_from(frac_part.len()).map_err(|_| QuantityError)?;
    // (multiplier numerator, decimal exponent) of the suffix.
    let (mul, exp10): (i128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        e if e.starts_with(['e', 'E']) => {
            let x: i32 = e[1..].parse().map_err(|_| QuantityError)?;
            if !(-30..=30).contains(&x) {
                return Err(QuantityError);
            }
            (1, x)
        }
        _ => return Err(QuantityError),
    };
    // milli = mantissa * mul * 10^(exp10 + 3 - scale), rounded up.
    let e = exp10 + 3 - scale;
    let base = mantissa.checked_mul(mul).ok_or(QuantityError)?;
    let milli = if e >= 0 {
        base.checked_mul(pow(10, e.unsigned_abs()))
            .ok_or(QuantityError)?
    } else {
        let d = pow(10, e.unsigned_abs());
        base / d + i128::from(base % d != 0)
    };
    Ok(Quantity {
        milli: if neg { -milli } else { milli },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_as_upstream() {
        let cases: &[(&str, i128)] = &[
            ("1Gi", 1 << 30),
            ("1G", 1_000_000_000),
            ("500Mi", 500 << 20),
            ("1.5Gi", 3 << 29),
            ("100", 100),
            ("1e3", 1000),
            ("1k", 1000),
            ("0", 0),
            ("+2Ki", 2048),
            ("-1", -1),
        ];
        for (s, want) in cases {
            assert_eq!(parse(s).map(|q| q.value()), Ok(*want), "{s}");
        }
        assert_eq!(parse("100m").map(|q| q.milli), Ok(100));
        assert_eq!(parse("1n").map(|q| q.milli), Ok(1), "rounded up");
        for bad in ["", "Gi", "1Gb", "1..2", "abc", "1 Gi"] {
            assert_eq!(parse(bad), Err(QuantityError), "{bad}");
        }
        assert!(
            parse("2Gi").unwrap_or(Quantity { milli: 0 })
                > parse("2G").unwrap_or(Quantity { milli: 0 })
        );
    }
}
