//! SPDY/3 frames (draft-mbelshe-httpbis-spdy-00, section 2.2 and 2.6): parsing from and
//! encoding to bytes. Pure: header blocks stay compressed here ([`crate::headers`] handles
//! them).

use bytes::{BufMut, Bytes, BytesMut};

/// The only SPDY version spoken (SPDY/3.1 frames are SPDY/3 frames).
pub const VERSION: u16 = 3;
/// FLAG_FIN on DATA, SYN_STREAM, SYN_REPLY and HEADERS frames.
pub const FLAG_FIN: u8 = 0x01;
/// FLAG_UNIDIRECTIONAL on SYN_STREAM.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// The largest frame payload accepted (the length field allows 16 MiB; peers such as Go's
/// spdystream send at most 32 KiB of data per frame).
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024 - 1;

/// RST_STREAM status codes.
pub mod rst {
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INVALID_STREAM: u32 = 2;
    pub const REFUSED_STREAM: u32 = 3;
    pub const CANCEL: u32 = 5;
    pub const INTERNAL_ERROR: u32 = 6;
    pub const STREAM_IN_USE: u32 = 8;
}

/// A frame; `block`s are compressed header blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream: u32,
        fin: bool,
        data: Bytes,
    },
    SynStream {
        stream: u32,
        associated: u32,
        priority: u8,
        flags: u8,
        block: Bytes,
    },
    SynReply {
        stream: u32,
        fin: bool,
        block: Bytes,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    /// (flags, id, value) entries.
    Settings {
        clear: bool,
        entries: Vec<(u8, u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        fin: bool,
        block: Bytes,
    },
    WindowUpdate {
        stream: u32,
        delta: u32,
    },
    /// A control frame of a type this implementation ignores (CREDENTIAL, NOOP, unknown):
    /// the specification says to ignore them.
    Ignored {
        kind: u16,
    },
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("unsupported SPDY version {0}")]
    Version(u16),
    #[error("{kind} frame too short ({len} bytes)")]
    Short { kind: &'static str, len: usize },
    #[error("frame payload of {0} bytes is too large")]
    TooLarge(usize),
    #[error("stream id 0 in a {0} frame")]
    ZeroStream(&'static str),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn need(kind: &'static str, p: &[u8], n: usize) -> Result<(), FrameError> {
    if p.len() < n {
        Err(FrameError::Short { kind, len: p.len() })
    } else {
        Ok(())
    }
}

fn stream_id(kind: &'static str, p: &[u8]) -> Result<u32, FrameError> {
    need(kind, p, 4)?;
    let id = u32_at(p, 0) & 0x7fff_ffff;
    if id == 0 {
        return Err(FrameError::ZeroStream(kind));
    }
    Ok(id)
}

/// Parses one frame from the front of `buf`. `Ok(None)`: more bytes are needed. On success
/// returns the frame and how many bytes it took.
pub fn parse(buf: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
    if buf.len() < 8 {
        return Ok(None);
    }
    let flags = buf[4];
    let len = ((buf[5] as usize) << 16) | ((buf[6] as usize) << 8) | buf[7] as usize;
    if len > MAX_PAYLOAD {
        return Err(FrameError::TooLarge(len));
    }
    if buf.len() < 8 + len {
        return Ok(None);
    }
    let p = &buf[8..8 + len];
    let used = 8 + len;
    if buf[0] & 0x80 == 0 {
        let stream = u32_at(buf, 0) & 0x7fff_ffff;
        if stream == 0 {
            return Err(FrameError::ZeroStream("DATA"));
        }
        let frame = Frame::Data {
            stream,
            fin: flags & FLAG_FIN != 0,
            data: Bytes::copy_from_slice(p),
        };
        return Ok(Some((frame, used)));
    }
    let version = u16::from_be_bytes([buf[0] & 0x7f, buf[1]]);
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    let kind = u16::from_be_bytes([buf[2], buf[3]]);
    let frame = match kind {
        1 => {
            need("SYN_STREAM", p, 10)?;
            Frame::SynStream {
                stream: stream_id("SYN_STREAM", p)?,
                associated: u32_at(p, 4) & 0x7fff_ffff,
                priority: p[8] >> 5,
                flags,
                block: Bytes::copy_from_slice(&p[10..]),
            }
        }
        2 => Frame::SynReply {
            stream: stream_id("SYN_REPLY", p)?,
            fin: flags & FLAG_FIN != 0,
            block: Bytes::copy_from_slice(&p[4..]),
        },
        3 => {
            need("RST_STREAM", p, 8)?;
            Frame::RstStream {
                stream: u32_at(p, 0) & 0x7fff_ffff,
                status: u32_at(p, 4),
            }
        }
        4 => {
            need("SETTINGS", p, 4)?;
            let n = u32_at(p, 0) as usize;
            need("SETTINGS", p, 4 + n.saturating_mul(8))?;
            let entries = (0..n)
                .map(|i| {
                    let at = 4 + i * 8;
                    (p[at], u32_at(p, at) & 0x00ff_ffff, u32_at(p, at + 4))
                })
                .collect();
            Frame::Settings {
                clear: flags & 0x01 != 0,
                entries,
            }
        }
        6 => {
            need("PING", p, 4)?;
            Frame::Ping { id: u32_at(p, 0) }
        }
        7 => {
            need("GOAWAY", p, 8)?;
            Frame::GoAway {
                last_good: u32_at(p, 0) & 0x7fff_ffff,
                status: u32_at(p, 4),
            }
        }
        8 => Frame::Headers {
            stream: stream_id("HEADERS", p)?,
            fin: flags & FLAG_FIN != 0,
            block: Bytes::copy_from_slice(&p[4..]),
        },
        9 => {
            need("WINDOW_UPDATE", p, 8)?;
            Frame::WindowUpdate {
                stream: u32_at(p, 0) & 0x7fff_ffff,
                delta: u32_at(p, 4) & 0x7fff_ffff,
            }
        }
        other => Frame::Ignored { kind: other },
    };
    Ok(Some((frame, used)))
}

fn control(out: &mut BytesMut, kind: u16, flags: u8, payload: &[u8]) {
    out.put_u16(0x8000 | VERSION);
    out.put_u16(kind);
    out.put_u8(flags);
    let len = payload.len().min(MAX_PAYLOAD) as u32;
    out.put_uint(len as u64, 3);
    out.put_slice(&payload[..len as usize]);
}

impl Frame {
    /// Appends the frame's wire form to `out`. Payloads over [`MAX_PAYLOAD`] are cut: split
    /// DATA first (see [`data_frames`]).
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Frame::Data { stream, fin, data } => {
                out.put_u32(stream & 0x7fff_ffff);
                out.put_u8(if *fin { FLAG_FIN } else { 0 });
                let len = data.len().min(MAX_PAYLOAD);
                out.put_uint(len as u64, 3);
                out.put_slice(&data[..len]);
            }
            Frame::SynStream {
                stream,
                associated,
                priority,
                flags,
                block,
            } => {
                let mut p = BytesMut::with_capacity(10 + block.len());
                p.put_u32(stream & 0x7fff_ffff);
                p.put_u32(associated & 0x7fff_ffff);
                p.put_u8((priority & 0x07) << 5);
                p.put_u8(0);
                p.put_slice(block);
                control(out, 1, *flags, &p);
            }
            Frame::SynReply { stream, fin, block } | Frame::Headers { stream, fin, block } => {
                let kind = if matches!(self, Frame::SynReply { .. }) {
                    2
                } else {
                    8
                };
                let mut p = BytesMut::with_capacity(4 + block.len());
                p.put_u32(stream & 0x7fff_ffff);
                p.put_slice(block);
                control(out, kind, if *fin { FLAG_FIN } else { 0 }, &p);
            }
            Frame::RstStream { stream, status } => {
                let mut p = BytesMut::with_capacity(8);
                p.put_u32(stream & 0x7fff_ffff);
                p.put_u32(*status);
                control(out, 3, 0, &p);
            }
            Frame::Settings { clear, entries } => {
                let mut p = BytesMut::with_capacity(4 + 8 * entries.len());
                p.put_u32(entries.len() as u32);
                for (f, id, v) in entries {
                    p.put_u8(*f);
                    p.put_uint((id & 0x00ff_ffff) as u64, 3);
                    p.put_u32(*v);
                }
                control(out, 4, u8::from(*clear), &p);
            }
            Frame::Ping { id } => control(out, 6, 0, &id.to_be_bytes()),
            Frame::GoAway { last_good, status } => {
                let mut p = BytesMut::with_capacity(8);
                p.put_u32(last_good & 0x7fff_ffff);
                p.put_u32(*status);
                control(out, 7, 0, &p);
            }
            Frame::WindowUpdate { stream, delta } => {
                let mut p = BytesMut::with_capacity(8);
                p.put_u32(stream & 0x7fff_ffff);
                p.put_u32(delta & 0x7fff_ffff);
                control(out, 9, 0, &p);
            }
            Frame::Ignored { .. } => {}
        }
    }

    /// The frame as bytes.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::new();
        self.encode(&mut b);
        b.freeze()
    }
}

/// DATA frames carrying `data` on `stream`, at most `chunk` bytes each; the last has `fin`.
/// Empty data with `fin` is one empty frame.
pub fn data_frames(stream: u32, data: Bytes, fin: bool, chunk: usize) -> Vec<Frame> {
    let chunk = chunk.clamp(1, MAX_PAYLOAD);
    if data.is_empty() {
        return vec![Frame::Data { stream, fin, data }];
    }
    let n = data.len().div_ceil(chunk);
    (0..n)
        .map(|i| Frame::Data {
            stream,
            fin: fin && i + 1 == n,
            data: data.slice(i * chunk..((i + 1) * chunk).min(data.len())),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(f: Frame) {
        let b = f.to_bytes();
        let (g, used) = parse(&b).expect("parse").expect("complete");
        assert_eq!(used, b.len());
        assert_eq!(g, f);
        // Every strict prefix asks for more bytes.
        for cut in 0..b.len() {
            assert_eq!(parse(&b[..cut]), Ok(None), "{f:?} cut at {cut}");
        }
    }

    #[test]
    fn every_kind_round_trips() {
        for f in [
            Frame::Data {
                stream: 1,
                fin: true,
                data: Bytes::from_static(b"hello"),
            },
            Frame::SynStream {
                stream: 3,
                associated: 0,
                priority: 7,
                flags: FLAG_FIN | FLAG_UNIDIRECTIONAL,
                block: Bytes::from_static(b"\x78\x01"),
            },
            Frame::SynReply {
                stream: 3,
                fin: false,
                block: Bytes::from_static(b"abc"),
            },
            Frame::RstStream {
                stream: 5,
                status: rst::CANCEL,
            },
            Frame::Settings {
                clear: false,
                entries: vec![(0, 7, 65536), (1, 4, 100)],
            },
            Frame::Ping { id: 0xdead_beef },
            Frame::GoAway {
                last_good: 9,
                status: 0,
            },
            Frame::Headers {
                stream: 1,
                fin: true,
                block: Bytes::new(),
            },
            Frame::WindowUpdate {
                stream: 1,
                delta: 1 << 20,
            },
        ] {
            roundtrip(f);
        }
    }

    #[test]
    fn wire_layout_is_the_specifications() {
        // A PING with id 1: control bit + version 3, type 6, no flags, length 4.
        assert_eq!(
            &Frame::Ping { id: 1 }.to_bytes()[..],
            &[0x80, 0x03, 0x00, 0x06, 0x00, 0x00, 0x00, 0x04, 0, 0, 0, 1]
        );
        // DATA on stream 5 with FIN: no control bit, stream id, flags, 24-bit length.
        assert_eq!(
            &Frame::Data {
                stream: 5,
                fin: true,
                data: Bytes::from_static(b"ab")
            }
            .to_bytes()[..],
            &[0, 0, 0, 5, 0x01, 0, 0, 2, b'a', b'b']
        );
    }

    #[test]
    fn bad_frames_are_errors() {
        // SPDY/2 control frame.
        assert_eq!(
            parse(&[0x80, 0x02, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]),
            Err(FrameError::Version(2))
        );
        // DATA on stream 0.
        assert_eq!(
            parse(&[0, 0, 0, 0, 0, 0, 0, 0]),
            Err(FrameError::ZeroStream("DATA"))
        );
        // RST_STREAM with a 4-byte payload.
        assert!(matches!(
            parse(&[0x80, 0x03, 0, 3, 0, 0, 0, 4, 0, 0, 0, 1]),
            Err(FrameError::Short { .. })
        ));
        // SETTINGS claiming more entries than it holds.
        assert!(matches!(
            parse(&[0x80, 0x03, 0, 4, 0, 0, 0, 4, 0, 0, 0, 9]),
            Err(FrameError::Short { .. })
        ));
        // CREDENTIAL (type 10) is ignored, not an error.
        assert_eq!(
            parse(&[0x80, 0x03, 0, 10, 0, 0, 0, 0]),
            Ok(Some((Frame::Ignored { kind: 10 }, 8)))
        );
    }

    #[test]
    fn data_is_split() {
        let f = data_frames(1, Bytes::from_static(b"abcdefg"), true, 3);
        let sizes: Vec<(usize, bool)> = f
            .iter()
            .map(|f| match f {
                Frame::Data { data, fin, .. } => (data.len(), *fin),
                _ => (0, false),
            })
            .collect();
        assert_eq!(sizes, vec![(3, false), (3, false), (1, true)]);
        assert_eq!(data_frames(1, Bytes::new(), true, 3).len(), 1);
    }

    proptest! {
        #[test]
        fn data_frames_round_trip(stream in 1u32..0x7fff_ffff, fin: bool,
                                  data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let f = Frame::Data { stream, fin, data: Bytes::from(data) };
            let b = f.to_bytes();
            prop_assert_eq!(parse(&b), Ok(Some((f, b.len()))));
        }

        #[test]
        fn parsing_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = parse(&b);
        }
    }
}
