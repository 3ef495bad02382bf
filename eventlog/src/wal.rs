//! mneme's own write-ahead file in front of sled.
//!
//! sled 0.34.7's `flush()` never calls fsync on Linux, and flushing sled per
//! event costs two device round trips. So every appended record is first
//! written here (one `write(2)`, so it survives the death of the process at
//! once), and a synced barrier is one `fdatasync` of this file. sled gets the
//! same records in memory and persists them at its own pace; a checkpoint
//! (sled flush + `fdatasync` of sled's files) empties this file.
//!
//! Format (version 3, after SQLite's WAL): a 20-byte file header, `"MWAL"`,
//! `version: u32 LE` (3; version 2, read too, had the same frames before
//! checkpoints wrote segment files), an 8-byte `salt` drawn from `/dev/urandom` each
//! time the file is emptied, `crc32` of those 16 bytes; then frames, each
//! `salt` (a copy), `len: u32 LE` (of key + value), `prev: u32 LE` (the
//! previous frame's checksum, the header's for the first frame), `sum: u32
//! LE` = CRC-32 of `salt ‖ offset: u64 LE ‖ prev ‖ len ‖ key ‖ value`, where
//! `offset` is the frame's own byte offset in the file; then the 25-byte event
//! key and the stored record. A frame is whole only if it checks out with
//! this file's salt at the offset it is at, so the bytes of a record (a model
//! reply can carry anything) can never pass for a frame: whoever wrote them
//! did not know the salt. Read in order, each frame must also chain from the
//! one before it.
//!
//! Frames are written at explicit offsets (`pwrite`, no `O_APPEND`), so a
//! frame always lands at the offset its checksum binds. The file is grown
//! ahead of its frames, [`PREALLOCATED`] bytes of written zeros at a time
//! (the append that passes the end writes its frames and the zeros in one
//! write), so most appends overwrite blocks the file already has and their
//! `fdatasync` has no file size to commit: it measured 54–74 µs against
//! 99–100 µs for an append that grows the file. Space merely reserved
//! (`fallocate`) does not help: its first write still changes the extent
//! tree. Zeros after the last whole frame are that space, not a torn tail.
//! A failed append is cut back off the file; if even that fails, the bytes
//! past the last whole frame stay unknown, and every later append first
//! cuts them off again and is refused while it cannot (an emptying at a
//! checkpoint also clears them): a frame written behind them could never
//! check out.
//!
//! Opening tells a torn tail from damage: a frame that does not check out is
//! a torn tail only if no whole frame follows it anywhere in the file (the
//! last `write(2)` before a crash, never acknowledged as synced); the tail is
//! then moved to a side file of its own (`<file>.torn-<n>`, the first free
//! `n`, synced before the file is cut), not thrown away (but for the zeros
//! it ends in, which the preallocated space holds anyway). A file no longer
//! than a header whose header is bad (zeros, cut short, failing its
//! checksum) was being emptied when the machine stopped: no frame can be in
//! it, since frames are written only after the header is synced, so it is
//! set aside the same way and the file starts afresh. Anything else is
//! damage, and the file is refused, so no acknowledged record is ever
//! silently dropped.
//!
//! Version 1 files (frames of `magic`, `len`, CRC-32 of key and value, with
//! no file header: what mneme wrote before) are still read, so an existing
//! data directory opens; their frames are replayed, and appends are refused
//! until a checkpoint has emptied the file, which then starts in version 2.
//! The two formats never mix in one file. In a version 1 file a torn last
//! frame whose payload holds a whole frame still reads as damage: only the
//! salt tells them apart.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The first bytes of a version 1 frame ("1LWM" little-endian).
const V1_MAGIC: u32 = 0x4d57_4c31;
const V1_FRAME_HEADER: usize = 12;
/// The first bytes of a file of version 2 or later.
const FILE_MAGIC: [u8; 4] = *b"MWAL";
/// The format this build writes. Version 3 has version 2's frames; it says
/// that checkpoints moved records into segment files, which a build that
/// reads only version 2 would not see, so such a build refuses the
/// directory instead of serving it without them.
const VERSION: u32 = 3;
/// The oldest version with a file header: read, and started afresh in
/// [`VERSION`] once empty.
const FIRST_HEADERED: u32 = 2;
/// Bytes of the file header: what an emptied file holds.
pub(crate) const FILE_HEADER: usize = 20;
const FRAME_HEADER: usize = 20;
/// Size of an event key in the log.
pub(crate) const KEY_LEN: usize = 25;
/// Zeros written past the last frame whenever an append passes the end of
/// the file: the most it holds beyond its frames.
pub(crate) const PREALLOCATED: usize = 256 << 10;
/// Bytes an append leaves free on the disk after its own (in the
/// write-ahead file and, as much again, in sled), or it is refused as if
/// the disk were full. sled cannot recover from a write it could not make
/// (every later call fails until it is reopened), and with the write-ahead
/// file grown ahead sled's writes would otherwise be the first to find the
/// disk full; this keeps room for them (sled writes 64 KiB segments, and at
/// most a checkpoint's worth of records between checkpoints).
pub const MIN_FREE_BYTES: u64 = 4 << 20;

/// A stored record and its key, as one frame holds them.
pub(crate) type Frame = (Vec<u8>, Vec<u8>);

/// How the frames of an open file are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// Written before the file header existed: read, never appended to.
    V1,
    /// This build's: frames keyed by the file's salt.
    V2 { salt: [u8; 8] },
}

/// The write-ahead file.
pub(crate) struct Wal {
    file: File,
    path: PathBuf,
    /// Where the last whole frame ends.
    len: u64,
    /// Bytes in the file: past `len` they are zeros (unless `uncut`).
    allocated: u64,
    /// `None` while the file has no header: a truncate failed part way
    /// (after the checkpoint that made every frame durable elsewhere), and
    /// the next append starts the file afresh first.
    format: Option<Format>,
    /// The checksum the next frame chains from.
    chain: u32,
    /// Cutting the file back to `len` after a failed append failed too: it
    /// may hold bytes past `len`, which must go before the next frame.
    uncut: bool,
    torn_tail: Option<TornTail>,
}

/// What an append wrote.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Appended {
    /// Bytes written.
    pub(crate) bytes: u64,
}

/// A partial write found at the end of the write-ahead file on open: the
/// last write before a crash (a frame, or the header of a file being
/// emptied). It was never acknowledged as synced; its bytes are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// Where its bytes were moved.
    pub saved_to: PathBuf,
    /// How many bytes it had.
    pub bytes: usize,
}

/// Why a write-ahead file is refused on open.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error(
        "write-ahead file damaged at byte {0}: a frame there fails its checks but whole \
         frames follow it; refusing to drop acknowledged records"
    )]
    Damaged(usize),
    #[error(
        "write-ahead file damaged at byte 0: its header fails its checksum; refusing to \
         guess which of its frames are whole"
    )]
    Header,
    #[error(
        "write-ahead file has format version {0}, this build reads versions 1 to {VERSION}; \
         a newer mneme wrote it"
    )]
    UnknownVersion(u32),
    #[error("not a mneme write-ahead file: it starts with neither a header nor a version 1 frame")]
    Foreign,
}

/// What opening found in the file.
struct Contents {
    /// `None` if the file holds no header and no frame.
    format: Option<Format>,
    frames: Vec<Frame>,
    /// Bytes up to the end of the last whole frame.
    valid: usize,
    /// The checksum the next frame chains from.
    chain: u32,
}

/// A frame that checks out at some byte of a file.
struct Whole {
    frame: Frame,
    end: usize,
    /// The checksum it chains from.
    prev: u32,
    /// Its own checksum.
    sum: u32,
}

impl Wal {
    /// Opens (creating, mode 0600) the file and returns it with every whole
    /// frame in it, as (key, value). A torn tail, or the bad header of an
    /// interrupted emptying, is moved to a new side file
    /// (`<file>.torn-<n>`) and reported by [`Wal::torn_tail`]. A file
    /// without a header gets one.
    pub(crate) fn open(path: &Path) -> std::io::Result<(Wal, Vec<Frame>)> {
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        if created {
            sync_parent(path)?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let contents = read(&bytes)
            .map_err(|refusal| std::io::Error::new(std::io::ErrorKind::InvalidData, refusal))?;
        let mut torn_tail = None;
        let mut allocated = bytes.len() as u64;
        if let Some(tail) = torn(&bytes, &contents) {
            torn_tail = Some(set_aside(&file, path, tail, contents.valid)?);
            allocated = contents.valid as u64;
        }
        let older = contents.format.is_some_and(|f| f != Format::V1) && word(&bytes, 4) < VERSION;
        let mut wal = Wal {
            file,
            path: path.to_path_buf(),
            len: contents.valid as u64,
            allocated,
            format: contents.format,
            chain: contents.chain,
            uncut: false,
            torn_tail,
        };
        // An older version's file holding no frame starts afresh in this
        // one at once (one with frames does at the checkpoint after they
        // are replayed), before anything else is written.
        if wal.format.is_none() || (older && contents.frames.is_empty()) {
            wal.truncate()?;
        }
        Ok((wal, contents.frames))
    }

    /// Appends frames for `records` with one `write(2)` at the end of the
    /// last whole frame (followed by [`PREALLOCATED`] zeros if they pass the
    /// end of the file) and returns what it wrote. First the file is made
    /// ready: bytes a failed cut-back left are cut off (the append is
    /// refused while they cannot be), and a file without a header starts
    /// afresh. On failure the file is cut back, so a failed append leaves no
    /// trace. A file still holding version 1 frames is refused.
    pub(crate) fn append(&mut self, records: &[Frame]) -> std::io::Result<Appended> {
        let salt = self.ready()?;
        let mut buf = Vec::with_capacity(
            records
                .iter()
                .map(|(k, v)| FRAME_HEADER + k.len() + v.len())
                .sum(),
        );
        let mut chain = self.chain;
        for (key, value) in records {
            let offset = self.len + buf.len() as u64;
            chain = encode_frame(&mut buf, salt, offset, chain, key, value)?;
        }
        let bytes = buf.len() as u64;
        if self.len + bytes > self.allocated {
            buf.resize(buf.len() + PREALLOCATED, 0);
        }
        // What this write takes, and what sled takes for the same records.
        room_left(&self.file, buf.len() as u64 + bytes)?;
        if let Err(e) = self.file.write_all_at(&buf, self.len) {
            // The write's error is the one to report; a failed cut is
            // remembered and refuses the next append until it is redone.
            let _ = self.cut_back();
            return Err(e);
        }
        self.allocated = self.allocated.max(self.len + buf.len() as u64);
        self.len += bytes;
        self.chain = chain;
        Ok(Appended { bytes })
    }

    /// Makes the file ready for frames; returns its salt.
    fn ready(&mut self) -> std::io::Result<[u8; 8]> {
        if self.uncut {
            self.cut_back().map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "the write-ahead file may hold the bytes of a failed append past byte {} \
                         and they cannot be cut off ({e}); appends are refused until they are, \
                         or until a checkpoint empties the file",
                        self.len
                    ),
                )
            })?;
        }
        if self.format.is_none() {
            self.truncate()?;
        }
        match self.format {
            Some(Format::V2 { salt }) => Ok(salt),
            _ => Err(std::io::Error::other(
                "the write-ahead file still holds version 1 frames; a checkpoint must empty it \
                 before anything is appended, so the formats never mix",
            )),
        }
    }

    /// Cuts the file back to `len` (its preallocated zeros too: a failed
    /// write may have reached them), durably: the frames of an undone
    /// append overwrote blocks the file had, and could otherwise come back
    /// whole after a power cut. On failure, `uncut` says bytes may remain
    /// past it.
    fn cut_back(&mut self) -> std::io::Result<()> {
        let result = self
            .file
            .set_len(self.len)
            .and_then(|()| self.file.sync_data());
        self.uncut = result.is_err();
        if !self.uncut {
            self.allocated = self.len;
        }
        result
    }

    /// Bytes up to the end of the last whole frame.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file holds nothing but a version 2 header.
    pub(crate) fn is_empty(&self) -> bool {
        !self.uncut
            && matches!(self.format, Some(Format::V2 { .. }))
            && self.len == FILE_HEADER as u64
    }

    /// Empties the file and starts it afresh in version 2, with a new salt;
    /// call only once its records are durable elsewhere.
    pub(crate) fn truncate(&mut self) -> std::io::Result<()> {
        self.format = None;
        self.file.set_len(0)?;
        self.uncut = false;
        self.len = 0;
        self.allocated = 0;
        let (format, chain) = start(&self.file)?;
        self.format = Some(format);
        self.chain = chain;
        self.len = FILE_HEADER as u64;
        self.allocated = self.len;
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

/// Fails with "No space left on device" unless `needed` bytes can be
/// written to the disk holding `file` with [`MIN_FREE_BYTES`] still free
/// (to an unprivileged user) after them. A filesystem that reports no size
/// at all (tmpfs with `size=0`, ramfs, some FUSE ones) is not checked.
fn room_left(file: &File, needed: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `file` is an open descriptor and `stat` is written whole by
    // a successful call, which is checked before it is read.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the call succeeded.
    let stat = unsafe { stat.assume_init() };
    let free = stat.f_bavail.saturating_mul(stat.f_frsize);
    if stat.f_blocks == 0 || free >= MIN_FREE_BYTES.saturating_add(needed) {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::StorageFull,
        format!(
            "{}: {free} bytes are free on its disk, this append needs {needed} (in the \
             write-ahead file and in sled), and mneme keeps {MIN_FREE_BYTES} more free for \
             sled's own writes",
            std::io::Error::from_raw_os_error(libc::ENOSPC)
        ),
    ))
}

/// A new file's name is durable only once its directory is synced.
pub(crate) fn sync_parent(path: &Path) -> std::io::Result<()> {
    File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

/// The bytes of the file after its last whole frame that are a torn tail,
/// if any: in a version 2 file, the zeros they end in are preallocated
/// space, not part of it.
fn torn<'a>(bytes: &'a [u8], contents: &Contents) -> Option<&'a [u8]> {
    let rest = &bytes[contents.valid..];
    let tail = match contents.format {
        Some(Format::V2 { .. }) => {
            &rest[..rest.iter().rposition(|&b| b != 0).map_or(0, |at| at + 1)]
        }
        _ => rest,
    };
    (!tail.is_empty()).then_some(tail)
}

/// Moves `tail` to a new side file, durably (the side file and its name
/// synced), and only then cuts the file at `valid`.
fn set_aside(file: &File, path: &Path, tail: &[u8], valid: usize) -> std::io::Result<TornTail> {
    let (aside, mut side) = new_side_file(path)?;
    side.write_all(tail)?;
    side.sync_all()?;
    sync_parent(path)?;
    file.set_len(valid as u64)?;
    file.sync_all()?;
    Ok(TornTail {
        saved_to: aside,
        bytes: tail.len(),
    })
}

/// Creates (mode 0600) `<file>.torn-<n>` for the first `n` from 1 that no
/// file has: a side file is never replaced.
fn new_side_file(path: &Path) -> std::io::Result<(PathBuf, File)> {
    let name = path
        .file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy();
    let mut n = 1u64;
    loop {
        let aside = path.with_file_name(format!("{name}.torn-{n}"));
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&aside);
        match created {
            Ok(side) => return Ok((aside, side)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Writes a header of [`VERSION`] with a fresh salt at the start of the empty
/// `file` and syncs it; returns the format and the checksum the first frame
/// chains from.
fn start(file: &File) -> std::io::Result<(Format, u32)> {
    let mut salt = [0u8; 8];
    File::open("/dev/urandom")?.read_exact(&mut salt)?;
    let mut header = Vec::with_capacity(FILE_HEADER);
    header.extend_from_slice(&FILE_MAGIC);
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.extend_from_slice(&salt);
    let check = crc32fast::hash(&header);
    header.extend_from_slice(&check.to_le_bytes());
    file.write_all_at(&header, 0)?;
    file.sync_all()?;
    Ok((Format::V2 { salt }, check))
}

/// Appends the version 2 frame of (`key`, `value`) at byte `offset` of a
/// file with `salt`, chained from `prev`, to `buf`; returns its checksum.
fn encode_frame(
    buf: &mut Vec<u8>,
    salt: [u8; 8],
    offset: u64,
    prev: u32,
    key: &[u8],
    value: &[u8],
) -> std::io::Result<u32> {
    let len = u32::try_from(key.len() + value.len()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a record of {} bytes does not fit a write-ahead frame (at most {} bytes)",
                value.len(),
                u32::MAX as usize - key.len()
            ),
        )
    })?;
    let sum = checksum(salt, offset, prev, len, key, value);
    buf.extend_from_slice(&salt);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&prev.to_le_bytes());
    buf.extend_from_slice(&sum.to_le_bytes());
    buf.extend_from_slice(key);
    buf.extend_from_slice(value);
    Ok(sum)
}

/// A version 2 frame's checksum.
fn checksum(salt: [u8; 8], offset: u64, prev: u32, len: u32, key: &[u8], value: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&salt);
    crc.update(&offset.to_le_bytes());
    crc.update(&prev.to_le_bytes());
    crc.update(&len.to_le_bytes());
    crc.update(key);
    crc.update(value);
    crc.finalize()
}

/// The little-endian `u32` at `bytes[at..at + 4]`.
fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The whole frame of a file of format `format` at `at`, if one checks out
/// there (regardless of what it chains from).
fn whole_at(format: Format, bytes: &[u8], at: usize) -> Option<Whole> {
    let (header_len, prev, sum, len) = match format {
        Format::V1 => {
            let header = bytes.get(at..at + V1_FRAME_HEADER)?;
            if word(header, 0) != V1_MAGIC {
                return None;
            }
            (V1_FRAME_HEADER, 0, 0, word(header, 4))
        }
        Format::V2 { salt } => {
            let header = bytes.get(at..at + FRAME_HEADER)?;
            if header[..8] != salt {
                return None;
            }
            (
                FRAME_HEADER,
                word(header, 12),
                word(header, 16),
                word(header, 8),
            )
        }
    };
    let start = at + header_len;
    let body = bytes.get(start..start.checked_add(len as usize)?)?;
    if body.len() < KEY_LEN {
        return None;
    }
    let (key, value) = body.split_at(KEY_LEN);
    let checks = match format {
        Format::V1 => crc32fast::hash(body) == word(bytes, at + 8),
        Format::V2 { salt } => checksum(salt, at as u64, prev, len, key, value) == sum,
    };
    checks.then(|| Whole {
        frame: (key.to_vec(), value.to_vec()),
        end: start + body.len(),
        prev,
        sum,
    })
}

/// The disk's sector: the least a write reaches it in.
const SECTOR: usize = 512;

/// Whether the bad bytes `bytes[bad]` of a version 2 file, before a whole
/// frame, show a write the disk never got: zeros from the start to the end
/// of its sector, or a whole sector of zeros (the file grows in written
/// zeros, so a sector the disk did not get still holds them). Appends that
/// overwrite those zeros change no file size, so a power cut may keep a
/// later sector of them and lose an earlier one; the frames after such a
/// gap were never synced (a sync writes every sector before it), so they
/// are a torn tail, not acknowledged records behind damage.
fn never_written(format: Format, bytes: &[u8], bad: std::ops::Range<usize>) -> bool {
    let zeros = |range: std::ops::Range<usize>| bytes[range].iter().all(|&b| b == 0);
    let first_end = (bad.start / SECTOR + 1) * SECTOR;
    matches!(format, Format::V2 { .. })
        && (zeros(bad.start..first_end.min(bad.end))
            || (first_end..bad.end)
                .step_by(SECTOR)
                .any(|s| s + SECTOR <= bad.end && zeros(s..s + SECTOR)))
}

/// The frames of `bytes` in `format`, read in order from `at` and chained
/// from `chain`, and where the last whole one ends; or the offset of a bad
/// frame that has a whole frame somewhere after it (damage), unless what is
/// bad was never written (see [`never_written`]).
fn parse(format: Format, bytes: &[u8], mut at: usize, mut chain: u32) -> Result<Contents, Refusal> {
    let mut frames = Vec::new();
    while at < bytes.len() {
        match whole_at(format, bytes, at).filter(|w| w.prev == chain) {
            Some(whole) => {
                frames.push(whole.frame);
                at = whole.end;
                chain = whole.sum;
            }
            None => {
                let next = (at + 1..bytes.len()).find(|&p| whole_at(format, bytes, p).is_some());
                match next {
                    Some(next) if !never_written(format, bytes, at..next) => {
                        return Err(Refusal::Damaged(at));
                    }
                    _ => break,
                }
            }
        }
    }
    Ok(Contents {
        format: Some(format),
        frames,
        valid: at,
        chain,
    })
}

/// What the file holds: its format, its whole frames and where they end.
fn read(bytes: &[u8]) -> Result<Contents, Refusal> {
    let v1_magic = V1_MAGIC.to_le_bytes();
    if bytes.starts_with(&v1_magic) {
        let mut contents = parse(Format::V1, bytes, 0, 0)?;
        if contents.valid == 0 {
            contents.format = None;
        }
        return Ok(contents);
    }
    let header_checks =
        bytes.len() >= FILE_HEADER && crc32fast::hash(&bytes[..16]) == word(bytes, 16);
    if bytes.len() <= FILE_HEADER && !header_checks {
        // Empty, or an emptying interrupted before its header was synced
        // (zeros, cut short, failing its checksum): frames are written only
        // after the header is synced, so none can be here.
        return Ok(Contents {
            format: None,
            frames: Vec::new(),
            valid: 0,
            chain: 0,
        });
    }
    if bytes[..4] != FILE_MAGIC {
        return Err(Refusal::Foreign);
    }
    match word(bytes, 4) {
        FIRST_HEADERED..=VERSION => {}
        version => return Err(Refusal::UnknownVersion(version)),
    }
    if !header_checks {
        return Err(Refusal::Header);
    }
    let salt = bytes[8..16].try_into().expect("8 bytes");
    parse(Format::V2 { salt }, bytes, FILE_HEADER, word(bytes, 16))
}

/// A file written by mneme before the file header existed: seq 1 to 3 of
/// session `0190…0001` (kinds `K1` to `K3`), as [`crate::SledLog`] wrote them.
#[cfg(test)]
pub(crate) fn v1_file() -> Vec<u8> {
    let hex = include_str!("../fixtures/wal_v1.hex").trim();
    hex::decode(hex).expect("the fixture is hex")
}

#[cfg(test)]
mod tests;
