//! mneme's own write-ahead file in front of sled.
//!
//! sled 0.34.7's `flush()` never calls fsync on Linux, and flushing sled per
//! event costs two device round trips. So every appended record is first
//! written here (one `write(2)`, so it survives the death of the process at
//! once), and a synced barrier is one `fdatasync` of this file. sled gets the
//! same records in memory and persists them at its own pace; a checkpoint
//! (sled flush + `fdatasync` of sled's files) empties this file.
//!
//! Frame: `len: u32 LE` (of key + value), `crc32: u32 LE` (of key + value),
//! the 25-byte event key, the stored record. A frame cut short by a crash,
//! or a damaged last frame, ends the file: it was never acknowledged as
//! synced. A damaged frame with whole frames after it is corruption, and the
//! file is refused rather than cut, so no acknowledged record is dropped.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

const HEADER: usize = 8;
/// Size of an event key in the log.
pub(crate) const KEY_LEN: usize = 25;

/// A stored record and its key, as one frame holds them.
pub(crate) type Frame = (Vec<u8>, Vec<u8>);

/// The write-ahead file.
pub(crate) struct Wal {
    file: File,
    path: PathBuf,
    len: u64,
}

impl Wal {
    /// Opens (creating) the file and returns it with every whole frame in it,
    /// as (key, value). A torn tail is cut off.
    pub(crate) fn open(path: &Path) -> std::io::Result<(Wal, Vec<Frame>)> {
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (frames, valid) = parse(&bytes).map_err(|at| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "write-ahead file damaged at byte {at}: a frame fails its checksum and {} bytes follow it",
                    bytes.len() - at
                ),
            )
        })?;
        if valid < bytes.len() {
            file.set_len(valid as u64)?;
            file.sync_all()?;
        }
        let wal = Wal {
            file,
            path: path.to_path_buf(),
            len: valid as u64,
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

    /// Undoes a partial write or an append that sled then refused.
    pub(crate) fn cut_back_to(&mut self, len: u64) {
        self.len = len;
        self.cut_back();
    }

    fn cut_back(&mut self) {
        // Best effort: if even this fails, the torn frame ends the file for
        // recovery, and the error was already reported to the caller.
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

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Whole frames of `bytes`, and how many bytes they span; or the offset of
/// a damaged frame that is not the last.
fn parse(bytes: &[u8]) -> Result<(Vec<Frame>, usize), usize> {
    let mut frames = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= HEADER {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes"));
        let body = at + HEADER;
        if len < KEY_LEN || bytes.len() - body < len {
            break; // torn tail
        }
        if crc32fast::hash(&bytes[body..body + len]) != crc {
            if body + len == bytes.len() {
                break; // a last frame whose data never fully reached the disk
            }
            return Err(at);
        }
        frames.push((
            bytes[body..body + KEY_LEN].to_vec(),
            bytes[body + KEY_LEN..body + len].to_vec(),
        ));
        at = body + len;
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
        f.write_all(&[40, 0, 0, 0, 1, 2, 3, 4, 7, 7]).unwrap();
        let (wal, frames) = Wal::open(&path).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].1, b"two");
        assert_eq!(wal.len(), whole);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
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
