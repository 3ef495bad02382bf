//! Opening after a crash: the anchor that proves nothing was lost, blob
//! files synced, records scanned and checked, in parallel for big stores.

use super::*;

impl Totals {
    pub(super) fn load(path: &Path) -> std::io::Result<Option<Totals>> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut numbers = text
            .split_whitespace()
            .filter_map(|w| w.parse::<u64>().ok());
        match (numbers.next(), numbers.next()) {
            (Some(sessions), Some(records)) => Ok(Some(Totals { sessions, records })),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("expected `sessions N records M`, found {text:?}"),
            )),
        }
    }

    /// Writes the file atomically and durably (temporary file, fsync, rename).
    pub(super) fn store(&self, path: &Path) -> std::io::Result<()> {
        let temp = path.with_extension("tmp");
        let mut file = crate::create_private(&temp)?;
        std::io::Write::write_all(
            &mut file,
            format!("sessions {} records {}\n", self.sessions, self.records).as_bytes(),
        )?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
    }
}

/// sled keeps values too big for its pages in separate blob files, which
/// its flush does not fsync. sled writes a blob file once (one `write`) and
/// never changes it, so only files not in `synced` already, by name and
/// length, are synced (checkpoints come often; a directory may hold many
/// blobs; one still being written when listed has another length later),
/// then the directory, which makes their names durable; `synced` becomes
/// the files there now.
pub(super) fn sync_blobs(
    dir: &Path,
    synced: &mut HashSet<(std::ffi::OsString, u64)>,
) -> std::io::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut now = HashSet::new();
    let mut created = false;
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    for entry in entries {
        let entry = entry?;
        // sled removes the blobs of values that were replaced.
        let len = match entry.metadata() {
            Err(e) if gone(&e) => continue,
            other => other?.len(),
        };
        let file = (entry.file_name(), len);
        if !synced.contains(&file) {
            match File::open(entry.path()).and_then(|f| f.sync_all()) {
                Err(e) if gone(&e) => continue,
                other => other?,
            }
            created = true;
        }
        now.insert(file);
    }
    if created {
        // A new file's name is durable once its directory is.
        File::open(dir)?.sync_all()?;
    }
    *synced = now;
    Ok(())
}

/// Below this many records, checking them on one thread is faster.
pub(super) const PARALLEL_OPEN_MIN: u64 = 2048;
/// Records checked as one unit of work on a helper thread.
pub(super) const OPEN_CHUNK: usize = 1024;

pub(super) type Stored = (u64, sled::IVec);
pub(super) type Checked = Result<Vec<Record>, LogError>;

pub(super) fn open_chunk(session: Uuid, chunk: &[Stored]) -> Checked {
    chunk
        .iter()
        .map(|(seq, bytes)| Record::open(session, *seq, bytes))
        .collect()
}

/// Scans `stored` and checks every record (decoding and hashing it: that
/// dominates replay). Long scans hand chunks to rayon's pool while this
/// thread keeps scanning; the result is in scan order.
pub(super) fn scan_and_open(
    session: Uuid,
    stored: impl Iterator<Item = Result<Stored, LogError>>,
    long: bool,
) -> Checked {
    if !long || rayon::current_num_threads() < 2 {
        let stored: Vec<Stored> = stored.collect::<Result<_, _>>()?;
        return open_chunk(session, &stored);
    }
    // This thread scans sled; each full chunk is checked on rayon's pool
    // meanwhile.
    let (done, results) = mpsc::channel::<(usize, Checked)>();
    let (chunks, scan_error) = rayon::in_place_scope(|scope| {
        let mut chunks = 0;
        let mut chunk = Vec::with_capacity(OPEN_CHUNK);
        let mut scan_error = None;
        let check = |index: usize, chunk: Vec<Stored>| {
            let done = done.clone();
            scope.spawn(move |_| {
                let _ = done.send((index, open_chunk(session, &chunk)));
            });
        };
        for item in stored {
            match item {
                Ok(record) => chunk.push(record),
                Err(e) => {
                    scan_error = Some(e);
                    break;
                }
            }
            if chunk.len() == OPEN_CHUNK {
                check(
                    chunks,
                    std::mem::replace(&mut chunk, Vec::with_capacity(OPEN_CHUNK)),
                );
                chunks += 1;
            }
        }
        if !chunk.is_empty() {
            check(chunks, chunk);
            chunks += 1;
        }
        (chunks, scan_error)
    });
    drop(done);
    if let Some(e) = scan_error {
        return Err(e);
    }
    let mut parts: Vec<Option<Checked>> = (0..chunks).map(|_| None).collect();
    for (index, part) in results {
        parts[index] = Some(part);
    }
    let mut records = Vec::with_capacity(chunks * OPEN_CHUNK);
    for part in parts {
        records.extend(part.expect("every chunk is checked")?);
    }
    Ok(records)
}
