//! The sled backend of [`EventLog`].
//!
//! Records are kept in segment files, a run of a session's records at a
//! time, compressed ([`segments`]); one sled tree indexes them and holds the
//! rest:
//! - `r ‖ session (16 bytes) ‖ first seq (u64 big-endian)` → where a run is;
//! - `e ‖ session ‖ seq` → a record of its own (written by builds before
//!   segment files, read in place; see [`stored`]);
//! - `s ‖ session` → the session's [`StoredMeta`] (head and timestamps).
//!
//! Durability and atomicity come from mneme's write-ahead file
//! ([`crate::wal`]): each append is written there first (all its records
//! in one `write(2)`), synced barriers share `fdatasync`s of it (group
//! commit), and opening the log takes back from it whatever was not
//! checkpointed and brings each session's meta up to its last record (the
//! records are the truth). A checkpoint writes the records appended since
//! the last one into a segment and syncs it, then indexes them in sled and
//! makes sled durable (flush + `fdatasync`), and only then empties the
//! write-ahead file.
//!
//! One writer per store, behind an async lock: an append (or import) takes
//! it on the caller's task, checks and seals its records, writes them to the
//! write-ahead file (one `write(2)` into the page cache) and keeps them in
//! memory until the next checkpoint (pending), tens of microseconds, with
//! no thread to wake and none to wake it back. A dedicated sync thread does
//! what may wait on the device: checkpoints, and the `fdatasync`s of synced
//! barriers. Group commit is its channel: it takes every synced barrier
//! waiting in it, notes how far the file is written, and one `fdatasync`
//! answers them all (each was enqueued after the appends it covers).
//! Appends go on while it syncs; barriers that come meanwhile form the
//! next batch. A lone barrier, one session at work with no other barrier
//! in flight, runs its `fdatasync` on the caller's worker instead, and
//! saves the two thread wake-ups of the handoff ([`lone`]).
//!
//! Reads: point lookups (a head not cached, derived data) stay inline, as
//! sled serves them from its page cache in microseconds; range scans and the
//! listing of sessions (which may read and check many records) run on
//! tokio's blocking pool.

use crate::wal::{Frame, Wal};
use crate::{
    now_ms, Durability, EventLog, Hash, Head, Lease, LocalLeases, LogError, NewEvent, Record,
    SessionMeta,
};
use crate::{Leases, SideStore, Totals};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use tokio::sync::oneshot;
use uuid::Uuid;

mod encoding;
mod lone;
mod open;
mod recovery;
mod segments;
mod shared;
mod stored;
#[cfg(test)]
mod tests;
mod writer;

use encoding::*;
pub use open::sled_config;
use open::*;
use recovery::*;
use segments::*;
use shared::*;
use writer::*;

const EVENT_PREFIX: u8 = b'e';
const META_PREFIX: u8 = b's';
const DERIVED_PREFIX: u8 = b'd';
const HOLDER_FILE: &str = "mneme.holder";
/// Sessions and records at the last checkpoint: what sled must still hold.
const ANCHOR_FILE: &str = "mneme.anchor";
const WAL_FILE: &str = "mneme.wal";
/// The write-ahead file is emptied into a segment once it grows past this.
/// It holds every record since the last checkpoint uncompressed (and the
/// process holds them in memory), so this bounds what it adds to the
/// directory; a checkpoint costs a few `fdatasync`s, about a thousand 1 KiB
/// events apart.
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
    /// Synced barriers in flight ([`lone`]).
    barriers: lone::Barriers,
    /// The write-ahead file's descriptor, for a lone barrier's `fdatasync`.
    wal_sync: File,
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
        let segments = Segments::new(&dir);
        let mut shared = Shared {
            dir,
            db,
            data_file,
            recovered: 0,
            torn_tail: wal.torn_tail().cloned(),
            metas: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            segments,
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
            wal_sync: wal_sync.try_clone().map_err(io(&wal_path))?,
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
            barriers: lone::Barriers::default(),
            wal_sync,
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

    /// A synced barrier answered by the sync thread, with every other
    /// waiting in its queue.
    async fn sync_by_thread(&self) -> Result<(), LogError> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Sync(reply))?;
        answer.await.map_err(|_| self.shared.writer_stopped())?
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
    async fn import_own(
        &self,
        session: Uuid,
        start: Head,
        sealed: Vec<Vec<u8>>,
    ) -> Result<Head, LogError> {
        self.with_writer(|writer| writer.import(session, start, sealed))
            .await
    }
    async fn fork_after(
        &self,
        session: Uuid,
        base: crate::Base,
        base_head: Head,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        self.with_writer(|writer| writer.fork_after(session, base, base_head, events))
            .await
    }
    /// Inline: from the writer's cache, else one point lookup in sled.
    async fn base(&self, session: Uuid) -> Result<Option<crate::Base>, LogError> {
        let cached = self.shared.metas.lock().expect("meta lock poisoned");
        if let Some(meta) = cached.get(&session) {
            return Ok(meta.base);
        }
        drop(cached);
        Ok(self.shared.load_meta(session)?.and_then(|m| m.base))
    }
    /// On the blocking pool: a range may be long.
    async fn read_sealed_own(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
    ) -> Result<(Vec<Record>, Vec<Vec<u8>>), LogError> {
        self.blocking(move |shared| shared.read_sealed(session, from, to))
            .await
    }
    /// On the blocking pool: a range may be long (see `Shared::read_bounded`).
    async fn read_bounded_own(
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
    /// with nothing new to cover costs none; a lone barrier (one session at
    /// work, [`lone`]) runs its `fdatasync` itself. If the `fdatasync` that
    /// would cover a caller fails, the caller gets its error.
    async fn barrier(&self, durability: Durability) -> Result<(), LogError> {
        if durability < Durability::Synced {
            return Ok(());
        }
        let barrier = self.barriers.enter();
        let target = self.writer.lock().await.sync_target();
        let upto = match target {
            SyncTarget::Durable => return Ok(()),
            SyncTarget::Upto(upto) if barrier.lone => upto,
            _ => return self.sync_by_thread().await,
        };
        let result = self.shared.sync_wal(&self.wal_sync);
        self.writer.lock().await.synced(upto, &result);
        result
    }

    fn leases(&self) -> &dyn Leases {
        self
    }

    fn side_store(&self) -> &dyn SideStore {
        self
    }
}

#[async_trait::async_trait]
impl Leases for SledLog {
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
}

#[async_trait::async_trait]
impl SideStore for SledLog {
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
}
