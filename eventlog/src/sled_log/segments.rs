//! Segment files: where checkpoints put records, compressed a run at a
//! time, with sled holding one small index entry a run.
//!
//! `DATA_DIR/segments/NNNNNNNN` are append-only files of runs. A run is
//! consecutive records of one session, one zstd frame of `len: u32 LE ‖
//! sealed bytes` for each; a checkpoint writes all of its runs in one
//! `write(2)` at the end of the current segment and `fdatasync`s it (and
//! the directory, for a new file) before sled learns of them, so an index
//! entry never points at bytes a power cut can take back. Bytes a failed
//! checkpoint wrote past what any index entry points at are never read:
//! the next checkpoint writes after them. Nothing in a segment is ever
//! changed; a segment rolls at [`SEGMENT_FILE_BYTES`].
//!
//! sled keys a run `r ‖ session ‖ first seq` (big-endian), its value a
//! [`RunEntry`]. A run stops below the first seq of the session's next run:
//! a checkpoint after a crash may write again from a seq an older run
//! holds (its records past the session's head were never acknowledged).

use super::*;
use std::os::unix::fs::FileExt;

pub(super) const RUN_PREFIX: u8 = b'r';
/// A segment file is not written past this; the next checkpoint starts one.
const SEGMENT_FILE_BYTES: u64 = 64 << 20;
/// A session's pending records are cut into runs of at most this many
/// uncompressed bytes (a record bigger than that is a run of its own), so
/// reading one record decompresses at most this much besides it.
const RUN_BYTES: usize = 64 << 10;
/// The most bytes a run can hold uncompressed: a record of the largest size
/// alone, or records up to [`RUN_BYTES`] with a 4-byte length each (a
/// record has at least one byte). An index entry naming more is damage,
/// refused before anything is read or allocated for it.
const MAX_RUN_RAW: u32 = (crate::MAX_RECORD_BYTES + 4 + RUN_BYTES * 5) as u32;
/// The most bytes such a run takes compressed (zstd's bound, rounded up).
const MAX_RUN_FRAME: u32 = MAX_RUN_RAW + MAX_RUN_RAW / 128 + (1 << 10);
/// zstd level of a run: zstd's default, a run is compressed once.
const RUN_LEVEL: i32 = 3;
const SEGMENTS_DIR: &str = "segments";

/// Where a run is: its segment, offset and length there, its last seq, and
/// its uncompressed length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RunEntry {
    pub(super) segment: u32,
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) raw_len: u32,
    pub(super) last: u64,
}

impl RunEntry {
    const BYTES: usize = 28;

    pub(super) fn encode(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[..4].copy_from_slice(&self.segment.to_le_bytes());
        out[4..12].copy_from_slice(&self.offset.to_le_bytes());
        out[12..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..20].copy_from_slice(&self.raw_len.to_le_bytes());
        out[20..].copy_from_slice(&self.last.to_le_bytes());
        out
    }

    /// The entry of a run starting at seq `first`, or why these bytes
    /// cannot be one (a length past what a run can take, a last seq
    /// before its first).
    pub(super) fn decode(bytes: &[u8], first: u64) -> Result<RunEntry, String> {
        let bytes: &[u8; Self::BYTES] = (bytes.try_into()).map_err(|_| {
            format!(
                "a run's index entry of {} bytes, not {}",
                bytes.len(),
                Self::BYTES
            )
        })?;
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let entry = RunEntry {
            segment: u32_at(0),
            offset: u64_at(4),
            len: u32_at(12),
            raw_len: u32_at(16),
            last: u64_at(20),
        };
        if entry.len > MAX_RUN_FRAME || entry.raw_len > MAX_RUN_RAW {
            return Err(format!(
                "a run's index entry names {} bytes ({} uncompressed); a run takes at most {MAX_RUN_FRAME} ({MAX_RUN_RAW})",
                entry.len, entry.raw_len
            ));
        }
        if entry.last < first {
            return Err(format!(
                "a run's index entry ends at seq {} before its first, {first}",
                entry.last
            ));
        }
        Ok(entry)
    }

    /// How many records the run holds.
    pub(super) fn records(&self, first: u64) -> u64 {
        self.last + 1 - first
    }
}

pub(super) fn run_key(session: Uuid, first: u64) -> [u8; 25] {
    seq_key(RUN_PREFIX, session, first)
}

/// A session's records appended since the last checkpoint: `records[i]`
/// is seq `first + i`.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) first: u64,
    pub(super) records: Vec<sled::IVec>,
}

impl Pending {
    /// The seq after its last record.
    pub(super) fn end(&self) -> u64 {
        self.first + self.records.len() as u64
    }

    /// Puts `records` from `seq` on, which must follow its records or
    /// replace some (recovery: a record the write-ahead file holds again
    /// after a crash); its records from `seq` on go.
    pub(super) fn put(&mut self, seq: u64, records: Vec<sled::IVec>) {
        debug_assert!((self.first..=self.end()).contains(&seq));
        self.records.truncate((seq - self.first) as usize);
        self.records.extend(records);
    }

    /// Its records cut into runs of at most [`RUN_BYTES`]: (first seq,
    /// records).
    pub(super) fn runs(&self) -> Vec<(u64, &[sled::IVec])> {
        let mut runs = Vec::new();
        let (mut start, mut bytes) = (0, 0);
        for (i, record) in self.records.iter().enumerate() {
            if i > start && bytes + record.len() > RUN_BYTES {
                runs.push((self.first + start as u64, &self.records[start..i]));
                (start, bytes) = (i, 0);
            }
            bytes += record.len();
        }
        if start < self.records.len() {
            runs.push((self.first + start as u64, &self.records[start..]));
        }
        runs
    }
}

/// One zstd frame of `records`, and its uncompressed length.
fn compress(records: &[sled::IVec]) -> std::io::Result<(Vec<u8>, u32)> {
    let mut raw = Vec::with_capacity(records.iter().map(|r| r.len() + 4).sum());
    for record in records {
        raw.extend_from_slice(&(record.len() as u32).to_le_bytes());
        raw.extend_from_slice(record);
    }
    let raw_len = u32::try_from(raw.len()).map_err(std::io::Error::other)?;
    Ok((zstd::block::compress(&raw, RUN_LEVEL)?, raw_len))
}

/// The records of a run's frame, or why they cannot be read.
pub(super) fn decompress(frame: &[u8], entry: &RunEntry) -> Result<Vec<sled::IVec>, String> {
    let raw = zstd::block::decompress(frame, entry.raw_len as usize)
        .map_err(|e| format!("run does not decompress: {e}"))?;
    if raw.len() != entry.raw_len as usize {
        return Err(format!(
            "run holds {} bytes, its index entry says {}",
            raw.len(),
            entry.raw_len
        ));
    }
    let mut records = Vec::new();
    let mut at = 0;
    while at < raw.len() {
        let len = raw
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
            .filter(|len| at + 4 + len <= raw.len())
            .ok_or_else(|| format!("run is cut inside a record at byte {at}"))?;
        records.push(sled::IVec::from(&raw[at + 4..at + 4 + len]));
        at += 4 + len;
    }
    Ok(records)
}

/// The segment files of a data directory.
pub(super) struct Segments {
    dir: PathBuf,
    /// The segment checkpoints write to, and its length; `None` until the
    /// first write of this process.
    current: Mutex<Option<(u32, File, u64)>>,
    /// Files opened for reading, by number.
    readers: Mutex<HashMap<u32, Arc<File>>>,
}

impl Segments {
    pub(super) fn new(data_dir: &Path) -> Segments {
        Segments {
            dir: data_dir.join(SEGMENTS_DIR),
            current: Mutex::new(None),
            readers: Mutex::new(HashMap::new()),
        }
    }

    fn path(&self, segment: u32) -> PathBuf {
        self.dir.join(format!("{segment:08}"))
    }

    /// Writes `runs` (each `(session, first seq, records)`) at the end of
    /// the current segment in one write, makes them durable, and returns
    /// where each is. Nothing points at them yet: on failure they are
    /// bytes no index entry will ever name.
    pub(super) fn append(
        &self,
        runs: &[(Uuid, u64, &[sled::IVec])],
    ) -> std::io::Result<Vec<RunEntry>> {
        let mut buf = Vec::new();
        let mut placed = Vec::with_capacity(runs.len());
        for (_, first, records) in runs {
            let (frame, raw_len) = compress(records)?;
            placed.push((
                buf.len() as u64,
                frame.len() as u32,
                raw_len,
                first + records.len() as u64 - 1,
            ));
            buf.extend_from_slice(&frame);
        }
        let mut current = self.current.lock().expect("segment lock poisoned");
        let (segment, file, len) = self.writable(&mut current, buf.len() as u64)?;
        file.write_all_at(&buf, *len)?;
        file.sync_data()?;
        let start = *len;
        *len += buf.len() as u64;
        let segment = *segment;
        Ok(placed
            .into_iter()
            .map(|(offset, len, raw_len, last)| RunEntry {
                segment,
                offset: start + offset,
                len,
                raw_len,
                last,
            })
            .collect())
    }

    /// The segment to write `bytes` to: the current one, or the last one
    /// on disk, or a new one (created durably) if that would pass
    /// [`SEGMENT_FILE_BYTES`].
    fn writable<'a>(
        &self,
        current: &'a mut Option<(u32, File, u64)>,
        bytes: u64,
    ) -> std::io::Result<&'a mut (u32, File, u64)> {
        if current.is_none() {
            if let Some(last) = self.last_on_disk()? {
                let file = OpenOptions::new().write(true).open(self.path(last))?;
                let len = file.metadata()?.len();
                *current = Some((last, file, len));
            }
        }
        let full = current
            .as_ref()
            .is_none_or(|(_, _, len)| *len > 0 && len + bytes > SEGMENT_FILE_BYTES);
        if full {
            let next = current.as_ref().map_or(0, |(n, _, _)| n + 1);
            *current = Some((next, self.create(next)?, 0));
        }
        Ok(current.as_mut().expect("a segment to write"))
    }

    fn create(&self, segment: u32) -> std::io::Result<File> {
        if !self.dir.exists() {
            std::fs::create_dir(&self.dir)?;
            crate::wal::sync_parent(&self.dir)?;
        }
        let path = self.path(segment);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        crate::wal::sync_parent(&path)?;
        Ok(file)
    }

    /// The highest-numbered segment file, if there is one.
    fn last_on_disk(&self) -> std::io::Result<Option<u32>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut last = None;
        for entry in entries {
            let name = entry?.file_name();
            if let Some(n) = name.to_str().and_then(|n| n.parse::<u32>().ok()) {
                last = last.max(Some(n));
            }
        }
        Ok(last)
    }

    /// The compressed bytes of the run at `entry`.
    pub(super) fn read(&self, entry: &RunEntry) -> std::io::Result<Vec<u8>> {
        let file = self.reader(entry.segment)?;
        let mut frame = vec![0u8; entry.len as usize];
        file.read_exact_at(&mut frame, entry.offset)?;
        Ok(frame)
    }

    fn reader(&self, segment: u32) -> std::io::Result<Arc<File>> {
        let mut readers = self.readers.lock().expect("segment lock poisoned");
        if let Some(file) = readers.get(&segment) {
            return Ok(file.clone());
        }
        let file = Arc::new(File::open(self.path(segment))?);
        readers.insert(segment, file.clone());
        Ok(file)
    }

    /// The segment directory, for errors.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn records(lens: &[usize]) -> Vec<sled::IVec> {
        (lens.iter().enumerate())
            .map(|(i, len)| sled::IVec::from(vec![i as u8; *len]))
            .collect()
    }

    proptest! {
        /// Runs hold every pending record once, in order, from the right
        /// seq; none passes the size bound but a record bigger than it,
        /// alone.
        #[test]
        fn runs_cover_every_record_in_order_within_the_bound(
            first in 1u64..1_000,
            lens in proptest::collection::vec(0usize..100_000, 1..40),
        ) {
            let pending = Pending { first, records: records(&lens) };
            let mut next = first;
            for (start, run) in pending.runs() {
                prop_assert_eq!(start, next);
                let bytes: usize = run.iter().map(|r| r.len()).sum();
                prop_assert!(bytes <= RUN_BYTES || run.len() == 1, "{} bytes in {} records", bytes, run.len());
                next += run.len() as u64;
            }
            prop_assert_eq!(next, pending.end());
        }
    }

    #[test]
    fn a_run_reads_back_and_a_damaged_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let segments = Segments::new(dir.path());
        let session = Uuid::now_v7();
        let run = records(&[10, 0, 70_000, 5]);
        let placed = segments.append(&[(session, 3, &run[..])]).unwrap();
        let entry = placed[0];
        assert_eq!((entry.segment, entry.offset, entry.last), (0, 0, 6));
        let frame = segments.read(&entry).unwrap();
        assert_eq!(decompress(&frame, &entry).unwrap(), run);
        let mut damaged = frame.clone();
        let middle = damaged.len() / 2;
        damaged[middle] ^= 0xff;
        let short = RunEntry {
            raw_len: entry.raw_len - 1,
            ..entry
        };
        for (bytes, entry) in [(&damaged, entry), (&frame, short)] {
            match decompress(bytes, &entry) {
                Err(reason) => assert!(!reason.is_empty()),
                Ok(read) => assert_ne!(read, run, "damage must not read back as the run"),
            }
        }
        assert_eq!(RunEntry::decode(&entry.encode(), 3), Ok(entry));
    }

    #[test]
    fn an_index_entry_past_what_a_run_can_take_is_refused_before_any_read() {
        let entry = RunEntry {
            segment: 0,
            offset: 0,
            len: 100,
            raw_len: 200,
            last: 9,
        };
        let damaged = [
            (
                RunEntry {
                    raw_len: u32::MAX,
                    ..entry
                },
                "uncompressed",
            ),
            (
                RunEntry {
                    len: MAX_RUN_FRAME + 1,
                    ..entry
                },
                "at most",
            ),
            (RunEntry { last: 4, ..entry }, "before its first"),
        ];
        for (bad, said) in damaged {
            let err = RunEntry::decode(&bad.encode(), 5).unwrap_err();
            assert!(err.contains(said), "{err}");
        }
        assert!(RunEntry::decode(&entry.encode()[..27], 5).is_err());
        assert_eq!(RunEntry::decode(&entry.encode(), 9), Ok(entry));
    }

    #[test]
    fn runs_go_after_unreferenced_bytes_and_a_full_segment_rolls() {
        let dir = tempfile::tempdir().unwrap();
        let session = Uuid::now_v7();
        let run = records(&[100, 200]);
        let segments = Segments::new(dir.path());
        let first = segments.append(&[(session, 1, &run[..])]).unwrap()[0];
        drop(segments);
        // A checkpoint that failed after its write left bytes no index
        // entry names; a new process writes after them.
        let path = dir.path().join(SEGMENTS_DIR).join("00000000");
        let file = OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut &file, b"never indexed").unwrap();
        let segments = Segments::new(dir.path());
        let second = segments.append(&[(session, 3, &run[..])]).unwrap()[0];
        assert_eq!(second.offset, first.offset + first.len as u64 + 13);
        for entry in [first, second] {
            assert_eq!(
                decompress(&segments.read(&entry).unwrap(), &entry).unwrap(),
                run
            );
        }
        // A segment that the next write would take past its size rolls.
        file.set_len(SEGMENT_FILE_BYTES - 10).unwrap();
        let rolled = Segments::new(dir.path());
        let third = rolled.append(&[(session, 5, &run[..])]).unwrap()[0];
        assert_eq!((third.segment, third.offset), (1, 0));
        assert_eq!(
            decompress(&rolled.read(&third).unwrap(), &third).unwrap(),
            run
        );
        assert_eq!(
            decompress(&rolled.read(&first).unwrap(), &first).unwrap(),
            run
        );
    }
}
