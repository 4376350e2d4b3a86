//! The write-ahead log of the redb backend.
//!
//! A redb commit with immediate durability writes every B-tree page the transaction touched
//! (the `kv`, `log` and `meta` trees, the table tree, the freed-page records) at scattered
//! offsets and then syncs the file. Appending one record to a log and syncing it costs one
//! sequential write. So each write batch is made durable here first, then committed to redb
//! without durability; every [`RedbOptions::checkpoint_bytes`](crate::RedbOptions) of log a
//! durable redb commit (a *checkpoint*) persists everything and the log starts over at offset 0.
//!
//! # Format
//!
//! The file is a sequence of records, each
//!
//! ```text
//! payload_len u32 | crc32(payload) u32 | payload
//! payload: (revision i64 | entry_len u32 | log entry)+
//! ```
//!
//! (little endian; a log entry is what the `log` table stores for that revision, see the private
//! `codec` module). The file is grown in zero-filled chunks so that the sync after an append does
//! not also have to persist a new file size or allocate blocks.
//!
//! # Recovery
//!
//! Starting over at offset 0 leaves older records after the new ones. Recovery therefore reads
//! records up to the first one that is torn or fails its checksum, flattens their entries, skips
//! the leading entries at or below the revision redb already holds durably, applies the entries
//! that continue it one revision after the other, and stops at the first one that does not
//! (an older record left behind by a restart of the log). A write is acknowledged only after its
//! record is synced, so every acknowledged write is found again; a record written but not synced
//! before a crash may or may not be, as with any database.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::Revision;

/// Bytes of a record header (payload length and checksum).
const HEADER: usize = 8;
/// Bytes of an entry header (revision and entry length).
const ENTRY_HEADER: usize = 12;
/// The file grows by at least this much at a time, zero-filled.
const GROW: u64 = 1 << 20;

/// CRC-32 (IEEE 802.3, reflected, as zlib's `crc32`), table driven.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// Builds one record from its entries (one batch: a run of consecutive revisions).
#[derive(Debug)]
pub(crate) struct RecordBuilder {
    /// The record with room for its header at the front.
    buf: Vec<u8>,
}

impl Default for RecordBuilder {
    fn default() -> Self {
        RecordBuilder::new()
    }
}

impl RecordBuilder {
    pub(crate) fn new() -> RecordBuilder {
        RecordBuilder {
            buf: vec![0; HEADER],
        }
    }

    pub(crate) fn push(&mut self, revision: Revision, entry: &[u8]) {
        // Entries are store values (at most 1.5 MiB) plus a little framing.
        let len = u32::try_from(entry.len()).unwrap_or(u32::MAX);
        self.buf.extend_from_slice(&revision.to_le_bytes());
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(&entry[..len as usize]);
    }

    /// The finished record (header filled in).
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let payload_len = u32::try_from(self.buf.len() - HEADER).unwrap_or(u32::MAX);
        let crc = crc32(&self.buf[HEADER..]);
        self.buf[..4].copy_from_slice(&payload_len.to_le_bytes());
        self.buf[4..HEADER].copy_from_slice(&crc.to_le_bytes());
        self.buf
    }
}

/// One entry read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) revision: Revision,
    pub(crate) raw: Vec<u8>,
}

fn le_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?))
}

fn le_i64(b: &[u8]) -> Option<i64> {
    Some(i64::from_le_bytes(b.get(..8)?.try_into().ok()?))
}

/// Splits a record payload into entries; `None` if it is malformed.
fn parse_payload(mut p: &[u8]) -> Option<Vec<Entry>> {
    let mut entries = Vec::new();
    while !p.is_empty() {
        let revision = le_i64(p)?;
        let len = le_u32(p.get(8..)?)? as usize;
        let raw = p.get(ENTRY_HEADER..ENTRY_HEADER.checked_add(len)?)?;
        entries.push(Entry {
            revision,
            raw: raw.to_vec(),
        });
        p = &p[ENTRY_HEADER + len..];
    }
    if entries.is_empty() {
        return None;
    }
    Some(entries)
}

/// Every entry of the well-formed records at the start of `data`, in file order. Reading stops
/// at a zero length (unused, zero-filled space), a record running past the end, a checksum
/// mismatch or a malformed payload.
pub(crate) fn read_entries(data: &[u8]) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(header) = data.get(at..at + HEADER) {
        let Some(len) = le_u32(header).map(|l| l as usize) else {
            break;
        };
        let Some(crc) = le_u32(&header[4..]) else {
            break;
        };
        if len == 0 {
            break;
        }
        let Some(payload) = at
            .checked_add(HEADER + len)
            .and_then(|end| data.get(at + HEADER..end))
        else {
            break;
        };
        if crc32(payload) != crc {
            break;
        }
        let Some(entries) = parse_payload(payload) else {
            break;
        };
        out.extend(entries);
        at += HEADER + len;
    }
    out
}

/// The entries to apply on top of a store whose durable revision is `durable`: after skipping
/// leading entries at or below it, those continuing it one revision after the other.
pub(crate) fn redo(entries: Vec<Entry>, durable: Revision) -> Vec<Entry> {
    let mut next = durable + 1;
    let mut out = Vec::new();
    for e in entries {
        if out.is_empty() && e.revision < next {
            continue;
        }
        if e.revision != next {
            break;
        }
        next += 1;
        out.push(e);
    }
    out
}

/// What the log needs from its file: positioned writes and a data sync. A trait so that tests
/// can put a file that fails on demand in its place.
pub(crate) trait LogFile: Send + std::fmt::Debug {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    fn sync_data(&self) -> io::Result<()>;
}

impl LogFile for File {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
}

/// The open log file: appends records and syncs them.
#[derive(Debug)]
pub(crate) struct Wal {
    file: Box<dyn LogFile>,
    path: PathBuf,
    /// Where the next record goes.
    offset: u64,
    /// Where the last record appended starts.
    last: u64,
    /// The file's length (zero-filled beyond `offset`).
    allocated: u64,
}

impl Wal {
    /// The log file that belongs to the database file `db`.
    pub(crate) fn path_for(db: &Path) -> PathBuf {
        let mut name = db.file_name().unwrap_or_default().to_os_string();
        name.push(".wal");
        db.with_file_name(name)
    }

    /// Reads every entry the file at `path` holds (none if it is missing).
    pub(crate) fn read(path: &Path) -> io::Result<Vec<Entry>> {
        match std::fs::read(path) {
            Ok(data) => Ok(read_entries(&data)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Opens (creating it `0600` if missing) the log at `path` for appending from offset 0:
    /// the caller has made everything the file held durable elsewhere.
    pub(crate) fn open(path: &Path) -> io::Result<Wal> {
        let file = crate::private_fs::private_open_options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        crate::private_fs::enforce_mode(path, 0o600)?;
        let allocated = file.metadata()?.len();
        Ok(Wal {
            file: Box::new(file),
            path: path.to_path_buf(),
            offset: 0,
            last: 0,
            allocated,
        })
    }

    /// The same log writing through `wrap(file)` instead (tests inject failures with it).
    pub(crate) fn wrap_file(
        mut self,
        wrap: impl FnOnce(Box<dyn LogFile>) -> Box<dyn LogFile>,
    ) -> Wal {
        self.file = wrap(self.file);
        self
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the log and removes its file: for when every record it holds is durable in the
    /// database (or must never be replayed). An error leaves the file in place.
    pub(crate) fn retire(self) -> io::Result<()> {
        let Wal { file, path, .. } = self;
        drop(file);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Bytes appended since the log last started over.
    pub(crate) fn len(&self) -> u64 {
        self.offset
    }

    /// Writes `record` at the end of the log and syncs it: when this returns `Ok`, the record
    /// survives a crash.
    pub(crate) fn append(&mut self, record: &[u8]) -> io::Result<()> {
        let end = self.offset + record.len() as u64;
        if end > self.allocated {
            // Zero-fill ahead so that the syncs of the next appends carry no metadata.
            let grow = (end - self.allocated).max(GROW).max(self.allocated / 4);
            let zeros = vec![0u8; usize::try_from(grow).unwrap_or(usize::MAX)];
            self.file.write_all_at(&zeros, self.allocated)?;
            self.allocated += zeros.len() as u64;
        }
        self.file.write_all_at(record, self.offset)?;
        self.file.sync_data()?;
        self.last = self.offset;
        self.offset = end;
        Ok(())
    }

    /// Makes sure the file has room for the next records (zero-filled, synced): a new log
    /// proves the file system takes writes again.
    pub(crate) fn preallocate(&mut self) -> io::Result<()> {
        if self.allocated >= GROW {
            return Ok(());
        }
        let zeros = vec![0u8; (GROW - self.allocated) as usize];
        self.file.write_all_at(&zeros, self.allocated)?;
        self.file.sync_data()?;
        self.allocated = GROW;
        Ok(())
    }

    /// Takes back the last record appended (of a batch that failed after its append): zeroes
    /// its header and syncs, so that recovery stops before it, and appends over it next.
    /// Writes into allocated space only.
    pub(crate) fn blank_last(&mut self) -> io::Result<()> {
        self.file.write_all_at(&[0u8; HEADER], self.last)?;
        self.file.sync_data()?;
        self.offset = self.last;
        Ok(())
    }

    /// Starts over at offset 0 (after a checkpoint made every record durable in the database).
    /// Nothing is written: recovery tells the records left behind from new ones by revision.
    pub(crate) fn restart(&mut self) {
        self.offset = 0;
        self.last = 0;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(entries: &[(Revision, &[u8])]) -> Vec<u8> {
        let mut b = RecordBuilder::new();
        for (rev, raw) in entries {
            b.push(*rev, raw);
        }
        b.finish()
    }

    fn revs(entries: &[Entry]) -> Vec<Revision> {
        entries.iter().map(|e| e.revision).collect()
    }

    #[test]
    fn crc32_known_values() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
    }

    #[test]
    fn records_round_trip() {
        let mut data = record(&[(1, b"a"), (2, b"")]);
        data.extend(record(&[(3, b"ccc")]));
        data.extend([0u8; 64]);
        let got = read_entries(&data);
        assert_eq!(revs(&got), [1, 2, 3]);
        assert_eq!(got[0].raw, b"a");
        assert_eq!(got[1].raw, b"");
        assert_eq!(got[2].raw, b"ccc");
    }

    #[test]
    fn reading_stops_at_damage() {
        let first = record(&[(1, b"one")]);
        let second = record(&[(2, b"two")]);
        let whole: Vec<u8> = [first.clone(), second.clone()].concat();
        // (what is done to the bytes, entries still read)
        let cases: Vec<(&str, Vec<u8>, Vec<Revision>)> = vec![
            ("intact", whole.clone(), vec![1, 2]),
            (
                "torn second record",
                whole[..whole.len() - 1].to_vec(),
                vec![1],
            ),
            (
                "torn second header",
                whole[..first.len() + 5].to_vec(),
                vec![1],
            ),
            (
                "flipped payload bit",
                {
                    let mut d = whole.clone();
                    let i = first.len() + HEADER + 2;
                    d[i] ^= 1;
                    d
                },
                vec![1],
            ),
            (
                "flipped checksum",
                {
                    let mut d = whole.clone();
                    d[5] ^= 0x80;
                    d
                },
                vec![],
            ),
            (
                "huge length",
                {
                    let mut d = whole.clone();
                    d[..4].copy_from_slice(&u32::MAX.to_le_bytes());
                    d
                },
                vec![],
            ),
            ("empty", vec![], vec![]),
            ("zeros", vec![0; 100], vec![]),
        ];
        for (name, data, want) in cases {
            assert_eq!(revs(&read_entries(&data)), want, "{name}");
        }
    }

    #[test]
    fn malformed_payload_with_valid_checksum_stops_reading() {
        // An entry claiming more bytes than the payload has.
        let mut payload = Vec::new();
        payload.extend_from_slice(&7i64.to_le_bytes());
        payload.extend_from_slice(&100u32.to_le_bytes());
        payload.extend_from_slice(b"short");
        let mut data = Vec::new();
        data.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        data.extend_from_slice(&crc32(&payload).to_le_bytes());
        data.extend_from_slice(&payload);
        assert!(read_entries(&data).is_empty());
    }

    fn entries(revs: &[Revision]) -> Vec<Entry> {
        revs.iter()
            .map(|&revision| Entry {
                revision,
                raw: vec![],
            })
            .collect()
    }

    #[test]
    fn redo_decisions() {
        // (entries in file order, durable revision, revisions to apply)
        let cases: &[(&[Revision], Revision, &[Revision])] = &[
            (&[], 0, &[]),
            (&[1, 2, 3], 0, &[1, 2, 3]),
            // Already durable (a crash after the checkpoint, before new writes).
            (&[1, 2, 3], 3, &[]),
            (&[1, 2, 3], 1, &[2, 3]),
            // New records at the start, older ones left behind after them.
            (&[11, 12, 3, 4, 5], 10, &[11, 12]),
            // Only older ones: nothing to do.
            (&[3, 4, 5], 10, &[]),
            // A gap (lost record) stops the redo: nothing after it can be applied.
            (&[11, 13], 10, &[11]),
            (&[12, 13], 10, &[]),
        ];
        for (file, durable, want) in cases {
            assert_eq!(
                revs(&redo(entries(file), *durable)),
                *want,
                "{file:?} over {durable}"
            );
        }
    }

    #[test]
    fn append_restart_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = Wal::path_for(&dir.path().join("store.redb"));
        assert_eq!(path, dir.path().join("store.redb.wal"));
        let mut wal = Wal::open(&path).unwrap();
        wal.append(&record(&[(1, b"a"), (2, b"b")])).unwrap();
        wal.append(&record(&[(3, b"c")])).unwrap();
        assert_eq!(revs(&Wal::read(&path).unwrap()), [1, 2, 3]);
        assert!(std::fs::metadata(&path).unwrap().len() >= GROW);
        // After a checkpoint at 3 the log starts over; 4 overwrites the start of the file.
        wal.restart();
        assert_eq!(wal.len(), 0);
        wal.append(&record(&[(4, b"d")])).unwrap();
        let read = Wal::read(&path).unwrap();
        assert_eq!(revs(&redo(read, 3)), [4]);
        // A reopened log appends from the start again.
        drop(wal);
        let wal = Wal::open(&path).unwrap();
        assert_eq!(wal.len(), 0);
        assert!(
            Wal::read(&dir.path().join("absent.wal"))
                .unwrap()
                .is_empty()
        );
    }

    proptest! {
        /// Whatever a crash leaves (any prefix of what was written, over any older file
        /// content), reading never panics and redo yields a gap-free run after the durable
        /// revision that is a prefix of what was written after it.
        #[test]
        fn any_torn_log_redoes_a_prefix(
            batches in proptest::collection::vec(1usize..4, 1..8),
            cut in 0usize..400,
            old in proptest::collection::vec(any::<u8>(), 0..300),
            durable in 0i64..6,
        ) {
            let mut data = Vec::new();
            let mut rev = 0;
            for n in &batches {
                let es: Vec<(Revision, Vec<u8>)> = (0..*n).map(|_| { rev += 1; (rev, vec![rev as u8; 3]) }).collect();
                let refs: Vec<(Revision, &[u8])> = es.iter().map(|(r, v)| (*r, v.as_slice())).collect();
                data.extend(record(&refs));
            }
            let cut = cut.min(data.len());
            let mut file = data[..cut].to_vec();
            if old.len() > cut {
                file.extend_from_slice(&old[cut..]);
            }
            let got = redo(read_entries(&file), durable);
            for (i, e) in got.iter().enumerate() {
                prop_assert_eq!(e.revision, durable + 1 + i as i64);
                prop_assert_eq!(&e.raw, &vec![e.revision as u8; 3]);
            }
            prop_assert!(got.len() as i64 <= (rev - durable).max(0));
        }
    }
}
