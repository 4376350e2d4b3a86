//! The protobuf wire format: a bounds-checked reader and an append-only writer.

use super::ProtobufError;

/// One field value as it appears on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireVal<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Bytes(&'a [u8]),
}

impl WireVal<'_> {
    pub(crate) fn wire_name(&self) -> &'static str {
        match self {
            WireVal::Varint(_) => "varint",
            WireVal::Fixed64(_) => "fixed64",
            WireVal::Fixed32(_) => "fixed32",
            WireVal::Bytes(_) => "length-delimited",
        }
    }
}

/// Reads fields from one message's bytes.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub(crate) fn varint(&mut self) -> Result<u64, ProtobufError> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let byte = *self.buf.get(self.pos).ok_or(ProtobufError::Truncated)?;
            self.pos += 1;
            if i == 9 && byte > 1 {
                return Err(ProtobufError::Malformed("varint overflows 64 bits".into()));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(ProtobufError::Malformed(
            "varint longer than 10 bytes".into(),
        ))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtobufError> {
        let end = self.pos.checked_add(n).ok_or(ProtobufError::Truncated)?;
        let slice = self
            .buf
            .get(self.pos..end)
            .ok_or(ProtobufError::Truncated)?;
        self.pos = end;
        Ok(slice)
    }

    /// The next `(field number, value)`, or `None` at the end of the message.
    pub(crate) fn next_field(&mut self) -> Result<Option<(u32, WireVal<'a>)>, ProtobufError> {
        if self.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let tag = key >> 3;
        if tag == 0 || tag > (1 << 29) - 1 {
            return Err(ProtobufError::Malformed(format!(
                "invalid field number {tag}"
            )));
        }
        let tag =
            u32::try_from(tag).map_err(|_| ProtobufError::Malformed("field number".into()))?;
        let value = match key & 7 {
            0 => WireVal::Varint(self.varint()?),
            1 => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                WireVal::Fixed64(u64::from_le_bytes(a))
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| ProtobufError::Truncated)?;
                WireVal::Bytes(self.take(len)?)
            }
            5 => {
                let b = self.take(4)?;
                let mut a = [0u8; 4];
                a.copy_from_slice(b);
                WireVal::Fixed32(u32::from_le_bytes(a))
            }
            w => {
                return Err(ProtobufError::Malformed(format!(
                    "unsupported wire type {w} for field {tag}"
                )));
            }
        };
        Ok(Some((tag, value)))
    }
}

/// Appends protobuf encodings to a buffer.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_key(out: &mut Vec<u8>, tag: u32, wire_type: u8) {
    put_varint(out, (u64::from(tag) << 3) | u64::from(wire_type));
}

pub(crate) fn put_varint_field(out: &mut Vec<u8>, tag: u32, v: u64) {
    put_key(out, tag, 0);
    put_varint(out, v);
}

pub(crate) fn put_bytes_field(out: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    put_key(out, tag, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

pub(crate) fn put_fixed64_field(out: &mut Vec<u8>, tag: u32, v: u64) {
    put_key(out, tag, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            u64::from(u32::MAX),
            u64::MAX,
            (-1i64) as u64,
        ] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            let mut r = Reader::new(&buf);
            assert_eq!(r.varint().unwrap(), v);
            assert!(r.is_empty());
        }
    }

    #[test]
    fn malformed_inputs_are_errors() {
        let cases: &[&[u8]] = &[
            &[0x80],                                                       // truncated varint
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], // overflow
            &[0x0a, 0x05, 1, 2],                                           // truncated bytes
            &[0x09, 1, 2, 3],                                              // truncated fixed64
            &[0x0b],                                                       // group start
            &[0x00, 0x00],                                                 // field number 0
        ];
        for case in cases {
            let mut r = Reader::new(case);
            assert!(r.next_field().is_err(), "{case:?}");
        }
    }
}
