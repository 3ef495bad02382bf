//! Opening the data directory: sled's settings, the holder note and the
//! lock, permissions, and what a refused open says.

use super::*;

/// Opens sled in `dir`, its page cache bounded at `cache_bytes`. A lock held by a process that no longer runs (one
/// just killed, whose files the kernel is still closing), or by this one
/// with no handle open (sled lets go a moment after its last handle is
/// dropped), is waited for, up to two seconds; a lock held by a live
/// process's handle is reported at once.
pub(super) fn open_sled(dir: &Path, cache_bytes: u64) -> Result<sled::Db, LogError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let opened = sled_config(dir).cache_capacity(cache_bytes).open();
        match opened.map_err(|source| open_error(dir, source)) {
            Err(LogError::Locked { .. })
                if !holder_alive(dir) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Ok(db) => {
                sync_conf(dir)?;
                return Ok(db);
            }
            other => return other,
        }
    }
}

/// Makes sled's `conf` file durable, with its directory entry. sled writes
/// it in two writes (the settings, then their checksum) and never syncs
/// it: a power cut between them, even long after, left a file whose
/// checksum was missing, and sled then refuses the whole directory (found
/// by the power-cut tests).
pub(super) fn sync_conf(dir: &Path) -> Result<(), LogError> {
    let path = dir.join("conf");
    let synced = File::open(&path)
        .and_then(|f| f.sync_all())
        .and_then(|()| File::open(dir)?.sync_all());
    synced.map_err(|source| LogError::Io {
        path: path.display().to_string(),
        source: std::sync::Arc::new(source),
    })
}

/// sled's settings for the data directory `dir`: zstd compression and
/// 64 KiB segments for a new one; for one sled already created,
/// the compression and segment size it was created with (sled refuses to
/// open a directory with others), read from its `conf` file; a page cache
/// of [`DEFAULT_CACHE_BYTES`]. Anything that opens a data directory's sled
/// itself must open it with these.
pub fn sled_config(dir: &Path) -> sled::Config {
    let (compression, segment) = created_with(dir).unwrap_or((true, SEGMENT_BYTES));
    sled::Config::new()
        .path(dir)
        // sled's own background flush would compete with the write-ahead
        // file's fdatasync for the device; checkpoints flush sled instead.
        .flush_every_ms(None)
        .use_compression(compression)
        .compression_factor(COMPRESSION_LEVEL)
        .segment_size(segment)
        .cache_capacity(DEFAULT_CACHE_BYTES)
}

/// The compression and segment size recorded in sled's `conf` file
/// (`segment_size: N`, `use_compression: BOOL` lines), if there is one.
pub(super) fn created_with(dir: &Path) -> Option<(bool, usize)> {
    let bytes = std::fs::read(dir.join("conf")).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(": "))
            .map(str::trim)
    };
    Some((
        value("use_compression")?.parse().ok()?,
        value("segment_size")?.parse().ok()?,
    ))
}

/// Whether the process the holder note names still runs.
pub(super) fn holder_alive(dir: &Path) -> bool {
    let note = std::fs::read_to_string(dir.join(HOLDER_FILE)).unwrap_or_default();
    let pid = note
        .strip_prefix("pid ")
        .and_then(|rest| rest.split(':').next())
        .and_then(|pid| pid.trim().parse::<u32>().ok());
    match pid {
        Some(pid) if pid == std::process::id() => held_here(dir),
        Some(pid) => Path::new(&format!("/proc/{pid}")).exists(),
        None => true,
    }
}

pub(super) fn open_error(dir: &Path, source: sled::Error) -> LogError {
    let text = source.to_string();
    let locked = match &source {
        sled::Error::Io(e) => e.kind() == std::io::ErrorKind::WouldBlock || text.contains("lock"),
        _ => false,
    };
    if locked {
        let holder = std::fs::read_to_string(dir.join(HOLDER_FILE))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "holder unknown".into());
        return LogError::Locked {
            dir: dir.display().to_string(),
            holder,
        };
    }
    let dir = dir.display().to_string();
    match source {
        sled::Error::Corruption { .. } => LogError::CorruptStore {
            dir,
            source: std::sync::Arc::new(source),
        },
        source => LogError::Storage {
            dir,
            source: std::sync::Arc::new(source),
        },
    }
}

/// Leaves a note naming this process (`pid N: holder`), for the error a
/// second opener gets. Best effort: the note is advice, the lock is sled's.
pub(super) fn write_holder(dir: &Path, holder: &str) {
    let note = format!("pid {}: {holder}", std::process::id());
    let _ = crate::create_private(&dir.join(HOLDER_FILE))
        .and_then(|mut file| std::io::Write::write_all(&mut file, note.as_bytes()));
}

/// Creates `dir` (mode 0700) if needed; refuses it if this process cannot
/// write it; tightens it to 0700 if others can enter it.
pub(super) fn private_dir(dir: &Path) -> Result<(), LogError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let io = |source| LogError::Io {
        path: dir.display().to_string(),
        source: std::sync::Arc::new(source),
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    writable(dir).map_err(|source| match source.raw_os_error() {
        Some(libc::EACCES | libc::EROFS | libc::EPERM) => LogError::NotWritable {
            dir: dir.display().to_string(),
            source: std::sync::Arc::new(source),
        },
        _ => io(source),
    })?;
    let mode = std::fs::metadata(dir).map_err(io)?.permissions().mode();
    if mode & 0o077 != 0 {
        let tight = std::fs::Permissions::from_mode(mode & 0o7700);
        std::fs::set_permissions(dir, tight).map_err(io)?;
    }
    Ok(())
}

/// Whether this process (by its effective ids) may create files in `dir`.
pub(super) fn writable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: faccessat(2) only reads the NUL-terminated path, which lives
    // until it returns.
    let status =
        unsafe { libc::faccessat(libc::AT_FDCWD, path.as_ptr(), libc::W_OK, libc::AT_EACCESS) };
    match status {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}
