//! mneme's own write-ahead file in front of sled.
//!
//! sled 0.34.7's `flush()` never calls fsync on Linux, and flushing sled per
//! event costs two device round trips. So every appended record is first
//! written here (one `write(2)`, so it survives the death of the process at
//! once), and a synced barrier is one `fdatasync` of this file. sled gets the
//! same records in memory and persists them at its own pace; a checkpoint
//! (sled flush + `fdatasync` of sled's files) empties this file.
//!
//! Frame: `magic: u32 LE`, `len: u32 LE` (of key + value), `crc32: u32 LE`
//! (of key + value), the 25-byte event key, the stored record.
//!
//! Opening tells a torn tail from damage: a frame that does not check out is
//! a torn tail only if no whole frame follows it anywhere in the file (the
//! last `write(2)` before a crash, never acknowledged as synced); the tail is
//! then moved to a side file, not thrown away. Anything else is damage, and
//! the file is refused, so no acknowledged record is ever silently dropped.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: u32 = 0x4d57_4c31; // "1LWM" little-endian: mneme WAL v1
const HEADER: usize = 12;
/// Size of an event key in the log.
pub(crate) const KEY_LEN: usize = 25;

/// A stored record and its key, as one frame holds them.
pub(crate) type Frame = (Vec<u8>, Vec<u8>);

/// The write-ahead file.
pub(crate) struct Wal {
    file: File,
    path: PathBuf,
    len: u64,
    torn_tail: Option<TornTail>,
}

/// A partial frame found at the end of the write-ahead file on open: the
/// last write before a crash. It was never acknowledged as synced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// Where its bytes were moved.
    pub saved_to: PathBuf,
    /// How many bytes it had.
    pub bytes: usize,
}

impl Wal {
    /// Opens (creating) the file and returns it with every whole frame in it,
    /// as (key, value). A torn tail is moved to `<file>.torn-<bytes>`.
    pub(crate) fn open(path: &Path) -> std::io::Result<(Wal, Vec<Frame>)> {
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        if created {
            sync_parent(path)?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (frames, valid) = parse(&bytes).map_err(|at| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "write-ahead file damaged at byte {at}: a frame there fails its checks but whole \
                     frames follow it; refusing to drop acknowledged records"
                ),
            )
        })?;
        let mut torn_tail = None;
        if valid < bytes.len() {
            let aside = path.with_extension(format!("wal.torn-{valid}"));
            std::fs::write(&aside, &bytes[valid..])?;
            file.set_len(valid as u64)?;
            file.sync_all()?;
            sync_parent(path)?;
            torn_tail = Some(TornTail {
                saved_to: aside,
                bytes: bytes.len() - valid,
            });
        }
        let wal = Wal {
            file,
            path: path.to_path_buf(),
            len: valid as u64,
            torn_tail,
        };
        Ok((wal, frames))
    }

    /// Appends frames for `records` with one `write(2)`. On failure the file
    /// is cut back, so a failed append leaves no trace.
    pub(crate) fn append(&mut self, records: &[Frame]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(
            records
                .iter()
                .map(|(k, v)| HEADER + k.len() + v.len())
                .sum(),
        );
        for (key, value) in records {
            let len = (key.len() + value.len()) as u32;
            let mut crc = crc32fast::Hasher::new();
            crc.update(key);
            crc.update(value);
            buf.extend_from_slice(&MAGIC.to_le_bytes());
            buf.extend_from_slice(&len.to_le_bytes());
            buf.extend_from_slice(&crc.finalize().to_le_bytes());
            buf.extend_from_slice(key);
            buf.extend_from_slice(value);
        }
        if let Err(e) = self.file.write_all(&buf) {
            self.cut_back();
            return Err(e);
        }
        self.len += buf.len() as u64;
        Ok(())
    }

    /// Undoes an append that sled then refused.
    pub(crate) fn cut_back_to(&mut self, len: u64) {
        self.len = len;
        self.cut_back();
    }

    fn cut_back(&mut self) {
        // Best effort: if even this fails, the partial frame is a torn tail
        // for the next open, and the error was already reported.
        let _ = self.file.set_len(self.len);
    }

    /// Bytes in the file.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Empties the file; call only once its records are durable elsewhere.
    pub(crate) fn truncate(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.file.sync_all()?;
        self.len = 0;
        Ok(())
    }

    /// The torn tail found when the file was opened, if any.
    pub(crate) fn torn_tail(&self) -> Option<&TornTail> {
        self.torn_tail.as_ref()
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// A new file's name is durable only once its directory is synced.
fn sync_parent(path: &Path) -> std::io::Result<()> {
    File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

/// The whole frame at `at`, if one checks out there: (frame, its end).
fn frame_at(bytes: &[u8], at: usize) -> Option<(Frame, usize)> {
    let header = bytes.get(at..at + HEADER)?;
    let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
    let (magic, len, crc) = (word(0), word(4) as usize, word(8));
    let body = bytes.get(at + HEADER..(at + HEADER).checked_add(len)?)?;
    if magic != MAGIC || len < KEY_LEN || crc32fast::hash(body) != crc {
        return None;
    }
    let frame = (body[..KEY_LEN].to_vec(), body[KEY_LEN..].to_vec());
    Some((frame, at + HEADER + len))
}

/// Whole frames of `bytes` and how many bytes they span; or the offset of
/// a bad frame that has a whole frame somewhere after it (damage).
fn parse(bytes: &[u8]) -> Result<(Vec<Frame>, usize), usize> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match frame_at(bytes, at) {
            Some((frame, end)) => {
                frames.push(frame);
                at = end;
            }
            None => {
                let magic = MAGIC.to_le_bytes();
                let later = (at + 1..bytes.len().saturating_sub(HEADER))
                    .filter(|&p| bytes[p..p + 4] == magic)
                    .any(|p| frame_at(bytes, p).is_some());
                return if later { Err(at) } else { Ok((frames, at)) };
            }
        }
    }
    Ok((frames, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let key = vec![7u8; KEY_LEN];
        {
            let (mut wal, frames) = Wal::open(&path).unwrap();
            assert!(frames.is_empty());
            wal.append(&[
                (key.clone(), b"one".to_vec()),
                (key.clone(), b"two".to_vec()),
            ])
            .unwrap();
        }
        let whole = std::fs::metadata(&path).unwrap().len();
        // A crash in the middle of a third frame.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[0x31, 0x4c, 0x57, 0x4d, 40, 0, 0, 0, 1, 2, 3, 4, 7, 7])
            .unwrap();
        let (wal, frames) = Wal::open(&path).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].1, b"two");
        assert_eq!(wal.len(), whole);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
        let aside = path.with_extension(format!("wal.torn-{whole}"));
        assert_eq!(
            std::fs::read(aside).unwrap().len(),
            14,
            "the torn tail is kept aside"
        );
    }

    #[test]
    fn a_damaged_last_frame_is_cut_but_a_damaged_middle_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let key = vec![1u8; KEY_LEN];
        {
            let (mut wal, _) = Wal::open(&path).unwrap();
            wal.append(&[(key.clone(), b"aaaa".to_vec())]).unwrap();
            wal.append(&[(key.clone(), b"bbbb".to_vec())]).unwrap();
        }
        let good = std::fs::read(&path).unwrap();
        let mut bytes = good.clone();
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let (_, frames) = Wal::open(&path).unwrap();
        assert_eq!(frames.len(), 1);
        let mut bytes = good;
        bytes[HEADER + 2] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = Wal::open(&path)
            .err()
            .expect("damage before the tail is refused");
        assert!(err.to_string().contains("damaged at byte 0"), "{err}");
    }
}
