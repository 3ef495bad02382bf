//! The sled backend of [`EventLog`].
//!
//! One sled tree holds two kinds of keys:
//! - `e ‖ session (16 bytes) ‖ seq (u64 big-endian)` → a stored record;
//! - `s ‖ session` → the session's [`StoredMeta`] (head and timestamps).
//!
//! Durability and atomicity come from mneme's write-ahead file
//! ([`crate::wal`]), not from sled: each append is written there first (all
//! its records in one `write(2)`), synced barriers share `fdatasync`s of it
//! (group commit), and opening the log puts into sled whatever sled lost and
//! brings each session's meta up to its last record (the records are the
//! truth). A checkpoint (sled flush + `fdatasync` of sled's files) empties
//! the file.
//!
//! One writer per store, behind an async lock: an append (or import) takes
//! it on the caller's task, checks and seals its records, writes them to the
//! write-ahead file (one `write(2)` into the page cache) and inserts them into
//! sled's memory, tens of microseconds, with no thread to wake and none to
//! wake it back. A dedicated sync thread does what may wait on the device:
//! every `fdatasync` and checkpoint, so no tokio worker ever waits on one.
//! Group commit is its channel: it takes every synced barrier waiting in it,
//! notes how far the file is written, and one `fdatasync` answers them all
//! (each was enqueued after the appends it covers). Appends go on while it
//! syncs; barriers that come meanwhile form the next batch.
//!
//! Reads: point lookups (a head not cached, derived data) stay inline, as
//! sled serves them from its page cache in microseconds; range scans and the
//! listing of sessions (which may read and check many records) run on
//! tokio's blocking pool.

use crate::wal::{Frame, Wal};
use crate::Totals;
use crate::{
    now_ms, Durability, Envelope, EventLog, Hash, Head, Lease, LocalLeases, LogError, NewEvent,
    Record, SessionMeta,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use tokio::sync::oneshot;
use uuid::Uuid;

const EVENT_PREFIX: u8 = b'e';
const META_PREFIX: u8 = b's';
const DERIVED_PREFIX: u8 = b'd';
const HOLDER_FILE: &str = "mneme.holder";
/// Sessions and records at the last checkpoint: what sled must still hold.
const ANCHOR_FILE: &str = "mneme.anchor";
const WAL_FILE: &str = "mneme.wal";
/// The write-ahead file is emptied into sled once it grows past this. It
/// holds every record since the last checkpoint uncompressed, so this bounds
/// what it adds to the directory; a checkpoint costs a few `fdatasync`s, about
/// a thousand 1 KiB events apart.
const CHECKPOINT_BYTES: u64 = 1 << 20;
/// sled's log segment size for a new data directory. sled cleans a segment
/// once half of it is dead; smaller segments are cleaned sooner (records are
/// rewritten several times as sled consolidates its pages). Values over a
/// quarter of a segment (compressed) go to blob files of their own.
const SEGMENT_BYTES: usize = 64 << 10;
/// zstd level of sled's compression in a new data directory: the cheapest.
const COMPRESSION_LEVEL: i32 = 1;
/// What sled's page cache holds at most by default, counted as sled counts
/// it: the bytes its pages take on disk, compressed (the process holds
/// more for them). sled's own default is 1 GiB. Appends touch only the
/// last pages of each session, and a daemon keeps its active sessions
/// folded in memory, so the cache serves mostly cold reads.
pub const DEFAULT_CACHE_BYTES: u64 = 128 << 20;

/// An [`EventLog`] in a sled database in one directory.
///
/// Only one process can hold a directory; a second gets [`LogError::Locked`]
/// naming the holder.
pub struct SledLog {
    shared: Arc<Shared>,
    /// The writer, taken in turn by appends and by the sync thread.
    writer: Arc<tokio::sync::Mutex<Writer>>,
    /// Requests to the sync thread; dropped first on close, which ends it.
    requests: Option<mpsc::Sender<Request>>,
    /// The sync thread, joined on close (it checkpoints as it ends).
    syncer: Option<std::thread::JoinHandle<()>>,
    /// The directory, as [`held_here`] knows it while this handle is open.
    held: PathBuf,
}

/// The data directories this process holds open, canonical.
static HELD: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Whether a handle of this process holds `dir` open. sled lets go of its
/// lock a moment after its last handle is dropped, so a directory this
/// process just closed may still be locked by it without being held.
fn held_here(dir: &Path) -> bool {
    HELD.lock()
        .expect("held lock poisoned")
        .contains(&held_name(dir))
}

/// The name [`HELD`] knows `dir` by: its canonical path, if it has one.
fn held_name(dir: &Path) -> PathBuf {
    dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf())
}

/// Notes `dir` as held by this process (`true`) or no longer (`false`).
fn note_held(dir: &Path, holds: bool) {
    let mut held = HELD.lock().expect("held lock poisoned");
    match holds {
        true => held.insert(dir.to_path_buf()),
        false => held.remove(dir),
    };
}

/// What the handle, the writer and blocking reads share.
struct Shared {
    dir: PathBuf,
    db: sled::Db,
    /// sled's data file, for the `fdatasync` that sled's own flush omits.
    data_file: File,
    /// Records replayed from the write-ahead file when the log was opened.
    recovered: u64,
    /// A partial last write found in the write-ahead file on open.
    torn_tail: Option<crate::TornTail>,
    /// Cached session metadata; only the writer inserts.
    metas: Mutex<HashMap<Uuid, StoredMeta>>,
    /// `fdatasync`s of the write-ahead file issued by synced barriers.
    syncs: AtomicU64,
    /// The one process that holds the directory is the only writer.
    leases: LocalLeases,
    /// Tests: the next this many syncs fail with EIO.
    #[cfg(test)]
    fail_syncs: std::sync::atomic::AtomicU32,
    /// Tests: the next this many fsyncs of sled's data file fail with EIO.
    #[cfg(test)]
    fail_data_syncs: std::sync::atomic::AtomicU32,
}

/// What callers ask of the sync thread.
enum Request {
    /// A synced barrier: answered once everything appended before it was
    /// enqueued is on stable storage.
    Sync(oneshot::Sender<Result<(), LogError>>),
    /// The write-ahead file grew past [`CHECKPOINT_BYTES`]: empty it.
    Checkpoint,
}

/// The writer: the only owner of the write-ahead file.
///
/// Positions are values of `appended`. A failed sync fails every waiter of
/// its batch; after one, the kernel may have dropped the file's dirty pages,
/// so a later `fdatasync` proves nothing about them: until a checkpoint
/// (sled flush and fsync, from sled's copy in memory) covers the failed
/// range, syncs checkpoint instead.
struct Writer {
    shared: Arc<Shared>,
    wal: Wal,
    /// Sessions and records in the log, kept for the checkpoint anchor.
    totals: Totals,
    /// Bytes ever appended to the write-ahead file by appends that
    /// succeeded, since the log was opened. Never decreases (the file itself
    /// is emptied at checkpoints).
    appended: u64,
    /// sled's blob files synced by a checkpoint already.
    synced_blobs: HashSet<(std::ffi::OsString, u64)>,
    /// Everything up to this position is on stable storage.
    durable: u64,
    /// A sync failed and no checkpoint has covered its range since.
    suspect: bool,
    /// What failed when an fsync of sled's files did, if one has. The
    /// kernel may have dropped the pages it could not write, and sled will
    /// not write them again, so no later fsync proves them durable: the
    /// write-ahead file, which still holds every record since the last
    /// checkpoint, is never emptied again by this process, and appends are
    /// refused until the log is opened again (which replays it into sled).
    sled_unsynced: Option<String>,
    /// Sessions whose head in sled lags the cached one: appended to since
    /// the last checkpoint, which writes their heads (until then the
    /// write-ahead file holds their records, and recovery repairs a head
    /// from the records).
    stale_heads: HashSet<Uuid>,
    /// A checkpoint was asked of the sync thread and has not run yet.
    checkpoint_asked: bool,
}

/// The sync thread: `fdatasync`s of the write-ahead file for synced
/// barriers, and checkpoints.
struct Syncer {
    writer: Arc<tokio::sync::Mutex<Writer>>,
    shared: Arc<Shared>,
    /// The write-ahead file's descriptor, for the barriers' `fdatasync`.
    wal_sync: File,
}

/// Tests: EIO while `failures` (then counted down) is above zero.
#[cfg(test)]
fn injected_eio(failures: &std::sync::atomic::AtomicU32) -> std::io::Result<()> {
    match failures.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)) {
        Ok(_) => Err(std::io::Error::from_raw_os_error(libc::EIO)),
        Err(_) => Ok(()),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredMeta {
    head_seq: u64,
    head_hash: Hash,
    created_ms: i64,
    updated_ms: i64,
    last_kind: String,
}

impl SledLog {
    /// [`SledLog::open_as`], the holder note naming this process by its
    /// program's file name.
    pub fn open(dir: impl AsRef<Path>) -> Result<SledLog, LogError> {
        let program = std::env::args_os()
            .next()
            .map(PathBuf::from)
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "unknown program".into());
        SledLog::open_as(dir, &program)
    }

    /// [`SledLog::open_with`], with a page cache of [`DEFAULT_CACHE_BYTES`].
    pub fn open_as(dir: impl AsRef<Path>, holder: &str) -> Result<SledLog, LogError> {
        SledLog::open_with(dir, holder, DEFAULT_CACHE_BYTES)
    }

    /// Opens the log in `dir`, creating the directory readable by its owner
    /// only (0700) if needed, and tightening an existing one that others
    /// can enter to 0700: the log holds whatever the model and the tools
    /// said. The files the log itself creates are 0600 (sled's own follow
    /// the process's umask). A directory this process cannot write is
    /// refused with [`LogError::NotWritable`] before anything is touched.
    /// `holder` is how the note left for a second opener names this process
    /// beside its pid (such as `mneme run`); keep what a user typed out of it.
    /// sled's page cache holds at most `cache_bytes` (see
    /// [`DEFAULT_CACHE_BYTES`] for how sled counts them).
    ///
    /// Opening recovers and checkpoints on the calling thread (it is done
    /// once, before the log serves anyone), then starts the writer thread.
    pub fn open_with(
        dir: impl AsRef<Path>,
        holder: &str,
        cache_bytes: u64,
    ) -> Result<SledLog, LogError> {
        let dir = dir.as_ref().to_path_buf();
        private_dir(&dir)?;
        let db = open_sled(&dir, cache_bytes)?;
        let data_path = dir.join("db");
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| LogError::Io {
                path,
                source: std::sync::Arc::new(source),
            }
        };
        let data_file = File::open(&data_path).map_err(io(&data_path))?;
        let wal_path = dir.join(WAL_FILE);
        let (wal, frames) = Wal::open(&wal_path).map_err(io(&wal_path))?;
        let wal_sync = File::open(&wal_path).map_err(io(&wal_path))?;
        write_holder(&dir, holder);
        let mut shared = Shared {
            dir,
            db,
            data_file,
            recovered: 0,
            torn_tail: wal.torn_tail().cloned(),
            metas: Mutex::new(HashMap::new()),
            syncs: AtomicU64::new(0),
            leases: LocalLeases::default(),
            #[cfg(test)]
            fail_syncs: std::sync::atomic::AtomicU32::new(0),
            #[cfg(test)]
            fail_data_syncs: std::sync::atomic::AtomicU32::new(0),
        };
        // Before the replay: records replayed since the checkpoint must not
        // make up for checkpointed ones sled lost.
        shared.check_anchor(shared.count()?)?;
        shared.recovered = shared.recover(frames)?;
        let totals = shared.count()?;
        let mut writer = Writer {
            shared: Arc::new(shared),
            wal,
            totals,
            appended: 0,
            durable: 0,
            suspect: false,
            sled_unsynced: None,
            synced_blobs: HashSet::new(),
            stale_heads: HashSet::new(),
            checkpoint_asked: false,
        };
        writer.checkpoint()?;
        let shared = writer.shared.clone();
        let writer = Arc::new(tokio::sync::Mutex::new(writer));
        let syncer = Syncer {
            writer: writer.clone(),
            shared: shared.clone(),
            wal_sync,
        };
        let (requests, queue) = mpsc::channel();
        let syncer = std::thread::Builder::new()
            .name("mneme-log-sync".into())
            .spawn(move || syncer.run(queue))
            .map_err(io(&shared.dir))?;
        let held = held_name(&shared.dir);
        note_held(&held, true);
        Ok(SledLog {
            shared,
            writer,
            requests: Some(requests),
            syncer: Some(syncer),
            held,
        })
    }

    /// A partial last write found in the write-ahead file when the log was
    /// opened (set aside, never acknowledged as synced), if any.
    pub fn torn_tail(&self) -> Option<crate::TornTail> {
        self.shared.torn_tail.clone()
    }

    /// `fdatasync`s of the write-ahead file issued by synced barriers so
    /// far, for metrics (with group commit, fewer than the barriers).
    pub fn syncs(&self) -> u64 {
        self.shared.syncs.load(Ordering::Relaxed)
    }

    /// How many records opening the log replayed from the write-ahead file
    /// into sled (records sled had lost in a crash).
    pub fn recovered(&self) -> u64 {
        self.shared.recovered
    }

    /// The directory this log lives in.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Hands `request` to the writer.
    fn send(&self, request: Request) -> Result<(), LogError> {
        self.requests
            .as_ref()
            .and_then(|requests| requests.send(request).ok())
            .ok_or_else(|| self.shared.writer_stopped())
    }

    /// Runs `write` with the writer, on the caller's task, then asks the
    /// sync thread for a checkpoint if the write-ahead file grew past
    /// [`CHECKPOINT_BYTES`].
    async fn with_writer<T>(
        &self,
        write: impl FnOnce(&mut Writer) -> Result<T, LogError>,
    ) -> Result<T, LogError> {
        let mut writer = self.writer.lock().await;
        let written = write(&mut writer);
        let due = writer.checkpoint_due();
        drop(writer);
        if due {
            // The write is done either way: with no sync thread left to ask,
            // the write-ahead file keeps the records until the next open.
            let _ = self.send(Request::Checkpoint);
        }
        written
    }

    /// Runs `work` on tokio's blocking pool (inline outside a runtime).
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Shared) -> Result<T, LogError> + Send + 'static,
    ) -> Result<T, LogError> {
        let shared = self.shared.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => match handle.spawn_blocking(move || work(&shared)).await {
                Ok(result) => result,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Err(self.shared.writer_stopped()),
            },
            Err(_) => work(&shared),
        }
    }
}

impl Syncer {
    /// Serves requests until every handle is gone, then checkpoints.
    fn run(self, queue: mpsc::Receiver<Request>) {
        while let Ok(first) = queue.recv() {
            let mut waiters = Vec::new();
            let mut checkpoint = false;
            for request in std::iter::once(first).chain(queue.try_iter()) {
                match request {
                    Request::Sync(reply) => waiters.push(reply),
                    Request::Checkpoint => checkpoint = true,
                }
            }
            if checkpoint {
                let mut writer = self.writer.blocking_lock();
                writer.checkpoint_asked = false;
                // A failed checkpoint is asked again by the next append;
                // the write-ahead file keeps the records meanwhile.
                let _ = writer.checkpoint();
            }
            if !waiters.is_empty() {
                let result = self.sync();
                for waiter in waiters {
                    let _ = waiter.send(result.as_ref().map(|_| ()).map_err(Clone::clone));
                }
            }
        }
        // A clean close checkpoints, so the next open has nothing to replay.
        // If it fails, the write-ahead file still holds every record.
        let _ = self.writer.blocking_lock().checkpoint();
    }

    /// Makes everything appended so far durable: one `fdatasync` of the
    /// write-ahead file (appends go on meanwhile), or a checkpoint while a
    /// failed sync's range is not covered yet; nothing if nothing was
    /// appended since.
    fn sync(&self) -> Result<(), LogError> {
        let target = {
            let mut writer = self.writer.blocking_lock();
            if writer.all_durable() {
                return Ok(());
            }
            if writer.suspect {
                return writer.checkpoint();
            }
            writer.appended
        };
        self.shared.syncs.fetch_add(1, Ordering::Relaxed);
        let result = self.sync_data().map_err(|source| LogError::Io {
            path: self.shared.dir.join(WAL_FILE).display().to_string(),
            source: std::sync::Arc::new(source),
        });
        let mut writer = self.writer.blocking_lock();
        match &result {
            Ok(()) => writer.durable = writer.durable.max(target),
            Err(_) => writer.suspect = true,
        }
        result
    }

    fn sync_data(&self) -> std::io::Result<()> {
        #[cfg(test)]
        injected_eio(&self.shared.fail_syncs)?;
        self.wal_sync.sync_data()
    }
}

impl Writer {
    /// Makes sled's copy durable, records the anchor, then empties the
    /// write-ahead file. Everything appended is then durable.
    fn checkpoint(&mut self) -> Result<(), LogError> {
        self.checkpoint_files()?;
        self.durable = self.appended;
        self.suspect = false;
        Ok(())
    }

    fn checkpoint_files(&mut self) -> Result<(), LogError> {
        if self.wal.is_empty() {
            return Ok(());
        }
        self.refuse_if_sled_unsynced()?;
        self.store_heads()?;
        let shared = &self.shared;
        shared.db.flush().map_err(|e| shared.storage(e))?;
        let io = |path: PathBuf| {
            move |source| LogError::Io {
                path: path.display().to_string(),
                source: std::sync::Arc::new(source),
            }
        };
        let synced = self
            .sync_data_file()
            .map_err(io(shared.dir.join("db")))
            .and_then(|()| {
                sync_blobs(&shared.dir.join("blobs"), &mut self.synced_blobs)
                    .map_err(io(shared.dir.join("blobs")))
            });
        if let Err(error) = &synced {
            self.sled_unsynced = Some(error.to_string());
        }
        synced?;
        let shared = &self.shared;
        let anchor = shared.dir.join(ANCHOR_FILE);
        self.totals.store(&anchor).map_err(io(anchor))?;
        crate::crash::point(crate::crash::LOG_CHECKPOINT_SYNCED);
        self.wal
            .truncate()
            .map_err(io(self.wal.path().to_path_buf()))
    }

    /// Writes into sled the cached head of every session appended to
    /// since the last checkpoint.
    fn store_heads(&mut self) -> Result<(), LogError> {
        let shared = &self.shared;
        let heads: Vec<(Uuid, Vec<u8>)> = {
            let metas = shared.metas.lock().expect("meta lock poisoned");
            (self.stale_heads.iter())
                .filter_map(|id| metas.get(id).map(|meta| (*id, encode_meta(meta))))
                .collect()
        };
        for (session, meta) in heads {
            (shared.db.insert(meta_key(session), meta)).map_err(|e| shared.storage(e))?;
        }
        self.stale_heads.clear();
        Ok(())
    }

    /// The session's meta, from the cache or from sled.
    fn meta_of(&self, session: Uuid) -> Result<Option<StoredMeta>, LogError> {
        let cached = self
            .shared
            .metas
            .lock()
            .expect("meta lock poisoned")
            .get(&session)
            .cloned();
        match cached {
            Some(meta) => Ok(Some(meta)),
            None => self.shared.load_meta(session),
        }
    }

    fn append(
        &mut self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        self.refuse_if_sled_unsynced()?;
        let meta = self.meta_of(session)?;
        let head_seq = meta.as_ref().map_or(0, |m| m.head_seq);
        if expected_seq != head_seq + 1 {
            return Err(LogError::Conflict {
                session,
                expected: expected_seq,
                actual: head_seq + 1,
            });
        }
        let now = now_ms();
        let mut meta = meta.unwrap_or_else(|| StoredMeta::new(now));
        let mut sealed = Vec::with_capacity(events.len());
        let mut records = Vec::with_capacity(events.len());
        for event in events {
            let envelope = Envelope {
                session,
                seq: meta.head_seq + 1,
                event_id: Uuid::now_v7(),
                ts_ms: now,
                caused_by: event.caused_by,
                schema: event.schema,
                kind: event.kind,
                prev_hash: meta.head_hash,
                payload: event.payload,
            };
            let (record, bytes) = Record::seal(envelope)?;
            meta.advance(&record);
            sealed.push(bytes);
            records.push(record);
        }
        self.store(session, meta, &records, sealed)?;
        Ok(records)
    }

    fn import(&mut self, session: Uuid, sealed: Vec<Vec<u8>>) -> Result<Head, LogError> {
        self.refuse_if_sled_unsynced()?;
        let meta = self.meta_of(session)?;
        let head = meta.as_ref().map_or(Head::EMPTY, |m| Head {
            seq: m.head_seq,
            hash: m.head_hash,
        });
        let records = crate::open_sealed(session, head, &sealed)?;
        let Some(first) = records.first() else {
            return Ok(head);
        };
        let mut meta = meta.unwrap_or_else(|| StoredMeta::new(first.envelope.ts_ms));
        for record in &records {
            meta.advance(record);
        }
        let head = Head {
            seq: meta.head_seq,
            hash: meta.head_hash,
        };
        self.store(session, meta, &records, sealed)?;
        Ok(head)
    }

    /// Stores checked, sealed records that follow the session's head: first
    /// in the write-ahead file, then in sled; `meta` is the head after them.
    fn store(
        &mut self,
        session: Uuid,
        meta: StoredMeta,
        records: &[Record],
        sealed: Vec<Vec<u8>>,
    ) -> Result<(), LogError> {
        let new_session = records.first().is_some_and(|r| r.envelope.seq == 1);
        let frames: Vec<Frame> = records
            .iter()
            .zip(sealed)
            .map(|(r, bytes)| (event_key(session, r.envelope.seq).to_vec(), bytes))
            .collect();
        let appended = self.wal.append(&frames).map_err(|source| LogError::Io {
            path: self.wal.path().display().to_string(),
            source: std::sync::Arc::new(source),
        })?;
        crate::crash::point(crate::crash::LOG_WAL_WRITTEN);
        // Plain inserts, not a sled batch: a batch forces sled to write and
        // sync its buffer on every append. Atomicity comes from the
        // write-ahead file. The session's head goes into sled at the next
        // checkpoint (each insert costs sled a compression); until then it
        // is served from the cache, and recovery repairs it from the
        // records the write-ahead file holds.
        if let Err(e) = self.shared.insert_all(frames) {
            self.wal.cut_back_to(appended.before);
            return Err(e);
        }
        self.stale_heads.insert(session);
        self.appended += appended.bytes;
        self.totals.records += records.len() as u64;
        self.totals.sessions += u64::from(new_session);
        self.shared
            .metas
            .lock()
            .expect("meta lock poisoned")
            .insert(session, meta);
        Ok(())
    }

    /// The error of a log whose sled failed an fsync (see
    /// [`Writer::sled_unsynced`]), if it did.
    fn refuse_if_sled_unsynced(&self) -> Result<(), LogError> {
        match &self.sled_unsynced {
            None => Ok(()),
            Some(failed) => Err(LogError::Io {
                path: self.shared.dir.display().to_string(),
                source: std::sync::Arc::new(std::io::Error::other(format!(
                    "an fsync of sled's files failed earlier ({failed}); after a failed fsync \
                     no later one proves those pages durable, so this process takes no more \
                     appends and keeps the write-ahead file; open the log again (restart \
                     mneme) to replay it into sled"
                ))),
            }),
        }
    }

    /// `fdatasync` of sled's data file.
    fn sync_data_file(&self) -> std::io::Result<()> {
        #[cfg(test)]
        injected_eio(&self.shared.fail_data_syncs)?;
        self.shared.data_file.sync_data()
    }

    /// Whether everything appended is durable already.
    fn all_durable(&self) -> bool {
        self.durable >= self.appended
    }

    /// Whether the write-ahead file is due to be emptied and no checkpoint
    /// was asked for yet (once this answers yes, it is asked for).
    fn checkpoint_due(&mut self) -> bool {
        let due = self.wal.len() > CHECKPOINT_BYTES && !self.checkpoint_asked;
        self.checkpoint_asked |= due;
        due
    }
}

impl Shared {
    fn writer_stopped(&self) -> LogError {
        LogError::Io {
            path: self.dir.display().to_string(),
            source: std::sync::Arc::new(std::io::Error::other("the log's writer thread stopped")),
        }
    }

    /// Puts into sled every write-ahead record it lacks or holds otherwise,
    /// and brings the head of each session concerned up to its last
    /// write-ahead record (the opener then checkpoints).
    ///
    /// A different record sled holds at a frame's key is one a power cut
    /// kept in sled's file while it took that record's own frame (never
    /// synced, so never acknowledged); the session went on without it, and
    /// the frame, written after it, is the record. Records sled holds past
    /// a session's last frame are such records too, and stay past its head.
    fn recover(&self, frames: Vec<Frame>) -> Result<u64, LogError> {
        let mut recovered = 0;
        let mut last = std::collections::BTreeMap::new();
        for (key, value) in frames {
            let (session, seq) = parse_event_key(&key);
            let stored = self.db.get(&key).map_err(|e| self.storage(e))?;
            let record = Record::open(session, seq, &value)?;
            if stored.as_deref() == Some(&value[..]) {
                last.insert(session, record);
                continue;
            }
            let prev = match seq {
                1 => Head::EMPTY,
                _ => self.stored_head_at(session, seq - 1)?,
            };
            crate::check_link(session, &prev, &record)?;
            self.db.insert(key, value).map_err(|e| self.storage(e))?;
            last.insert(session, record);
            recovered += 1;
        }
        for (session, record) in last {
            self.repair_meta(session, &record)?;
        }
        Ok(recovered)
    }

    /// The record at `seq` as a chain head; an error if it is missing.
    fn stored_head_at(&self, session: Uuid, seq: u64) -> Result<Head, LogError> {
        let bytes = self
            .db
            .get(event_key(session, seq))
            .map_err(|e| self.storage(e))?;
        let Some(bytes) = bytes else {
            return Err(LogError::Corrupt {
                session,
                seq,
                reason: "missing record: a later record survived a crash without it".into(),
            });
        };
        let record = Record::open(session, seq, &bytes)?;
        Ok(Head {
            seq,
            hash: record.hash,
        })
    }

    /// Moves the session's head in sled up to `last`, its last write-ahead
    /// record, unless it is there already (a checkpoint wrote it and the
    /// emptying of the write-ahead file did not follow).
    fn repair_meta(&self, session: Uuid, last: &Record) -> Result<(), LogError> {
        let meta = self.load_meta(session)?;
        if meta
            .as_ref()
            .is_some_and(|m| m.head_seq >= last.envelope.seq)
        {
            return Ok(());
        }
        let mut meta = meta.unwrap_or_else(|| StoredMeta::new(last.envelope.ts_ms));
        meta.advance(last);
        self.db
            .insert(meta_key(session), encode_meta(&meta))
            .map_err(|e| self.storage(e))?;
        Ok(())
    }

    /// Sessions and records, from the session heads (one key per session).
    fn count(&self) -> Result<Totals, LogError> {
        let sessions = self.sessions()?;
        Ok(Totals {
            sessions: sessions.len() as u64,
            records: sessions.iter().map(|m| m.events).sum(),
        })
    }

    /// Refuses a directory whose sled holds fewer sessions or records than
    /// its last checkpoint recorded: sled lost synced data (a torn or
    /// truncated file it recovered a prefix of), and resuming from the rest
    /// would silently drop acknowledged events.
    fn check_anchor(&self, now: Totals) -> Result<(), LogError> {
        let path = self.dir.join(ANCHOR_FILE);
        let Some(then) = Totals::load(&path).map_err(|source| LogError::Io {
            path: path.display().to_string(),
            source: std::sync::Arc::new(source),
        })?
        else {
            return Ok(());
        };
        if now.sessions < then.sessions || now.records < then.records {
            return Err(LogError::LostRecords {
                dir: self.dir.display().to_string(),
                expected: then,
                found: now,
            });
        }
        Ok(())
    }

    fn keys(&self) -> crate::keys::KeyFiles {
        crate::keys::KeyFiles::new(&self.dir)
    }

    fn key_io(&self, source: std::io::Error) -> LogError {
        LogError::Io {
            path: self.dir.join(crate::KEYS_DIR).display().to_string(),
            source: std::sync::Arc::new(source),
        }
    }

    fn storage(&self, source: sled::Error) -> LogError {
        LogError::Storage {
            dir: self.dir.display().to_string(),
            source: std::sync::Arc::new(source),
        }
    }

    fn load_meta(&self, session: Uuid) -> Result<Option<StoredMeta>, LogError> {
        let Some(bytes) = self
            .db
            .get(meta_key(session))
            .map_err(|e| self.storage(e))?
        else {
            return Ok(None);
        };
        rmp_serde::from_slice(&bytes)
            .map(Some)
            .map_err(|e| LogError::Corrupt {
                session,
                seq: 0,
                reason: format!("session metadata does not decode: {e}"),
            })
    }
}

impl Totals {
    fn load(path: &Path) -> std::io::Result<Option<Totals>> {
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
    fn store(&self, path: &Path) -> std::io::Result<()> {
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
fn sync_blobs(dir: &Path, synced: &mut HashSet<(std::ffi::OsString, u64)>) -> std::io::Result<()> {
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
const PARALLEL_OPEN_MIN: u64 = 2048;
/// Records checked as one unit of work on a helper thread.
const OPEN_CHUNK: usize = 1024;

type Stored = (u64, sled::IVec);
type Checked = Result<Vec<Record>, LogError>;

fn open_chunk(session: Uuid, chunk: &[Stored]) -> Checked {
    chunk
        .iter()
        .map(|(seq, bytes)| Record::open(session, *seq, bytes))
        .collect()
}

/// Scans `stored` and checks every record (decoding and hashing it: that
/// dominates replay). Long scans hand chunks to rayon's pool while this
/// thread keeps scanning; the result is in scan order.
fn scan_and_open(
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

fn parse_event_key(key: &[u8]) -> (Uuid, u64) {
    let session = Uuid::from_slice(&key[1..17]).expect("event key holds a uuid");
    let seq = u64::from_be_bytes(key[17..25].try_into().expect("event key is 25 bytes"));
    (session, seq)
}

impl StoredMeta {
    fn new(now: i64) -> StoredMeta {
        StoredMeta {
            head_seq: 0,
            head_hash: Hash::ZERO,
            created_ms: now,
            updated_ms: now,
            last_kind: String::new(),
        }
    }

    fn advance(&mut self, record: &Record) {
        self.head_seq = record.envelope.seq;
        self.head_hash = record.hash;
        self.updated_ms = record.envelope.ts_ms;
        self.last_kind.clone_from(&record.envelope.kind);
    }
}

/// Opens sled in `dir`, its page cache bounded at `cache_bytes`. A lock held by a process that no longer runs (one
/// just killed, whose files the kernel is still closing), or by this one
/// with no handle open (sled lets go a moment after its last handle is
/// dropped), is waited for, up to two seconds; a lock held by a live
/// process's handle is reported at once.
fn open_sled(dir: &Path, cache_bytes: u64) -> Result<sled::Db, LogError> {
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
fn sync_conf(dir: &Path) -> Result<(), LogError> {
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
fn created_with(dir: &Path) -> Option<(bool, usize)> {
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
fn holder_alive(dir: &Path) -> bool {
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

fn open_error(dir: &Path, source: sled::Error) -> LogError {
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
fn write_holder(dir: &Path, holder: &str) {
    let note = format!("pid {}: {holder}", std::process::id());
    let _ = crate::create_private(&dir.join(HOLDER_FILE))
        .and_then(|mut file| std::io::Write::write_all(&mut file, note.as_bytes()));
}

/// Creates `dir` (mode 0700) if needed; refuses it if this process cannot
/// write it; tightens it to 0700 if others can enter it.
fn private_dir(dir: &Path) -> Result<(), LogError> {
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
fn writable(dir: &Path) -> std::io::Result<()> {
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

fn event_key(session: Uuid, seq: u64) -> [u8; 25] {
    let mut key = [0u8; 25];
    key[0] = EVENT_PREFIX;
    key[1..17].copy_from_slice(session.as_bytes());
    key[17..].copy_from_slice(&seq.to_be_bytes());
    key
}

fn derived_key(session: Uuid, name: &str) -> Vec<u8> {
    let mut key = vec![DERIVED_PREFIX];
    key.extend_from_slice(session.as_bytes());
    key.extend_from_slice(name.as_bytes());
    key
}

fn meta_key(session: Uuid) -> [u8; 17] {
    let mut key = [0u8; 17];
    key[0] = META_PREFIX;
    key[1..].copy_from_slice(session.as_bytes());
    key
}

fn session_meta(session: Uuid, meta: StoredMeta) -> SessionMeta {
    SessionMeta {
        session,
        events: meta.head_seq,
        created_ms: meta.created_ms,
        updated_ms: meta.updated_ms,
        last_kind: meta.last_kind,
    }
}

fn encode_meta(meta: &StoredMeta) -> Vec<u8> {
    rmp_serde::to_vec_named(meta).expect("session metadata always encodes")
}

impl Shared {
    /// Inserts an append's records. On failure, removes what it inserted
    /// (best effort), so a refused append leaves no record.
    fn insert_all(&self, frames: Vec<Frame>) -> Result<(), LogError> {
        let keys: Vec<Vec<u8>> = frames.iter().map(|(k, _)| k.clone()).collect();
        let result = frames
            .into_iter()
            .try_for_each(|(key, bytes)| self.db.insert(key, bytes).map(drop));
        result.map_err(|e| {
            for key in keys {
                let _ = self.db.remove(key);
            }
            self.storage(e)
        })
    }

    /// The range scan stops at the first record over the budget: its bytes
    /// are fetched, no later record's are, and none past the budget is
    /// decoded or hashed.
    fn read_bounded(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        let from = from.max(1);
        if from > to {
            return Ok(Vec::new());
        }
        let mut spent: Option<usize> = None;
        let stored = self
            .db
            .range(event_key(session, from)..=event_key(session, to))
            .map(|item| {
                let (key, value) = item.map_err(|e| self.storage(e))?;
                Ok((parse_event_key(&key).1, value))
            })
            .take_while(|item| {
                let Ok((_, value)) = item else {
                    return true;
                };
                let total = spent.map_or(value.len(), |s| s.saturating_add(value.len()));
                let fits = spent.is_none() || total <= max_bytes;
                if fits {
                    spent = Some(total);
                }
                fits
            });
        let long = to.saturating_sub(from) >= PARALLEL_OPEN_MIN;
        let records = scan_and_open(session, stored, long)?;
        crate::check_run(session, from, &records)?;
        Ok(records)
    }

    /// Every session's head: sled's, where the cache (appends since the
    /// last checkpoint) holds no newer one.
    fn sessions(&self) -> Result<Vec<SessionMeta>, LogError> {
        let mut heads = self.stored_sessions()?;
        let metas = self.metas.lock().expect("meta lock poisoned");
        for head in &mut heads {
            if let Some(meta) = metas.get(&head.session) {
                *head = session_meta(head.session, meta.clone());
            }
        }
        let known: HashSet<Uuid> = heads.iter().map(|h| h.session).collect();
        let new = metas.iter().filter(|(id, _)| !known.contains(id));
        heads.extend(new.map(|(id, meta)| session_meta(*id, meta.clone())));
        heads.sort_by_key(|h| h.session);
        Ok(heads)
    }

    /// Every session's head as sled holds it.
    fn stored_sessions(&self) -> Result<Vec<SessionMeta>, LogError> {
        let mut out = Vec::new();
        for item in self.db.scan_prefix([META_PREFIX]) {
            let (key, value) = item.map_err(|e| self.storage(e))?;
            let session = Uuid::from_slice(&key[1..]).map_err(|e| LogError::Corrupt {
                session: Uuid::nil(),
                seq: 0,
                reason: format!("bad session key: {e}"),
            })?;
            let meta: StoredMeta =
                rmp_serde::from_slice(&value).map_err(|e| LogError::Corrupt {
                    session,
                    seq: 0,
                    reason: format!("session metadata does not decode: {e}"),
                })?;
            out.push(session_meta(session, meta));
        }
        Ok(out)
    }
}

impl Drop for SledLog {
    /// Closing ends the sync thread, which checkpoints first (so the next
    /// open has nothing to replay), and waits for it.
    fn drop(&mut self) {
        drop(self.requests.take());
        if let Some(syncer) = self.syncer.take() {
            let _ = syncer.join();
        }
        note_held(&self.held, false);
    }
}

#[async_trait::async_trait]
impl EventLog for SledLog {
    /// Checked, sealed and stored by the writer on the caller's task.
    async fn append(
        &self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        self.with_writer(|writer| writer.append(session, expected_seq, events))
            .await
    }

    async fn import(&self, session: Uuid, sealed: Vec<Vec<u8>>) -> Result<Head, LogError> {
        self.with_writer(|writer| writer.import(session, sealed))
            .await
    }

    async fn acquire_lease(
        &self,
        session: Uuid,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<Lease, LogError> {
        self.shared.leases.acquire(session, owner, ttl)
    }

    async fn take_over_lease(
        &self,
        held: &Lease,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<Lease, LogError> {
        self.shared.leases.take_over(held, owner, ttl)
    }

    async fn renew_lease(
        &self,
        lease: &Lease,
        ttl: std::time::Duration,
    ) -> Result<Lease, LogError> {
        self.shared.leases.renew(lease, ttl)
    }

    async fn release_lease(&self, lease: &Lease) -> Result<(), LogError> {
        self.shared.leases.release(lease);
        Ok(())
    }

    async fn expired_leases(&self) -> Result<Vec<Lease>, LogError> {
        Ok(self.shared.leases.expired())
    }

    async fn lease(&self, session: Uuid) -> Result<Option<Lease>, LogError> {
        Ok(self.shared.leases.live(session))
    }

    /// Kept with the lease, in memory: one process owns the store, and its
    /// leases (and their tokens) do not outlive it.
    async fn request_pause(&self, session: Uuid) -> Result<Option<Lease>, LogError> {
        Ok(self.shared.leases.request_pause(session))
    }

    async fn take_pause_request(&self, session: Uuid, token: u64) -> Result<bool, LogError> {
        Ok(self.shared.leases.take_pause_request(session, token))
    }

    async fn read(&self, session: Uuid, from: u64, to: u64) -> Result<Vec<Record>, LogError> {
        self.read_bounded(session, from, to, usize::MAX).await
    }

    /// On the blocking pool: a range may be long (see `Shared::read_bounded`).
    async fn read_bounded(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        if from.max(1) > to {
            return Ok(Vec::new());
        }
        self.blocking(move |shared| shared.read_bounded(session, from, to, max_bytes))
            .await
    }

    /// Inline: one insert into sled's memory (derived data is not covered
    /// by barriers, so nothing waits for a disk here).
    async fn put_derived(&self, session: Uuid, name: &str, bytes: &[u8]) -> Result<(), LogError> {
        self.shared
            .db
            .insert(derived_key(session, name), bytes)
            .map(drop)
            .map_err(|e| self.shared.storage(e))
    }

    /// On the blocking pool: a file read.
    async fn get_key(&self, session: Uuid) -> Result<Option<Vec<u8>>, LogError> {
        self.blocking(move |shared| shared.keys().get(session).map_err(|e| shared.key_io(e)))
            .await
    }

    /// On the blocking pool: a file written and synced.
    async fn put_key(&self, session: Uuid, key: &[u8]) -> Result<Vec<u8>, LogError> {
        let key = key.to_vec();
        self.blocking(move |shared| {
            shared
                .keys()
                .put(session, &key)
                .map_err(|e| shared.key_io(e))
        })
        .await
    }

    /// On the blocking pool: a file overwritten, synced and removed.
    async fn destroy_key(&self, session: Uuid) -> Result<(), LogError> {
        self.blocking(move |shared| shared.keys().destroy(session).map_err(|e| shared.key_io(e)))
            .await
    }

    /// Inline: a point lookup in sled's page cache.
    async fn get_derived(&self, session: Uuid, name: &str) -> Result<Option<Vec<u8>>, LogError> {
        self.shared
            .db
            .get(derived_key(session, name))
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(|e| self.shared.storage(e))
    }

    /// Inline: from the writer's cache, else one point lookup in sled.
    async fn head(&self, session: Uuid) -> Result<Head, LogError> {
        if let Some(meta) = self
            .shared
            .metas
            .lock()
            .expect("meta lock poisoned")
            .get(&session)
        {
            return Ok(Head {
                seq: meta.head_seq,
                hash: meta.head_hash,
            });
        }
        Ok(self
            .shared
            .load_meta(session)?
            .map_or(Head::EMPTY, |m| Head {
                seq: m.head_seq,
                hash: m.head_hash,
            }))
    }

    /// On the blocking pool: a scan of every session's meta.
    async fn sessions(&self) -> Result<Vec<SessionMeta>, LogError> {
        self.blocking(|shared| shared.sessions()).await
    }

    /// Every append is in the write-ahead file (in the OS's hands) once
    /// `append` returns, so `Flushed` costs nothing.
    ///
    /// `Synced` is group commit through the sync thread's queue: when it returns
    /// Ok, every append that returned before it was called is on stable
    /// storage (made so by an `fdatasync` of the write-ahead file that
    /// started after that append's write, or by a checkpoint). Every synced
    /// barrier waiting in the queue shares one `fdatasync`, and a barrier
    /// with nothing new to cover costs none. If the `fdatasync` that would
    /// cover a caller fails, the caller gets its error.
    async fn barrier(&self, durability: Durability) -> Result<(), LogError> {
        if durability < Durability::Synced {
            return Ok(());
        }
        if self.writer.lock().await.all_durable() {
            return Ok(());
        }
        let (reply, answer) = oneshot::channel();
        self.send(Request::Sync(reply))?;
        answer.await.map_err(|_| self.shared.writer_stopped())?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::event;
    use std::sync::Arc;

    /// sled as the conformance suite sees it: one directory per store.
    struct Sled;

    #[async_trait::async_trait]
    impl crate::conformance::Backend for Sled {
        type Store = tempfile::TempDir;

        async fn create(&self) -> tempfile::TempDir {
            tempfile::tempdir().unwrap()
        }

        /// sled may hold its lock a moment after the last handle dropped.
        async fn open(&self, dir: &tempfile::TempDir) -> Result<Arc<dyn EventLog>, LogError> {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            loop {
                match SledLog::open(dir.path()) {
                    Err(LogError::Locked { .. }) if std::time::Instant::now() < deadline => {
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await
                    }
                    opened => return opened.map(|log| Arc::new(log) as Arc<dyn EventLog>),
                }
            }
        }

        async fn tamper(&self, dir: &tempfile::TempDir, session: Uuid, seq: u64) {
            let log = reopen(dir.path());
            let key = event_key(session, seq);
            let mut bytes = log.shared.db.get(key).unwrap().unwrap().to_vec();
            let n = bytes.len();
            bytes[n - 40] ^= 1;
            log.shared.db.insert(key, bytes).unwrap();
        }

        async fn remove(&self, dir: &tempfile::TempDir, session: Uuid, seq: u64) {
            let log = reopen(dir.path());
            log.shared.db.remove(event_key(session, seq)).unwrap();
        }

        fn shared(&self) -> bool {
            false
        }
    }

    crate::conformance_tests!(Sled);

    /// Opens `dir` again; sled may hold its lock a moment after the last
    /// handle dropped.
    fn reopen(dir: &Path) -> SledLog {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match SledLog::open(dir) {
                Err(LogError::Locked { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                opened => return opened.unwrap(),
            }
        }
    }

    /// Bytes of the files under `dir`, as `du -b` counts them.
    fn bytes_under(dir: &Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                match entry.metadata().unwrap() {
                    m if m.is_dir() => bytes_under(&entry.path()),
                    m => m.len(),
                }
            })
            .sum()
    }

    /// Text of `len` bytes from a small vocabulary, as compressible as
    /// prose (not a run of one letter).
    fn prose(seed: &mut u64, len: usize) -> Vec<u8> {
        const WORDS: [&str; 16] = [
            "the", "invoice", "customer", "charged", "amount", "refund", "total", "order", "of",
            "account", "pending", "was", "and", "billing", "for", "status",
        ];
        let mut text = String::new();
        while text.len() < len {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let word = WORDS[(*seed >> 60) as usize];
            text.push_str(word);
            text.push_str(if *seed & 0xff < 20 { ". " } else { " " });
            if *seed & 0xff00 < 0x0a00 {
                text.push_str(&(*seed % 100_000).to_string());
                text.push(' ');
            }
        }
        text.truncate(len);
        text.into_bytes()
    }

    /// A 1,000-turn session (user message, tool call, tool started, tool
    /// result, answer; a summary written at the end of each turn, as the
    /// runtime does) takes at most twice its sealed records on disk,
    /// write-ahead file included (1.4 to 1.5 times, as sled's cleaning
    /// falls). sled uncompressed, with 512 KiB segments and the write-ahead
    /// file emptied every 64 MiB, took 4.6 times.
    #[tokio::test]
    async fn a_long_session_takes_little_more_room_than_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let log = reopen(dir.path());
        let s = Uuid::now_v7();
        let mut seed = 1;
        let mut seq = 0;
        for turn in 0..1000 {
            for (kind, len) in [
                ("UserMessage", 200),
                ("ModelReplied", 120),
                ("ToolStarted", 60),
                ("ToolFinished", 400),
                ("ModelReplied", 300),
            ] {
                seq += 1;
                let event = NewEvent {
                    kind: kind.into(),
                    schema: 1,
                    caused_by: None,
                    payload: prose(&mut seed, len),
                };
                log.append(s, seq, vec![event]).await.unwrap();
                log.barrier(Durability::Flushed).await.unwrap();
            }
            let summary = format!("{{\"seq\":{seq},\"turn\":{turn},\"status\":\"done\"}}");
            log.put_derived(s, "summary", &prose(&mut seed, 250))
                .await
                .unwrap();
            log.put_derived(s, "status", summary.as_bytes())
                .await
                .unwrap();
        }
        let sealed: u64 = log
            .shared
            .db
            .scan_prefix([EVENT_PREFIX])
            .map(|item| item.unwrap().1.len() as u64)
            .sum();
        let on_disk = bytes_under(dir.path());
        let ratio = on_disk as f64 / sealed as f64;
        eprintln!("{seq} records, {sealed} sealed bytes, {on_disk} on disk: {ratio:.2}x");
        assert!(
            ratio <= 2.0,
            "{on_disk} bytes on disk for {sealed} sealed: {ratio:.2}x"
        );
        drop(log);
        let log = reopen(dir.path());
        assert_eq!(log.verify(s).await.unwrap(), seq);
    }

    #[tokio::test]
    async fn a_data_directory_keeps_the_sled_settings_it_was_created_with() {
        let dir = tempfile::tempdir().unwrap();
        let s = Uuid::now_v7();
        {
            // What mneme created before compression.
            let db = sled::Config::new()
                .path(dir.path())
                .flush_every_ms(None)
                .open()
                .unwrap();
            db.flush().unwrap();
        }
        assert_eq!(created_with(dir.path()), Some((false, 512 << 10)));
        let log = reopen(dir.path());
        log.append(s, 1, vec![event(1)]).await.unwrap();
        drop(log);
        let log = reopen(dir.path());
        assert_eq!(log.verify(s).await.unwrap(), 1);
        let fresh = tempfile::tempdir().unwrap();
        drop(reopen(fresh.path()));
        assert_eq!(created_with(fresh.path()), Some((true, SEGMENT_BYTES)));
    }

    #[tokio::test]
    async fn second_opener_is_told_who_holds_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let _log = SledLog::open_as(dir.path(), "mneme run").unwrap();
        let note = format!("pid {}: mneme run", std::process::id());
        assert_eq!(
            std::fs::read_to_string(dir.path().join(HOLDER_FILE)).unwrap(),
            note,
            "the pid and what the holder is, nothing else"
        );
        // sled's lock is per process (flock on a separate open file description);
        // within one process the second open must also fail, naming the holder.
        let err = SledLog::open(dir.path())
            .err()
            .expect("second open must fail");
        let text = err.to_string();
        assert!(matches!(err, LogError::Locked { .. }), "{text}");
        assert!(text.contains(&note), "{text}");
    }

    #[tokio::test]
    async fn a_directory_this_process_closed_opens_once_sled_lets_go_of_it() {
        let dir = tempfile::tempdir().unwrap();
        // sled still locked by this process, with no handle of the log open.
        let lingering = sled_config(dir.path()).open().unwrap();
        write_holder(dir.path(), "a handle just dropped");
        let released = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(lingering);
        });
        let log = SledLog::open(dir.path()).expect("waited for sled to let go");
        released.join().unwrap();
        // While a handle is open, a second open is refused at once.
        let started = std::time::Instant::now();
        assert!(matches!(
            SledLog::open(dir.path()),
            Err(LogError::Locked { .. })
        ));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        drop(log);
    }

    #[tokio::test]
    async fn the_directory_and_the_files_of_the_log_are_its_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o7777;
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("data");
        let s = Uuid::now_v7();
        {
            let log = reopen(&dir);
            log.append(s, 1, vec![event(1)]).await.unwrap();
        } // checkpointed: the anchor is written
        assert_eq!(mode(&dir), 0o700);
        for file in [WAL_FILE, HOLDER_FILE, ANCHOR_FILE] {
            assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let log = reopen(&dir);
        assert_eq!(mode(&dir), 0o700, "a loose directory is tightened");
        assert_eq!(log.verify(s).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn records_sled_lost_are_replayed_from_the_write_ahead_file() {
        let s = Uuid::now_v7();
        let source = tempfile::tempdir().unwrap();
        let wal = {
            let log = reopen(source.path());
            log.append(s, 1, vec![event(1), event(2)]).await.unwrap();
            log.append(s, 3, vec![event(3)]).await.unwrap();
            log.barrier(Durability::Synced).await.unwrap();
            std::fs::read(source.path().join(WAL_FILE)).unwrap()
        };
        // A sled directory that never got the records, with the write-ahead
        // file that did: what a crash before sled's own flush leaves behind.
        let target = tempfile::tempdir().unwrap();
        drop(reopen(target.path()));
        std::fs::write(target.path().join(WAL_FILE), wal).unwrap();
        let log = reopen(target.path());
        assert_eq!(log.recovered(), 3);
        assert_eq!(log.verify(s).await.unwrap(), 3);
        assert_eq!(
            std::fs::metadata(target.path().join(WAL_FILE))
                .unwrap()
                .len(),
            crate::wal::FILE_HEADER as u64,
            "checkpointed: the header alone"
        );
        drop(log);
        let log = reopen(target.path());
        assert_eq!(log.recovered(), 0, "nothing left to replay");
        assert_eq!(log.read(s, 3, 3).await.unwrap()[0].envelope.kind, "K3");
    }

    #[tokio::test]
    async fn a_data_directory_with_a_version_1_write_ahead_file_opens_and_moves_to_version_2() {
        let s = Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001);
        let dir = tempfile::tempdir().unwrap();
        drop(reopen(dir.path()));
        let path = dir.path().join(WAL_FILE);
        std::fs::write(&path, crate::wal::v1_file()).unwrap();
        let log = reopen(dir.path());
        assert_eq!(log.recovered(), 3);
        assert_eq!(log.verify(s).await.unwrap(), 3);
        let emptied = std::fs::read(&path).unwrap();
        assert_eq!(
            emptied.len(),
            crate::wal::FILE_HEADER,
            "checkpointed: a version 2 header alone"
        );
        assert_eq!(emptied[..8], *b"MWAL\x02\0\0\0");
        log.append(s, 4, vec![event(4)]).await.unwrap();
        log.barrier(Durability::Synced).await.unwrap();
        let wal = std::fs::read(&path).unwrap();
        drop(log);
        // The new record replays from the version 2 file into a sled that
        // lost it.
        let target = tempfile::tempdir().unwrap();
        drop(reopen(target.path()));
        std::fs::write(target.path().join(WAL_FILE), crate::wal::v1_file()).unwrap();
        drop(reopen(target.path()));
        std::fs::write(target.path().join(WAL_FILE), wal).unwrap();
        let log = reopen(target.path());
        assert_eq!(log.recovered(), 1);
        assert_eq!(log.read(s, 4, 4).await.unwrap()[0].envelope.kind, "K4");
        assert_eq!(log.verify(s).await.unwrap(), 4);
    }

    #[tokio::test]
    async fn records_sled_loses_after_a_checkpoint_are_caught_by_the_anchor() {
        let dir = tempfile::tempdir().unwrap();
        let s = Uuid::now_v7();
        {
            let log = reopen(dir.path());
            log.append(s, 1, vec![event(1), event(2), event(3)])
                .await
                .unwrap();
        } // checkpointed on close: the anchor says 1 session, 3 records
        {
            // sled recovers a shorter prefix: the last record and its head are
            // gone, and what is left is a valid, shorter chain.
            let log = reopen(dir.path());
            let mut meta = log.shared.load_meta(s).unwrap().unwrap();
            let second = log.read(s, 2, 2).await.unwrap().remove(0);
            meta.head_seq = 2;
            meta.head_hash = second.hash;
            log.shared.db.remove(event_key(s, 3)).unwrap();
            log.shared
                .db
                .insert(meta_key(s), encode_meta(&meta))
                .unwrap();
            log.shared.db.flush().unwrap();
            // Nothing went through the write-ahead file, so closing does not
            // checkpoint: the anchor keeps saying 3.
        }
        let err = SledLog::open(dir.path())
            .err()
            .expect("a shortened log must be refused");
        let text = err.to_string();
        assert!(matches!(err, LogError::LostRecords { .. }), "{text}");
        assert!(
            text.contains("3 records") && text.contains("now holds 1 and 2"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_head_reaches_sled_at_the_checkpoint_and_is_served_from_the_cache_before() {
        let dir = tempfile::tempdir().unwrap();
        let s = Uuid::now_v7();
        {
            let log = reopen(dir.path());
            log.append(s, 1, vec![event(1), event(2)]).await.unwrap();
            assert_eq!(
                log.shared.db.get(meta_key(s)).unwrap(),
                None,
                "one insert an append"
            );
            let listed = log.sessions().await.unwrap();
            assert_eq!((listed[0].session, listed[0].events), (s, 2));
            assert_eq!(log.head(s).await.unwrap().seq, 2);
        }
        // Closing checkpoints: the head is in sled, and the log opens with
        // nothing to replay.
        let log = reopen(dir.path());
        assert_eq!(log.recovered(), 0);
        assert!(log.shared.db.get(meta_key(s)).unwrap().is_some());
        assert_eq!(log.sessions().await.unwrap()[0].events, 2);
    }

    /// A session's head goes into sled only at checkpoints; a crash after
    /// sled wrote a later record leaves the head behind it, and opening
    /// moves it up from the write-ahead file.
    #[tokio::test]
    async fn a_head_that_lags_its_records_is_repaired_on_open() {
        let (dir, crashed) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let s = Uuid::now_v7();
        {
            let log = reopen(dir.path());
            log.append(s, 1, vec![event(1)]).await.unwrap();
            log.writer.lock().await.checkpoint().unwrap();
            log.append(s, 2, vec![event(2)]).await.unwrap();
            // Record 2 reaches sled's file; its head would at the next
            // checkpoint. The crash comes first.
            log.shared.db.flush().unwrap();
            copy_dir(dir.path(), crashed.path());
        }
        let log = reopen(crashed.path());
        assert_eq!(log.recovered(), 0, "sled held the record already");
        assert_eq!(log.head(s).await.unwrap().seq, 2);
        assert_eq!(log.verify(s).await.unwrap(), 2);
        log.append(s, 3, vec![event(3)]).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_synced_barriers_share_fdatasyncs() {
        const TASKS: usize = 8;
        const APPENDS: u64 = 40;
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(reopen(dir.path()));
        log.barrier(Durability::Synced).await.unwrap();
        assert_eq!(
            log.syncs(),
            0,
            "nothing appended since the open's checkpoint"
        );
        let start = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (log, start) = (log.clone(), start.clone());
                tokio::spawn(async move {
                    let s = Uuid::now_v7();
                    start.wait().await;
                    for seq in 1..=APPENDS {
                        log.append(s, seq, vec![event(seq as u8)]).await.unwrap();
                        log.barrier(Durability::Synced).await.unwrap();
                    }
                    s
                })
            })
            .collect();
        for task in tasks {
            let s = task.await.unwrap();
            assert_eq!(log.verify(s).await.unwrap(), APPENDS);
        }
        let syncs = log.syncs();
        let barriers = TASKS as u64 * APPENDS;
        assert!(
            (1..barriers).contains(&syncs),
            "{syncs} fdatasyncs for {barriers} barriers"
        );
        log.barrier(Durability::Synced).await.unwrap();
        assert_eq!(log.syncs(), syncs, "everything is covered already");
        log.append(Uuid::now_v7(), 1, vec![event(1)]).await.unwrap();
        log.barrier(Durability::Synced).await.unwrap();
        assert_eq!(log.syncs(), syncs + 1);
    }

    #[tokio::test]
    async fn an_append_dropped_before_it_returns_happened_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let log = reopen(dir.path());
        let s = Uuid::now_v7();
        log.append(s, 1, vec![event(1)]).await.unwrap();
        // While another holds the writer, an append waits for it; dropped
        // then, it never happened.
        let held = log.writer.lock().await;
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            log.append(s, 2, vec![event(2), event(3)]),
        )
        .await;
        assert!(waited.is_err(), "the append waited for the writer");
        drop(held);
        assert_eq!(log.head(s).await.unwrap().seq, 1, "nothing of it stored");
        // Once it has the writer it runs to its end without waiting again.
        log.append(s, 2, vec![event(2), event(3)]).await.unwrap();
        assert_eq!(log.verify(s).await.unwrap(), 3);
        drop(log);
        assert_eq!(reopen(dir.path()).verify(s).await.unwrap(), 3);
    }

    #[tokio::test]
    async fn a_failed_sync_fails_its_waiters_and_a_checkpoint_covers_its_range() {
        let is_eio = |r: Result<(), LogError>| matches!(r, Err(LogError::Io { source, .. }) if source.raw_os_error() == Some(libc::EIO));
        let dir = tempfile::tempdir().unwrap();
        let log = reopen(dir.path());
        let s = Uuid::now_v7();
        log.append(s, 1, vec![event(1)]).await.unwrap();
        log.shared.fail_syncs.store(1, Ordering::Relaxed);
        // The barrier the failed sync answers hears of it; one enqueued at
        // the same moment is either in its batch (and hears of it too) or
        // in the next, which a checkpoint covers.
        let (a, b) = tokio::join!(
            log.barrier(Durability::Synced),
            log.barrier(Durability::Synced)
        );
        assert!(is_eio(a), "the first barrier's sync failed");
        assert!(b.is_ok() || is_eio(b));
        assert_eq!(log.syncs(), 1);
        // The pages may be gone: the next barrier checkpoints, not syncs.
        log.barrier(Durability::Synced).await.unwrap();
        assert_eq!(log.syncs(), 1, "covered by a checkpoint");
        assert_eq!(
            std::fs::metadata(dir.path().join(WAL_FILE)).unwrap().len(),
            crate::wal::FILE_HEADER as u64,
            "checkpointed: the header alone"
        );
        log.barrier(Durability::Synced).await.unwrap();
        assert_eq!(log.syncs(), 1, "already durable");
        log.append(s, 2, vec![event(2)]).await.unwrap();
        log.barrier(Durability::Synced).await.unwrap();
        assert_eq!(log.syncs(), 2, "syncing again once covered");
        assert_eq!(log.verify(s).await.unwrap(), 2);
    }

    /// Copies the files under `from` into `to` (a closed data directory).
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.metadata().unwrap().is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }

    /// A power cut kept sled's unsynced write of record 5 (never
    /// acknowledged) and took its write-ahead frame; the session had no
    /// other frame, so its head stays 4 and record 5 sits in sled past it.
    /// The session goes on: another record 5 is appended and acknowledged
    /// by a synced barrier, then a crash before the next checkpoint. On
    /// open the acknowledged frame replaces what sled held at its key.
    #[tokio::test]
    async fn a_frame_replaces_the_unacknowledged_record_sled_kept_at_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let s = Uuid::now_v7();
        {
            let log = reopen(dir.path());
            log.append(s, 1, vec![event(1), event(2), event(3), event(4)])
                .await
                .unwrap();
        } // checkpointed: head 4 in sled, anchor 4 records
        {
            // sled persisted an unacknowledged record 5 (the frame was lost).
            let db = sled_config(dir.path()).open().unwrap();
            let bytes = db.get(event_key(s, 4)).unwrap().unwrap();
            let four = Record::open(s, 4, &bytes).unwrap();
            let (_, orphan) = Record::seal(Envelope {
                session: s,
                seq: 5,
                event_id: Uuid::now_v7(),
                ts_ms: now_ms(),
                caused_by: None,
                schema: 1,
                kind: "ORPHAN".into(),
                prev_hash: four.hash,
                payload: b"never acknowledged".to_vec(),
            })
            .unwrap();
            db.insert(event_key(s, 5), orphan).unwrap();
            db.flush().unwrap();
        }
        let before = tempfile::tempdir().unwrap();
        copy_dir(dir.path(), before.path());
        let wal = {
            let log = reopen(dir.path());
            assert_eq!(log.head(s).await.unwrap().seq, 4);
            log.append(s, 5, vec![event(5)]).await.unwrap();
            log.barrier(Durability::Synced).await.unwrap(); // acknowledged
            std::fs::read(dir.path().join(WAL_FILE)).unwrap()
        };
        // The crash: sled's disk as before (the insert stayed in sled's
        // memory), the write-ahead file holding the synced frame.
        std::fs::write(before.path().join(WAL_FILE), wal).unwrap();
        let log = reopen(before.path());
        let five = log.read(s, 5, 5).await.unwrap().remove(0);
        assert_eq!(
            five.envelope.kind, "K5",
            "the acknowledged record 5 is lost"
        );
    }

    /// After an fsync of sled's data file failed (EIO: the kernel may have
    /// dropped the pages, and sled will not write them again), no later
    /// checkpoint may trust its own fsync: the write-ahead file is never
    /// emptied again, a barrier that needs a checkpoint fails, and appends
    /// are refused, by name, until the log is opened again, which replays
    /// the write-ahead file and has every record.
    #[tokio::test]
    async fn after_a_failed_fsync_of_sled_no_checkpoint_empties_the_write_ahead_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = reopen(dir.path());
        let s = Uuid::now_v7();
        log.append(s, 1, vec![event(1)]).await.unwrap();
        log.shared.fail_syncs.store(1, Ordering::Relaxed);
        assert!(
            log.barrier(Durability::Synced).await.is_err(),
            "wal sync failed"
        );
        log.shared.fail_data_syncs.store(1, Ordering::Relaxed);
        assert!(
            log.barrier(Durability::Synced).await.is_err(),
            "sled fsync failed"
        );
        let third = log.barrier(Durability::Synced).await;
        let wal = std::fs::metadata(dir.path().join(WAL_FILE)).unwrap().len();
        assert!(
            third.is_err(),
            "barrier Ok; write-ahead file emptied to {wal} bytes; record 1's bytes were \
             last fsynced by nothing that succeeded"
        );
        assert!(
            wal > crate::wal::FILE_HEADER as u64,
            "the write-ahead file keeps the record"
        );
        let refused = log.append(s, 2, vec![event(2)]).await.unwrap_err();
        assert!(
            std::error::Error::source(&refused)
                .is_some_and(|e| e.to_string().contains("open the log again")),
            "{refused}: {:?}",
            std::error::Error::source(&refused)
        );
        drop(log);
        assert_eq!(reopen(dir.path()).verify(s).await.unwrap(), 1);
    }

    /// The same when only sled's fsync failed: the next checkpoint, whose
    /// own fsync succeeds, must not empty the write-ahead file either.
    #[tokio::test]
    async fn after_a_failed_fsync_of_sled_alone_the_next_checkpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let log = reopen(dir.path());
        let s = Uuid::now_v7();
        log.append(s, 1, vec![event(1)]).await.unwrap();
        log.shared.fail_data_syncs.store(1, Ordering::Relaxed);
        let failed = log.writer.lock().await.checkpoint();
        assert!(failed.is_err(), "the data file's fsync failed");
        assert!(
            log.writer.lock().await.checkpoint().is_err(),
            "a later one is refused"
        );
        let wal = std::fs::metadata(dir.path().join(WAL_FILE)).unwrap().len();
        assert!(
            wal > crate::wal::FILE_HEADER as u64,
            "the write-ahead file keeps the record"
        );
        log.barrier(Durability::Synced).await.unwrap();
        drop(log);
        assert_eq!(reopen(dir.path()).verify(s).await.unwrap(), 1);
    }

    /// The anchor is compared before the write-ahead file is replayed:
    /// records appended since the checkpoint (another session's) must not
    /// make up for checkpointed ones sled lost.
    #[tokio::test]
    async fn records_replayed_since_a_checkpoint_do_not_hide_what_sled_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        {
            let log = reopen(dir.path());
            log.append(a, 1, vec![event(1), event(2), event(3)])
                .await
                .unwrap();
        } // checkpointed: anchor 1 session, 3 records
        let crashed = tempfile::tempdir().unwrap();
        copy_dir(dir.path(), crashed.path());
        let wal = {
            let log = reopen(dir.path());
            log.append(b, 1, vec![event(1)]).await.unwrap();
            log.barrier(Durability::Synced).await.unwrap();
            std::fs::read(dir.path().join(WAL_FILE)).unwrap()
        };
        {
            // sled lost the end of what the checkpoint synced: A's record 3
            // and the head that named it (as in the anchor test above).
            let db = sled_config(crashed.path()).open().unwrap();
            let two = Record::open(a, 2, &db.get(event_key(a, 2)).unwrap().unwrap()).unwrap();
            let mut meta: StoredMeta =
                rmp_serde::from_slice(&db.get(meta_key(a)).unwrap().unwrap()).unwrap();
            meta.head_seq = 2;
            meta.head_hash = two.hash;
            db.remove(event_key(a, 3)).unwrap();
            db.insert(meta_key(a), encode_meta(&meta)).unwrap();
            db.flush().unwrap();
        }
        std::fs::write(crashed.path().join(WAL_FILE), wal).unwrap();
        let opened = SledLog::open(crashed.path());
        let verified = match &opened {
            Ok(log) => Some(log.verify(a).await.unwrap()),
            Err(_) => None,
        };
        assert!(
            matches!(opened, Err(LogError::LostRecords { .. })),
            "opened; session A verifies to {verified:?} records of the 3 acknowledged"
        );
    }
}
