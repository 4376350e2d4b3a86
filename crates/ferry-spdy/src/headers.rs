//! SPDY/3 header blocks (section 2.6.10): name/value pairs, lower-case names, several values
//! of one name joined by NUL, compressed by one zlib stream per direction per session with the
//! SPDY dictionary preset and a sync flush after each block.

use bytes::{BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use crate::dictionary::dictionary;

/// Name/value pairs, names lower-case.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    pub fn new() -> Headers {
        Headers::default()
    }

    /// Adds a pair (the name lower-cased).
    pub fn with(mut self, name: &str, value: impl Into<String>) -> Headers {
        self.0.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// The first value of `name` (case-insensitive, as Go's canonical header names are).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Why a header block cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("header block: zlib: {0}")]
    Zlib(String),
    #[error("header block is truncated")]
    Truncated,
    #[error("header block is larger than {0} bytes")]
    TooLarge(usize),
    #[error("header name or value is not UTF-8")]
    NotUtf8,
}

/// The largest decompressed header block accepted.
pub const MAX_BLOCK: usize = 1 << 20;

/// Serializes pairs into an uncompressed block (pure; names of repeated pairs are merged).
pub fn encode_block(h: &Headers) -> Bytes {
    let mut merged: Vec<(String, String)> = Vec::new();
    for (n, v) in &h.0 {
        let n = n.to_ascii_lowercase();
        match merged.iter_mut().find(|(m, _)| *m == n) {
            Some((_, existing)) => {
                existing.push('\0');
                existing.push_str(v);
            }
            None => merged.push((n, v.clone())),
        }
    }
    let mut b = BytesMut::new();
    b.put_u32(merged.len() as u32);
    for (n, v) in merged {
        b.put_u32(n.len() as u32);
        b.put_slice(n.as_bytes());
        b.put_u32(v.len() as u32);
        b.put_slice(v.as_bytes());
    }
    b.freeze()
}

/// Parses an uncompressed block (pure). NUL-joined values become several pairs.
pub fn decode_block(b: &[u8]) -> Result<Headers, HeaderError> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], HeaderError> {
        if b.len() < n {
            return Err(HeaderError::Truncated);
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head)
    }
    fn len(b: &mut &[u8]) -> Result<usize, HeaderError> {
        let x = take(b, 4)?;
        Ok(u32::from_be_bytes([x[0], x[1], x[2], x[3]]) as usize)
    }
    let mut b = b;
    let count = len(&mut b)?;
    let mut out = Vec::new();
    for _ in 0..count {
        let n = len(&mut b)?;
        let name = std::str::from_utf8(take(&mut b, n)?).map_err(|_| HeaderError::NotUtf8)?;
        let n = len(&mut b)?;
        let value = std::str::from_utf8(take(&mut b, n)?).map_err(|_| HeaderError::NotUtf8)?;
        for v in value.split('\0') {
            out.push((name.to_ascii_lowercase(), v.to_string()));
        }
    }
    Ok(Headers(out))
}

/// The sending side's zlib stream.
pub struct Compressor {
    z: Compress,
}

impl Default for Compressor {
    fn default() -> Self {
        Self::new()
    }
}

impl Compressor {
    pub fn new() -> Compressor {
        let mut z = Compress::new(Compression::default(), true);
        // Cannot fail on a fresh stream.
        let _ = z.set_dictionary(dictionary());
        Compressor { z }
    }

    /// Compresses one header block (sync flush: the peer can read it at once).
    pub fn compress(&mut self, h: &Headers) -> Result<Bytes, HeaderError> {
        let raw = encode_block(h);
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input: &[u8] = &raw;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(256);
            }
            let before = self.z.total_in();
            self.z
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| HeaderError::Zlib(e.to_string()))?;
            let used = (self.z.total_in() - before) as usize;
            input = &input[used..];
            // Done once all input is in and the flush left spare room in `out`.
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(Bytes::from(out));
            }
        }
    }
}

/// The receiving side's zlib stream.
pub struct Decompressor {
    z: Decompress,
}

impl Default for Decompressor {
    fn default() -> Self {
        Self::new()
    }
}

impl Decompressor {
    pub fn new() -> Decompressor {
        Decompressor {
            z: Decompress::new(true),
        }
    }

    /// Inflates one compressed header block and parses it.
    pub fn decompress(&mut self, block: &[u8]) -> Result<Headers, HeaderError> {
        let mut out: Vec<u8> = Vec::with_capacity(block.len() * 4 + 64);
        let mut input = block;
        loop {
            if out.capacity() - out.len() < 64 {
                if out.len() >= MAX_BLOCK {
                    return Err(HeaderError::TooLarge(MAX_BLOCK));
                }
                out.reserve(out.len().max(256));
            }
            let before = self.z.total_in();
            let out_before = out.len();
            let r = self
                .z
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            let used = (self.z.total_in() - before) as usize;
            input = &input[used..];
            let progressed = used > 0 || out.len() > out_before;
            let room = out.len() < out.capacity();
            match r {
                Ok(st) => {
                    if input.is_empty() && room {
                        break;
                    }
                    if matches!(st, Status::StreamEnd) {
                        return Err(HeaderError::Zlib("data after the end of the stream".into()));
                    }
                    if !progressed && room {
                        return Err(HeaderError::Zlib("no progress".into()));
                    }
                }
                Err(e) => {
                    if e.needs_dictionary().is_some() {
                        self.z
                            .set_dictionary(dictionary())
                            .map_err(|e| HeaderError::Zlib(e.to_string()))?;
                        continue;
                    }
                    return Err(HeaderError::Zlib(e.to_string()));
                }
            }
        }
        decode_block(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn blocks_round_trip_through_one_stream() {
        let mut c = Compressor::new();
        let mut d = Decompressor::new();
        let blocks = [
            Headers::new()
                .with("streamType", "error")
                .with("port", "8080")
                .with("requestID", "0"),
            Headers::new(),
            Headers::new().with("streamtype", "stdout"),
        ];
        for h in &blocks {
            let z = c.compress(h).expect("compress");
            let got = d.decompress(&z).expect("decompress");
            let want = Headers(
                h.0.iter()
                    .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
                    .collect(),
            );
            assert_eq!(got, want);
        }
        assert_eq!(
            blocks[0].get("STREAMTYPE").or(blocks[0].get("streamtype")),
            Some("error")
        );
    }

    #[test]
    fn zlib_header_names_the_spdy_dictionary() {
        let z = Compressor::new()
            .compress(&Headers::new())
            .expect("compress");
        // CMF/FLG with FDICT set, then DICTID = Adler-32 of the SPDY/3 dictionary.
        assert_eq!(z[1] & 0x20, 0x20);
        assert_eq!(&z[2..6], &0xe3c6_a7c2u32.to_be_bytes());
    }

    #[test]
    fn repeated_names_are_nul_joined() {
        let h = Headers::new().with("a", "1").with("A", "2");
        let raw = encode_block(&h);
        assert_eq!(&raw[..], b"\0\0\0\x01\0\0\0\x01a\0\0\0\x031\x002");
        assert_eq!(decode_block(&raw).expect("decode"), h);
    }

    #[test]
    fn broken_blocks_are_errors() {
        assert_eq!(
            decode_block(b"\0\0\0\x02\0\0\0\x01a"),
            Err(HeaderError::Truncated)
        );
        assert!(Decompressor::new().decompress(b"not zlib at all").is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_blocks_end_without_panic(
            blocks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..4),
            valid_first: bool,
        ) {
            let mut d = Decompressor::new();
            if valid_first {
                let z = Compressor::new().compress(&Headers::new().with("a", "b")).expect("z");
                prop_assert!(d.decompress(&z).is_ok());
            }
            for b in blocks {
                let _ = d.decompress(&b);
            }
        }

        #[test]
        fn any_headers_round_trip(pairs in proptest::collection::vec(("[a-z-]{1,12}", "[ -~]{0,40}"), 0..8)) {
            let mut c = Compressor::new();
            let mut d = Decompressor::new();
            let mut h = Headers::new();
            let mut seen: Vec<String> = Vec::new();
            for (n, v) in pairs {
                if seen.contains(&n) { continue; }
                seen.push(n.clone());
                h = h.with(&n, v);
            }
            for _ in 0..2 {
                let z = c.compress(&h).expect("compress");
                prop_assert_eq!(d.decompress(&z).expect("decompress"), h.clone());
            }
        }
    }
}
