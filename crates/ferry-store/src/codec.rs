//! Binary encoding of stored values and log entries for the redb backend.
//!
//! A stored key's value is `create_revision (i64 LE) | mod_revision (i64 LE) | value bytes`.
//!
//! A log entry (keyed by its revision in the log table) is
//!
//! ```text
//! put:    0u8 | key_len u32 | key | create_revision i64 | value_len u32 | value | has_prev u8 [| prev]
//! delete: 1u8 | key_len u32 | key | prev
//! prev:   create_revision i64 | mod_revision i64 | value_len u32 | value
//! ```
//!
//! All integers are little endian. Decoding never panics: malformed input is an
//! [`StoreError::Internal`].

use bytes::Bytes;

use crate::{Event, KeyValue, Result, Revision, StoreError};

const TAG_PUT: u8 = 0;
const TAG_DELETE: u8 = 1;

fn corrupt(what: &str) -> StoreError {
    StoreError::Internal(format!("corrupt {what} in store"))
}

/// Encodes the value stored under a key.
pub(crate) fn encode_kv(
    create_revision: Revision,
    mod_revision: Revision,
    value: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + value.len());
    out.extend_from_slice(&create_revision.to_le_bytes());
    out.extend_from_slice(&mod_revision.to_le_bytes());
    out.extend_from_slice(value);
    out
}

/// Decodes the value stored under `key`.
pub(crate) fn decode_kv(key: &str, raw: &[u8]) -> Result<KeyValue> {
    let mut r = Reader {
        buf: raw,
        what: "value",
    };
    let create_revision = r.i64()?;
    let mod_revision = r.i64()?;
    Ok(KeyValue {
        key: key.to_owned(),
        value: Bytes::copy_from_slice(r.buf),
        create_revision,
        mod_revision,
    })
}

fn put_prev(out: &mut Vec<u8>, prev: &KeyValue) {
    out.extend_from_slice(&prev.create_revision.to_le_bytes());
    out.extend_from_slice(&prev.mod_revision.to_le_bytes());
    put_bytes(out, &prev.value);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Keys and values are far below 4 GiB (etcd caps requests at 1.5 MiB).
    let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&b[..len as usize]);
}

/// Encodes a log entry; the revision is the table key and is not repeated.
pub(crate) fn encode_event(event: &Event) -> Vec<u8> {
    match event {
        Event::Put { kv, prev } => {
            let prev_len = prev.as_ref().map_or(0, |p| 20 + p.value.len());
            let mut out =
                Vec::with_capacity(1 + 4 + kv.key.len() + 8 + 4 + kv.value.len() + 1 + prev_len);
            out.push(TAG_PUT);
            put_bytes(&mut out, kv.key.as_bytes());
            out.extend_from_slice(&kv.create_revision.to_le_bytes());
            put_bytes(&mut out, &kv.value);
            match prev {
                Some(p) => {
                    out.push(1);
                    put_prev(&mut out, p);
                }
                None => out.push(0),
            }
            out
        }
        Event::Delete { prev, .. } => {
            let mut out = Vec::with_capacity(1 + 4 + prev.key.len() + 20 + prev.value.len());
            out.push(TAG_DELETE);
            put_bytes(&mut out, prev.key.as_bytes());
            put_prev(&mut out, prev);
            out
        }
    }
}

/// The key of a log entry, without decoding the rest (for prefix filtering).
pub(crate) fn event_key(raw: &[u8]) -> Result<&str> {
    let mut r = Reader {
        buf: raw,
        what: "log entry",
    };
    let _tag = r.u8()?;
    r.str()
}

/// Decodes the log entry stored at `revision`.
pub(crate) fn decode_event(revision: Revision, raw: &[u8]) -> Result<Event> {
    let mut r = Reader {
        buf: raw,
        what: "log entry",
    };
    let tag = r.u8()?;
    let key = r.str()?;
    match tag {
        TAG_PUT => {
            let create_revision = r.i64()?;
            let value = Bytes::copy_from_slice(r.bytes()?);
            let prev = match r.u8()? {
                0 => None,
                1 => Some(r.prev(key)?),
                _ => return Err(corrupt("log entry")),
            };
            r.end()?;
            Ok(Event::Put {
                kv: KeyValue {
                    key: key.to_owned(),
                    value,
                    create_revision,
                    mod_revision: revision,
                },
                prev,
            })
        }
        TAG_DELETE => {
            let prev = r.prev(key)?;
            r.end()?;
            Ok(Event::Delete { prev, revision })
        }
        _ => Err(corrupt("log entry")),
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(corrupt(self.what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i64(&mut self) -> Result<i64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn str(&mut self) -> Result<&'a str> {
        let what = self.what;
        std::str::from_utf8(self.bytes()?).map_err(|_| corrupt(what))
    }
    fn prev(&mut self, key: &str) -> Result<KeyValue> {
        let create_revision = self.i64()?;
        let mod_revision = self.i64()?;
        let value = Bytes::copy_from_slice(self.bytes()?);
        Ok(KeyValue {
            key: key.to_owned(),
            value,
            create_revision,
            mod_revision,
        })
    }
    fn end(&self) -> Result<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(corrupt(self.what))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, c: Revision, m: Revision) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Bytes::copy_from_slice(value.as_bytes()),
            create_revision: c,
            mod_revision: m,
        }
    }

    #[test]
    fn kv_round_trip() {
        let cases = [
            ("/a", "", 1, 1),
            ("/a/b", "{\"x\":1}", 3, 9),
            ("ü", "\0\u{1}", i64::MAX, 7),
        ];
        for (key, value, c, m) in cases {
            let raw = encode_kv(c, m, value.as_bytes());
            assert_eq!(decode_kv(key, &raw).unwrap(), kv(key, value, c, m));
        }
        assert!(decode_kv("k", &[0; 15]).is_err());
    }

    #[test]
    fn event_round_trip() {
        let cases = [
            (
                5,
                Event::Put {
                    kv: kv("/r/a", "v1", 5, 5),
                    prev: None,
                },
            ),
            (
                7,
                Event::Put {
                    kv: kv("/r/a", "v2", 5, 7),
                    prev: Some(kv("/r/a", "v1", 5, 5)),
                },
            ),
            (
                9,
                Event::Delete {
                    prev: kv("/r/a", "v2", 5, 7),
                    revision: 9,
                },
            ),
            (
                10,
                Event::Put {
                    kv: kv("", "", 10, 10),
                    prev: None,
                },
            ),
        ];
        for (rev, ev) in cases {
            let raw = encode_event(&ev);
            assert_eq!(event_key(&raw).unwrap(), ev.key());
            assert_eq!(decode_event(rev, &raw).unwrap(), ev);
            // Every truncation is rejected, never a panic.
            for cut in 0..raw.len() {
                assert!(decode_event(rev, &raw[..cut]).is_err(), "cut at {cut}");
            }
            let mut long = raw.clone();
            long.push(0);
            assert!(decode_event(rev, &long).is_err());
        }
        assert!(decode_event(1, &[7, 0, 0, 0, 0]).is_err());
    }
}
