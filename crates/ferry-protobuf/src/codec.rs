//! The descriptor-driven translation between protobuf messages and JSON objects.
//!
//! Decoding reproduces what Go's `encoding/json` prints for the struct that gogo-protobuf would
//! have filled: pointer fields appear whenever present on the wire, non-pointer scalars are left
//! out only when `omitempty` and zero, non-pointer structs always appear, maps have sorted keys.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Number, Value};

use super::ProtobufError;
use super::schema::{Card, Field, INLINE, Msg, OMIT, PTR, Ty};
use super::wire::{self, Reader, WireVal};

/// Nesting limit for messages (Kubernetes objects nest about 15 levels deep).
const MAX_DEPTH: usize = 64;

fn malformed(msg: &Msg, field: &Field, what: impl std::fmt::Display) -> ProtobufError {
    ProtobufError::Malformed(format!(
        "{} field {} ({}): {what}",
        msg.name, field.tag, field.json
    ))
}

// ------------------------------------------------------------------------------------ decoding

/// Decodes one message into `out` (which may already hold fields, for inlined structs).
pub(crate) fn decode_message(
    msg: &'static Msg,
    bytes: &[u8],
    depth: usize,
    out: &mut Map<String, Value>,
) -> Result<(), ProtobufError> {
    if depth > MAX_DEPTH {
        return Err(ProtobufError::Malformed(format!(
            "{}: nesting deeper than {MAX_DEPTH}",
            msg.name
        )));
    }
    let mut slots: Vec<Vec<WireVal<'_>>> = vec![Vec::new(); msg.fields.len()];
    let mut reader = Reader::new(bytes);
    while let Some((tag, value)) = reader.next_field()? {
        // Unknown fields (newer Kubernetes versions) are skipped, as gogo-protobuf does.
        if let Some(i) = msg.fields.iter().position(|f| f.tag == tag) {
            slots[i].push(value);
        }
    }
    for (field, values) in msg.fields.iter().zip(&slots) {
        if values.is_empty() {
            continue;
        }
        match field.card {
            Card::Single => decode_single(msg, field, values, depth, out)?,
            Card::Repeated => {
                let mut items = Vec::new();
                for value in values {
                    decode_repeated_item(msg, field, *value, depth, &mut items)?;
                }
                if !items.is_empty() {
                    out.insert(field.json.to_string(), Value::Array(items));
                }
            }
            Card::Map => {
                let mut entries = std::collections::BTreeMap::new();
                for value in values {
                    let WireVal::Bytes(entry) = value else {
                        return Err(malformed(msg, field, "map entry is not length-delimited"));
                    };
                    let (key, val) = decode_map_entry(msg, field, entry, depth)?;
                    entries.insert(key, val);
                }
                if !entries.is_empty() {
                    out.insert(
                        field.json.to_string(),
                        Value::Object(entries.into_iter().collect()),
                    );
                }
            }
        }
    }
    Ok(())
}

/// Concatenates the occurrences of a message-typed field (protobuf merges them).
fn joined<'a>(
    msg: &Msg,
    field: &Field,
    values: &[WireVal<'a>],
) -> Result<std::borrow::Cow<'a, [u8]>, ProtobufError> {
    let mut parts = values.iter().map(|v| match v {
        WireVal::Bytes(b) => Ok(*b),
        other => Err(malformed(
            msg,
            field,
            format!("expected length-delimited, got {}", other.wire_name()),
        )),
    });
    let first = match parts.next() {
        Some(first) => first?,
        None => return Ok(std::borrow::Cow::Borrowed(&[])),
    };
    if values.len() == 1 {
        return Ok(std::borrow::Cow::Borrowed(first));
    }
    let mut all = first.to_vec();
    for part in parts {
        all.extend_from_slice(part?);
    }
    Ok(std::borrow::Cow::Owned(all))
}

fn decode_single(
    msg: &'static Msg,
    field: &Field,
    values: &[WireVal<'_>],
    depth: usize,
    out: &mut Map<String, Value>,
) -> Result<(), ProtobufError> {
    if let Ty::Message(sub) = field.ty {
        let bytes = joined(msg, field, values)?;
        if field.has(INLINE) {
            return decode_message(sub, &bytes, depth + 1, out);
        }
        let mut obj = Map::new();
        decode_message(sub, &bytes, depth + 1, &mut obj)?;
        out.insert(field.json.to_string(), Value::Object(obj));
        return Ok(());
    }
    if field.ty.is_message_like() {
        let bytes = joined(msg, field, values)?;
        let value = decode_special(msg, field, &bytes)?;
        out.insert(field.json.to_string(), value);
        return Ok(());
    }
    // Scalars: the last occurrence wins.
    let Some(last) = values.last() else {
        return Ok(());
    };
    let value = decode_scalar(msg, field, *last)?;
    if !field.has(PTR) && field.has(OMIT) && is_zero(&value) {
        return Ok(());
    }
    out.insert(field.json.to_string(), value);
    Ok(())
}

fn decode_repeated_item(
    msg: &'static Msg,
    field: &Field,
    value: WireVal<'_>,
    depth: usize,
    items: &mut Vec<Value>,
) -> Result<(), ProtobufError> {
    match (field.ty, value) {
        (Ty::Message(sub), WireVal::Bytes(b)) => {
            let mut obj = Map::new();
            decode_message(sub, b, depth + 1, &mut obj)?;
            items.push(Value::Object(obj));
        }
        (ty, WireVal::Bytes(b)) if ty.is_message_like() => {
            items.push(decode_special(msg, field, b)?)
        }
        // Packed numeric values.
        (Ty::Int32 | Ty::Int64 | Ty::Bool, WireVal::Bytes(b)) => {
            let mut r = Reader::new(b);
            while !r.is_empty() {
                items.push(decode_scalar(msg, field, WireVal::Varint(r.varint()?))?);
            }
        }
        (Ty::Double, WireVal::Bytes(b)) => {
            if b.len() % 8 != 0 {
                return Err(malformed(
                    msg,
                    field,
                    "packed doubles not a multiple of 8 bytes",
                ));
            }
            for chunk in b.chunks_exact(8) {
                let mut a = [0u8; 8];
                a.copy_from_slice(chunk);
                items.push(decode_scalar(
                    msg,
                    field,
                    WireVal::Fixed64(u64::from_le_bytes(a)),
                )?);
            }
        }
        (_, v) => items.push(decode_scalar(msg, field, v)?),
    }
    Ok(())
}

fn decode_map_entry(
    msg: &'static Msg,
    field: &Field,
    entry: &[u8],
    depth: usize,
) -> Result<(String, Value), ProtobufError> {
    let mut key = String::new();
    let mut values = Vec::new();
    let mut r = Reader::new(entry);
    while let Some((tag, v)) = r.next_field()? {
        match (tag, v) {
            (1, WireVal::Bytes(b)) => key = String::from_utf8_lossy(b).into_owned(),
            (1, _) => return Err(malformed(msg, field, "map key is not a string")),
            (2, v) => values.push(v),
            _ => {}
        }
    }
    let value = match field.ty {
        Ty::Message(sub) => {
            let mut obj = Map::new();
            decode_message(sub, &joined(msg, field, &values)?, depth + 1, &mut obj)?;
            Value::Object(obj)
        }
        ty if ty.is_message_like() => decode_special(msg, field, &joined(msg, field, &values)?)?,
        _ => match values.last() {
            Some(v) => decode_scalar(msg, field, *v)?,
            None => zero_scalar(field.ty),
        },
    };
    Ok((key, value))
}

fn zero_scalar(ty: Ty) -> Value {
    match ty {
        Ty::Int32 | Ty::Int64 => Value::from(0),
        Ty::Bool => Value::Bool(false),
        Ty::Double => Value::from(0.0),
        _ => Value::String(String::new()),
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

fn decode_scalar(msg: &Msg, field: &Field, value: WireVal<'_>) -> Result<Value, ProtobufError> {
    Ok(match (field.ty, value) {
        (Ty::String, WireVal::Bytes(b)) => Value::String(String::from_utf8_lossy(b).into_owned()),
        (Ty::Bytes, WireVal::Bytes(b)) => Value::String(BASE64.encode(b)),
        // Go truncates an int32 varint to its low 32 bits.
        (Ty::Int32, WireVal::Varint(v)) => Value::from(v as u32 as i32),
        (Ty::Int64, WireVal::Varint(v)) => Value::from(v as i64),
        (Ty::Bool, WireVal::Varint(v)) => Value::Bool(v != 0),
        (Ty::Double, WireVal::Fixed64(v)) => {
            let f = f64::from_bits(v);
            Value::Number(
                Number::from_f64(f).ok_or_else(|| malformed(msg, field, "non-finite double"))?,
            )
        }
        (ty, v) => {
            return Err(malformed(
                msg,
                field,
                format!("{ty:?} cannot be {}", v.wire_name()),
            ));
        }
    })
}

/// Reads the scalar fields of a small special message (IntOrString, Time, ...).
fn small_fields<'a>(
    msg: &Msg,
    field: &Field,
    bytes: &'a [u8],
) -> Result<Vec<(u32, WireVal<'a>)>, ProtobufError> {
    let mut r = Reader::new(bytes);
    let mut fields = Vec::new();
    while let Some(f) = r.next_field().map_err(|e| malformed(msg, field, e))? {
        fields.push(f);
    }
    Ok(fields)
}

fn last_varint(fields: &[(u32, WireVal<'_>)], tag: u32) -> Option<u64> {
    fields.iter().rev().find_map(|(t, v)| match v {
        WireVal::Varint(n) if *t == tag => Some(*n),
        _ => None,
    })
}

fn last_bytes<'a>(fields: &[(u32, WireVal<'a>)], tag: u32) -> Option<&'a [u8]> {
    fields.iter().rev().find_map(|(t, v)| match v {
        WireVal::Bytes(b) if *t == tag => Some(*b),
        _ => None,
    })
}

fn decode_special(msg: &Msg, field: &Field, bytes: &[u8]) -> Result<Value, ProtobufError> {
    let fields = small_fields(msg, field, bytes)?;
    Ok(match field.ty {
        Ty::IntOrString => {
            if last_varint(&fields, 1) == Some(1) {
                Value::String(
                    String::from_utf8_lossy(last_bytes(&fields, 3).unwrap_or_default())
                        .into_owned(),
                )
            } else {
                Value::from(last_varint(&fields, 2).unwrap_or(0) as u32 as i32)
            }
        }
        Ty::Quantity => {
            let s =
                String::from_utf8_lossy(last_bytes(&fields, 1).unwrap_or_default()).into_owned();
            // Go parses the string into a Quantity; the zero Quantity prints as "0".
            Value::String(if s.is_empty() { "0".to_string() } else { s })
        }
        Ty::Time | Ty::MicroTime => {
            if bytes.is_empty() {
                // The zero time.Time, which metav1.Time prints as null.
                return Ok(Value::Null);
            }
            let seconds = last_varint(&fields, 1).unwrap_or(0) as i64;
            let nanos = last_varint(&fields, 2).unwrap_or(0) as u32 as i32;
            let micro = matches!(field.ty, Ty::MicroTime);
            Value::String(format_time(seconds, nanos, micro).map_err(|e| malformed(msg, field, e))?)
        }
        Ty::Duration => Value::String(format_duration(last_varint(&fields, 1).unwrap_or(0) as i64)),
        Ty::RawJson => match last_bytes(&fields, 1) {
            None => Value::Null,
            Some([]) => Value::Null,
            Some(raw) => serde_json::from_slice(raw)
                .map_err(|e| malformed(msg, field, format!("raw bytes are not JSON: {e}")))?,
        },
        _ => return Err(malformed(msg, field, "not a special type")),
    })
}

/// Why a well-known type's value cannot be converted (inside a [`ProtobufError`] that names
/// the message and field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ValueError {
    #[error("time out of range: {0}")]
    TimeOutOfRange(String),
    #[error("time before year 0")]
    BeforeYearZero,
    #[error("invalid duration {0:?}")]
    InvalidDuration(String),
}

/// RFC 3339 in UTC with a `Z`: whole seconds for `Time`, 6 fraction digits for `MicroTime`.
pub(crate) fn format_time(seconds: i64, nanos: i32, micro: bool) -> Result<String, ValueError> {
    let nanos = if micro {
        nanos.clamp(0, 999_999_999) / 1000 * 1000
    } else {
        0
    };
    let ts = jiff::Timestamp::new(seconds, nanos)
        .map_err(|e| ValueError::TimeOutOfRange(e.to_string()))?;
    let dt = ts.to_zoned(jiff::tz::TimeZone::UTC).datetime();
    if dt.year() < 0 {
        return Err(ValueError::BeforeYearZero);
    }
    let mut s = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        dt.year(),
        dt.month(),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second()
    );
    if micro {
        s.push_str(&format!(".{:06}", nanos / 1000));
    }
    s.push('Z');
    Ok(s)
}

/// Go's `time.Duration.String()`.
pub(crate) fn format_duration(d: i64) -> String {
    if d == 0 {
        return "0s".into();
    }
    let u = d.unsigned_abs();
    let frac = |v: u64, unit: u64, width: usize| -> String {
        let (int, rest) = (v / unit, v % unit);
        if rest == 0 {
            int.to_string()
        } else {
            let digits = format!("{rest:0width$}");
            format!("{int}.{}", digits.trim_end_matches('0'))
        }
    };
    let body = if u < 1_000 {
        format!("{u}ns")
    } else if u < 1_000_000 {
        format!("{}µs", frac(u, 1_000, 3))
    } else if u < 1_000_000_000 {
        format!("{}ms", frac(u, 1_000_000, 6))
    } else {
        const MIN: u64 = 60_000_000_000;
        const HOUR: u64 = 60 * MIN;
        let (h, m, s) = (u / HOUR, u % HOUR / MIN, u % MIN);
        let mut out = String::new();
        if h > 0 {
            out.push_str(&format!("{h}h"));
        }
        if h > 0 || m > 0 {
            out.push_str(&format!("{m}m"));
        }
        out.push_str(&format!("{}s", frac(s, 1_000_000_000, 9)));
        out
    };
    if d < 0 { format!("-{body}") } else { body }
}

/// Parses Go's duration syntax (`1h2m3.5s`, `300ms`, `-1.5h`) into nanoseconds.
pub(crate) fn parse_duration(s: &str) -> Result<i64, ValueError> {
    let err = || ValueError::InvalidDuration(s.to_string());
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let (num, tail) = rest.split_at(num_end);
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(err()),
        };
        let (int, fraction) = num.split_once('.').unwrap_or((num, ""));
        if int.is_empty() && fraction.is_empty() {
            return Err(err());
        }
        let int: i128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| err())?
        };
        let mut value = int.checked_mul(scale).ok_or_else(err)?;
        let mut place = scale;
        for c in fraction.chars() {
            let digit = i128::from(c.to_digit(10).ok_or_else(err)?);
            place /= 10;
            value += digit * place;
        }
        total = total.checked_add(value).ok_or_else(err)?;
        if total > i128::from(i64::MAX) {
            return Err(err());
        }
        rest = tail;
    }
    let total = if neg { -total } else { total };
    i64::try_from(total).map_err(|_| err())
}

// ------------------------------------------------------------------------------------ encoding

fn invalid(msg: &Msg, field: &Field, what: impl std::fmt::Display) -> ProtobufError {
    ProtobufError::InvalidJson(format!("{} field {:?}: {what}", msg.name, field.json))
}

/// Encodes the JSON object `obj` as `msg`. Keys the descriptor does not know are ignored (as Go's
/// JSON decoder does); `null` means "unset".
pub(crate) fn encode_message(
    msg: &'static Msg,
    obj: &Map<String, Value>,
    depth: usize,
    out: &mut Vec<u8>,
) -> Result<(), ProtobufError> {
    if depth > MAX_DEPTH {
        return Err(ProtobufError::InvalidJson(format!(
            "{}: nesting deeper than {MAX_DEPTH}",
            msg.name
        )));
    }
    for field in msg.fields {
        if field.has(INLINE) {
            if let Ty::Message(sub) = field.ty {
                let mut buf = Vec::new();
                encode_message(sub, obj, depth + 1, &mut buf)?;
                wire::put_bytes_field(out, field.tag, &buf);
            }
            continue;
        }
        let Some(value) = obj.get(field.json) else {
            continue;
        };
        match field.card {
            Card::Single => {
                if value.is_null() {
                    // A JSON null leaves a Go pointer nil; a non-pointer struct stays zero, which
                    // gogo-protobuf still writes (as an empty message).
                    if field.ty.is_message_like() && !field.has(PTR) {
                        wire::put_bytes_field(out, field.tag, &[]);
                    }
                    continue;
                }
                encode_value(msg, field, value, depth, out)?;
            }
            Card::Repeated => match value {
                Value::Null => {}
                Value::Array(items) => {
                    for item in items {
                        encode_value(msg, field, item, depth, out)?;
                    }
                }
                _ => return Err(invalid(msg, field, "expected an array")),
            },
            Card::Map => match value {
                Value::Null => {}
                Value::Object(entries) => {
                    let mut sorted: Vec<_> = entries.iter().collect();
                    sorted.sort_by(|a, b| a.0.cmp(b.0));
                    for (key, val) in sorted {
                        let mut entry = Vec::new();
                        wire::put_bytes_field(&mut entry, 1, key.as_bytes());
                        encode_value(msg, &Field { tag: 2, ..*field }, val, depth, &mut entry)?;
                        wire::put_bytes_field(out, field.tag, &entry);
                    }
                }
                _ => return Err(invalid(msg, field, "expected an object")),
            },
        }
    }
    Ok(())
}

fn int_in_range(
    msg: &Msg,
    field: &Field,
    value: &Value,
    lo: i64,
    hi: i64,
) -> Result<i64, ProtobufError> {
    value
        .as_i64()
        .filter(|v| (lo..=hi).contains(v))
        .ok_or_else(|| {
            invalid(
                msg,
                field,
                format!("expected an integer in [{lo}, {hi}], got {value}"),
            )
        })
}

fn as_str<'v>(msg: &Msg, field: &Field, value: &'v Value) -> Result<&'v str, ProtobufError> {
    value
        .as_str()
        .ok_or_else(|| invalid(msg, field, format!("expected a string, got {value}")))
}

/// Writes one value of `field` (a single value, one repeated element, or a map value).
fn encode_value(
    msg: &'static Msg,
    field: &Field,
    value: &Value,
    depth: usize,
    out: &mut Vec<u8>,
) -> Result<(), ProtobufError> {
    let tag = field.tag;
    match field.ty {
        Ty::String => wire::put_bytes_field(out, tag, as_str(msg, field, value)?.as_bytes()),
        Ty::Bytes => {
            let bytes = BASE64
                .decode(as_str(msg, field, value)?)
                .map_err(|e| invalid(msg, field, format!("invalid base64: {e}")))?;
            wire::put_bytes_field(out, tag, &bytes);
        }
        Ty::Int32 => {
            let v = int_in_range(msg, field, value, i64::from(i32::MIN), i64::from(i32::MAX))?;
            wire::put_varint_field(out, tag, v as u64);
        }
        Ty::Int64 => wire::put_varint_field(
            out,
            tag,
            int_in_range(msg, field, value, i64::MIN, i64::MAX)? as u64,
        ),
        Ty::Bool => {
            let b = value
                .as_bool()
                .ok_or_else(|| invalid(msg, field, "expected a boolean"))?;
            wire::put_varint_field(out, tag, u64::from(b));
        }
        Ty::Double => {
            let f = value
                .as_f64()
                .ok_or_else(|| invalid(msg, field, "expected a number"))?;
            wire::put_fixed64_field(out, tag, f.to_bits());
        }
        Ty::IntOrString => {
            let mut buf = Vec::new();
            match value {
                Value::String(s) => {
                    wire::put_varint_field(&mut buf, 1, 1);
                    wire::put_varint_field(&mut buf, 2, 0);
                    wire::put_bytes_field(&mut buf, 3, s.as_bytes());
                }
                _ => {
                    let v =
                        int_in_range(msg, field, value, i64::from(i32::MIN), i64::from(i32::MAX))?;
                    wire::put_varint_field(&mut buf, 1, 0);
                    wire::put_varint_field(&mut buf, 2, v as u64);
                    wire::put_bytes_field(&mut buf, 3, b"");
                }
            }
            wire::put_bytes_field(out, tag, &buf);
        }
        Ty::Quantity => {
            let s = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return Err(invalid(msg, field, "expected a quantity string")),
            };
            let mut buf = Vec::new();
            wire::put_bytes_field(&mut buf, 1, s.as_bytes());
            wire::put_bytes_field(out, tag, &buf);
        }
        Ty::Time | Ty::MicroTime => {
            let mut buf = Vec::new();
            if !value.is_null() {
                let s = as_str(msg, field, value)?;
                let ts: jiff::Timestamp = s.parse().map_err(|e| {
                    invalid(msg, field, format!("invalid RFC 3339 time {s:?}: {e}"))
                })?;
                wire::put_varint_field(&mut buf, 1, ts.as_second() as u64);
                let nanos = if matches!(field.ty, Ty::MicroTime) {
                    ts.subsec_nanosecond() / 1000 * 1000
                } else {
                    0
                };
                wire::put_varint_field(&mut buf, 2, nanos as i64 as u64);
            }
            wire::put_bytes_field(out, tag, &buf);
        }
        Ty::Duration => {
            let nanos =
                parse_duration(as_str(msg, field, value)?).map_err(|e| invalid(msg, field, e))?;
            let mut buf = Vec::new();
            wire::put_varint_field(&mut buf, 1, nanos as u64);
            wire::put_bytes_field(out, tag, &buf);
        }
        Ty::RawJson => {
            let mut buf = Vec::new();
            if !value.is_null() {
                let raw = serde_json::to_vec(value).map_err(|e| invalid(msg, field, e))?;
                wire::put_bytes_field(&mut buf, 1, &raw);
            }
            wire::put_bytes_field(out, tag, &buf);
        }
        Ty::Message(sub) => {
            let obj = value
                .as_object()
                .ok_or_else(|| invalid(msg, field, "expected an object"))?;
            let mut buf = Vec::new();
            encode_message(sub, obj, depth + 1, &mut buf)?;
            wire::put_bytes_field(out, tag, &buf);
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_format_like_go() {
        let cases: &[(i64, &str)] = &[
            (0, "0s"),
            (1, "1ns"),
            (1_500, "1.5µs"),
            (2_000_000, "2ms"),
            (1_500_000_000, "1.5s"),
            (60_000_000_000, "1m0s"),
            (3_600_000_000_000, "1h0m0s"),
            (3_723_500_000_000, "1h2m3.5s"),
            (-90_000_000_000, "-1m30s"),
        ];
        for (nanos, text) in cases {
            assert_eq!(format_duration(*nanos), *text);
            assert_eq!(parse_duration(text), Ok(*nanos), "{text}");
        }
        for bad in ["", "1", "1x", "h", ".s", "-"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_format_like_go() {
        assert_eq!(format_time(0, 0, false).unwrap(), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_time(1_700_000_000, 123_456_789, false).unwrap(),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(
            format_time(1_700_000_000, 123_456_789, true).unwrap(),
            "2023-11-14T22:13:20.123456Z"
        );
        assert!(format_time(i64::MAX, 0, false).is_err());
    }
}
