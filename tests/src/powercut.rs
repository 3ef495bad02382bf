//! A power-cut model for the end-to-end tests: an `LD_PRELOAD` shim
//! (`tests/powercut/shim.c`) journals, for every file under a data
//! directory, what each write, truncation, creation, rename and unlink
//! replaced and which fsyncs covered it; once the process is dead, [`cut`]
//! undoes every change no sync covered, as a power cut would lose it
//! (LazyFS's semantics: data is durable once the file was fsynced, a
//! creation, rename or unlink once its directory was).
//!
//! The shim is active in a process only when `MNEME_POWERCUT` is set; it then
//! tracks the files under its `--data-dir` (or `MNEME_POWERCUT_ROOT`) and
//! journals to [`journal_for`] that directory (or `MNEME_POWERCUT_JOURNAL`).
//! [`Shim::enable_for_children`] sets both that and `LD_PRELOAD` in this
//! process's environment, so that every `mneme` the tests start on any data
//! directory (the operator's commands, `log`, `verify`, which also write:
//! opening checkpoints) is journalled: a change made without the shim could
//! otherwise be clobbered by the undo of an earlier one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const WRITE: u8 = 1;
const TRUNC: u8 = 2;
const SYNC: u8 = 3;
const DIRSYNC: u8 = 4;
const CREATE: u8 = 5;
const RENAME: u8 = 6;
const UNLINK: u8 = 7;
const SYNCALL: u8 = 8;
const CANCEL: u8 = 9;

/// What a device writes whole or not at all.
const SECTOR: u64 = 512;

/// The compiled shim.
pub struct Shim;

impl Shim {
    /// Compiles `tests/powercut/shim.c` into `target/powercut/shim.so` (again
    /// only when the source is newer) and returns the library's path.
    pub fn build() -> PathBuf {
        static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
        let mut built = BUILT.lock().unwrap();
        if let Some(path) = &*built {
            return path.clone();
        }
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let source = manifest.join("powercut/shim.c");
        let dir = manifest.join("../target/powercut");
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("shim.so");
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        if modified(&lib).is_none() || modified(&lib) < modified(&source) {
            // Built under a unique name, then renamed: test binaries may race.
            let tmp = dir.join(format!("shim.{}.so", std::process::id()));
            let out = std::process::Command::new(std::env::var("CC").unwrap_or("cc".into()))
                .args(["-shared", "-fPIC", "-O1", "-o"])
                .arg(&tmp)
                .arg(&source)
                .args(["-ldl", "-lpthread"])
                .output()
                .expect("running cc to build the power-cut shim");
            assert!(
                out.status.success(),
                "cc failed on {}: {}",
                source.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::rename(&tmp, &lib).unwrap();
        }
        let lib = lib.canonicalize().unwrap();
        *built = Some(lib.clone());
        lib
    }

    /// Builds the shim and makes every process this one starts from now on
    /// load it, journalling the data directory it is given. Call before
    /// starting any process.
    pub fn enable_for_children() -> PathBuf {
        static ONCE: std::sync::Once = std::sync::Once::new();
        let lib = Shim::build();
        ONCE.call_once(|| {
            std::env::set_var("LD_PRELOAD", &lib);
            std::env::set_var("MNEME_POWERCUT", "1");
        });
        lib
    }
}

/// Where the shim journals the data directory `data`: beside it.
pub fn journal_for(data: &Path) -> PathBuf {
    let data = canonical(data);
    let mut name = data.file_name().unwrap().to_os_string();
    name.push(".powercut");
    data.with_file_name(name)
}

/// `path` with its parent resolved (the path itself need not exist), as the
/// shim names files.
fn canonical(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .unwrap_or_else(|_| parent.to_path_buf())
            .join(name),
        _ => path.to_path_buf(),
    }
}

/// What a cut dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Writes (and truncations) undone.
    pub writes: usize,
    /// Bytes those writes had written.
    pub bytes: u64,
    /// Files whose creation was not durable, removed.
    pub created: usize,
    /// Renames undone.
    pub renames: usize,
    /// Unlinks undone (the file put back).
    pub unlinks: usize,
    /// Records in the journal.
    pub records: usize,
    /// Unsynced writes that survived ([`cut_with`] a seed).
    pub survived: usize,
    /// Writes of which only a prefix survived ([`cut_with`] a seed).
    pub torn: usize,
    /// Sectors of the write-ahead file that unsynced overwrites wrote and
    /// that survived out of order ([`cut_with`] a seed).
    pub sectors_kept: usize,
    /// Files the cut changed, by name (relative to the data directory).
    pub files: Vec<String>,
}

impl CutReport {
    /// Whether the cut dropped anything.
    pub fn dropped_anything(&self) -> bool {
        self.writes + self.created + self.renames + self.unlinks > 0
    }

    /// Adds `other` into this one.
    pub fn add(&mut self, other: &CutReport) {
        self.writes += other.writes;
        self.bytes += other.bytes;
        self.created += other.created;
        self.renames += other.renames;
        self.unlinks += other.unlinks;
        self.records += other.records;
        self.survived += other.survived;
        self.torn += other.torn;
        self.sectors_kept += other.sectors_kept;
    }
}

struct Record {
    kind: u8,
    off: u64,
    size: u64,
    len: u64,
    path: PathBuf,
    path2: PathBuf,
    data: Vec<u8>,
}

/// The records of a journal. A record cut short at the end (its process
/// died writing it: its change was not made) is left out, and so is a
/// record its CANCEL says was not made.
fn parse(bytes: &[u8]) -> Vec<Record> {
    let mut records = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let Some(record) = Record::read(&mut rest) else {
            break;
        };
        if record.kind == CANCEL {
            records.pop();
        } else {
            records.push(record);
        }
    }
    records
}

impl Record {
    /// The record at the start of `bytes` (advanced past it), or `None` if
    /// it is cut short.
    fn read(bytes: &mut &[u8]) -> Option<Record> {
        fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            let (head, tail) = (bytes.len() >= n).then(|| bytes.split_at(n))?;
            *bytes = tail;
            Some(head)
        }
        fn u64_of(bytes: &mut &[u8]) -> Option<u64> {
            Some(u64::from_le_bytes(take(bytes, 8)?.try_into().ok()?))
        }
        fn path_of(bytes: &mut &[u8]) -> Option<PathBuf> {
            let n = u32::from_le_bytes(take(bytes, 4)?.try_into().ok()?) as usize;
            use std::os::unix::ffi::OsStrExt;
            Some(std::ffi::OsStr::from_bytes(take(bytes, n)?).into())
        }
        let kind = take(bytes, 1)?[0];
        let (off, size, len) = (u64_of(bytes)?, u64_of(bytes)?, u64_of(bytes)?);
        let (path, path2) = (path_of(bytes)?, path_of(bytes)?);
        let n = usize::try_from(u64_of(bytes)?).ok()?;
        let data = take(bytes, n)?.to_vec();
        Some(Record {
            kind,
            off,
            size,
            len,
            path,
            path2,
            data,
        })
    }

    /// Whether the change this record is about was made, as far as the
    /// files show it. Asked only of the journal's last record: its process
    /// may have died between journalling it and making it.
    fn was_made(&self) -> bool {
        match self.kind {
            CREATE => self.path.exists(),
            RENAME => self.path == self.path2 || !self.path.exists(),
            UNLINK => !self.path.exists(),
            // Undoing a write or a truncation that was not made puts back
            // the bytes that are there.
            _ => true,
        }
    }
}

/// Cuts the power under the data directory `data`: undoes every change its
/// journal holds that no sync made durable, newest first, then removes the
/// journal (what is left is the disk). Call only when no process uses the
/// directory.
pub fn cut(data: &Path) -> CutReport {
    cut_with(data, None)
}

/// [`cut`], but for each file a random number of its oldest unsynced
/// writes survive (the device wrote them back before the cut: files are
/// persisted independently of each other, each in the order it was
/// written), and the first lost one may be torn (its bytes up to a random
/// sector boundary inside it survive), drawn from `seed`. Besides, each
/// sector of the write-ahead file that unsynced writes overwrote within
/// its size may survive on its own (no file size to commit orders them: a
/// device writes such sectors in any order).
pub fn cut_with(data: &Path, seed: Option<u64>) -> CutReport {
    let journal = journal_for(data);
    let bytes = match std::fs::read(&journal) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return CutReport::default(),
        Err(e) => panic!("reading {}: {e}", journal.display()),
    };
    let mut records = parse(&bytes);
    if records.last().is_some_and(|r| !r.was_made()) {
        records.pop();
    }
    let report = undo(&records, &canonical(data), seed);
    std::fs::remove_file(&journal).unwrap();
    report
}

/// Forgets the journal of `data` without undoing anything (as if every
/// change so far had been synced).
pub fn settle(data: &Path) {
    let _ = std::fs::remove_file(journal_for(data));
}

/// The files of a journal: each incarnation of a file (from its creation,
/// or its first mention, to its unlink or replacement) is one id, kept
/// through renames.
#[derive(Default)]
struct Files {
    /// The file at each path now.
    ids: HashMap<PathBuf, usize>,
    last: usize,
}

impl Files {
    /// A new file at `path`.
    fn fresh(&mut self, path: &Path) -> usize {
        self.last += 1;
        self.ids.insert(path.to_path_buf(), self.last);
        self.last
    }

    /// The file at `path` (one that was there before the journal began, if
    /// the journal has not seen it).
    fn id(&mut self, path: &Path) -> usize {
        match self.ids.get(path) {
            Some(&id) => id,
            None => self.fresh(path),
        }
    }
}

/// xorshift64*.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn undo(records: &[Record], root: &Path, seed: Option<u64>) -> CutReport {
    // Forward: which file (an incarnation, followed through renames) each
    // record is about, and which syncs come last.
    let mut files = Files::default();
    // Per record: the file it is about, and for a rename the file it replaced.
    let mut about: Vec<(usize, Option<usize>)> = Vec::with_capacity(records.len());
    let mut last_sync: HashMap<usize, usize> = HashMap::new();
    let mut last_dirsync: HashMap<PathBuf, usize> = HashMap::new();
    let mut last_syncall = None::<usize>;
    for (i, r) in records.iter().enumerate() {
        match r.kind {
            WRITE | TRUNC => about.push((files.id(&r.path), None)),
            SYNC => {
                let id = files.id(&r.path);
                last_sync.insert(id, i);
                about.push((id, None));
            }
            DIRSYNC => {
                last_dirsync.insert(r.path.clone(), i);
                about.push((0, None));
            }
            CREATE => about.push((files.fresh(&r.path), None)),
            RENAME => {
                let id = files.id(&r.path);
                files.ids.remove(&r.path);
                let replaced = files.ids.insert(r.path2.clone(), id);
                about.push((id, replaced));
            }
            UNLINK => {
                let id = files.id(&r.path);
                files.ids.remove(&r.path);
                about.push((id, None));
            }
            SYNCALL => {
                last_syncall = Some(i);
                about.push((0, None));
            }
            kind => panic!("power-cut journal: unknown record type {kind}"),
        }
    }
    let after_syncall = |i: usize| last_syncall.is_some_and(|s| s > i);
    let durable =
        |i: usize, id: usize| after_syncall(i) || last_sync.get(&id).is_some_and(|&s| s > i);
    // With a seed: per file, how many of its unsynced writes survive, and
    // how many bytes of the next one (torn).
    let mut survive: HashMap<usize, (usize, Option<u64>)> = HashMap::new();
    if let Some(seed) = seed {
        let mut state = seed | 1;
        let mut unsynced: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (i, r) in records.iter().enumerate() {
            if matches!(r.kind, WRITE | TRUNC) && !durable(i, about[i].0) {
                unsynced.entry(about[i].0).or_default().push(i);
            }
        }
        for (id, writes) in unsynced {
            let kept = (next(&mut state) % (writes.len() as u64 + 1)) as usize;
            // Torn at a sector (512 bytes) boundary inside the write, if it
            // crosses one: a device writes a sector whole or not at all.
            let torn = writes.get(kept).and_then(|&i| {
                let r = &records[i];
                let first = r.off / SECTOR + 1;
                let last = (r.off + r.len).saturating_sub(1) / SECTOR;
                (r.kind == WRITE && first <= last && next(&mut state).is_multiple_of(2))
                    .then(|| (first + next(&mut state) % (last - first + 1)) * SECTOR - r.off)
            });
            survive.insert(id, (kept, torn));
        }
    }
    // The position of each unsynced write among its file's.
    let mut nth: HashMap<usize, usize> = HashMap::new();
    let mut position = vec![0usize; records.len()];
    for (i, r) in records.iter().enumerate() {
        if matches!(r.kind, WRITE | TRUNC) && !durable(i, about[i].0) {
            let n = nth.entry(about[i].0).or_default();
            position[i] = *n;
            *n += 1;
        }
    }
    let dir_synced = |path: &Path, i: usize| {
        after_syncall(i)
            || path
                .parent()
                .and_then(|d| last_dirsync.get(d))
                .is_some_and(|&s| s > i)
    };
    // Backward: where each file is now, undoing what is not durable.
    let mut at: HashMap<usize, PathBuf> =
        (files.ids.iter()).map(|(p, &id)| (id, p.clone())).collect();
    let kept_sectors = match seed {
        Some(seed) => {
            let overwrites = (records.iter().enumerate()).filter(|&(i, r)| {
                r.kind == WRITE && r.off + r.len <= r.size && !durable(i, about[i].0)
            });
            overwritten_sectors_kept(overwrites.map(|(i, r)| (about[i].0, r)), &at, seed)
        }
        None => Vec::new(),
    };
    let mut report = CutReport {
        records: records.len(),
        ..CutReport::default()
    };
    let mut touched = std::collections::BTreeSet::new();
    let mut note = |path: &Path| {
        touched.insert(
            path.strip_prefix(root)
                .unwrap_or(path)
                .display()
                .to_string(),
        );
    };
    for (i, r) in records.iter().enumerate().rev() {
        let (id, replaced) = about[i];
        match r.kind {
            WRITE | TRUNC => {
                if durable(i, id) {
                    continue;
                }
                let (kept, torn) = survive.get(&id).copied().unwrap_or((0, None));
                if position[i] < kept {
                    report.survived += 1;
                    continue;
                }
                let torn = torn.filter(|_| position[i] == kept);
                let Some(path) = at.get(&id) else { continue };
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path);
                let file = file.unwrap_or_else(|e| panic!("cut: {}: {e}", path.display()));
                use std::os::unix::fs::FileExt;
                if r.kind == WRITE {
                    // What the write wrote (every later write is undone).
                    let mut written = vec![0; torn.unwrap_or(0) as usize];
                    let n = file.read_at(&mut written, r.off).unwrap_or(0);
                    written.truncate(n);
                    file.write_all_at(&r.data, r.off).unwrap();
                    if file.metadata().unwrap().len() > r.size {
                        file.set_len(r.size).unwrap();
                    }
                    if torn.is_some() {
                        file.write_all_at(&written, r.off).unwrap();
                        report.torn += 1;
                    }
                    report.bytes += r.len - written.len() as u64;
                } else {
                    file.set_len(r.size).unwrap();
                    file.write_all_at(&r.data, r.off).unwrap();
                    report.bytes += r.size.abs_diff(r.off);
                }
                report.writes += 1;
                note(path);
            }
            CREATE if !dir_synced(&r.path, i) => {
                if let Some(path) = at.remove(&id) {
                    std::fs::remove_file(&path).unwrap();
                    report.created += 1;
                    note(&path);
                }
            }
            RENAME if !(dir_synced(&r.path, i) && dir_synced(&r.path2, i)) => {
                if let Some(path) = at.get(&id).cloned() {
                    std::fs::rename(&path, &r.path).unwrap();
                    at.insert(id, r.path.clone());
                    note(&r.path);
                }
                if let Some(old) = replaced {
                    if r.size == 1 {
                        std::fs::write(&r.path2, &r.data).unwrap();
                        at.insert(old, r.path2.clone());
                    }
                }
                report.renames += 1;
                note(&r.path2);
            }
            UNLINK if !dir_synced(&r.path, i) => {
                std::fs::write(&r.path, &r.data).unwrap();
                at.insert(id, r.path.clone());
                report.unlinks += 1;
                note(&r.path);
            }
            _ => {}
        }
    }
    for (path, off, bytes) in kept_sectors {
        use std::os::unix::fs::FileExt;
        // Gone, or cut shorter than the sector, by the undo: nothing to keep.
        let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else {
            continue;
        };
        if file.metadata().unwrap().len() >= off + bytes.len() as u64 {
            file.write_all_at(&bytes, off).unwrap();
            report.sectors_kept += 1;
        }
    }
    report.files = touched.into_iter().collect();
    report
}

/// Of the sectors of the write-ahead file that `overwrites` (unsynced
/// writes within the file's size, with the file each is about) wrote, those
/// that survive the cut, each drawn on its own from `seed`: their path,
/// offset and bytes now (the newest written), to put back after the undo.
fn overwritten_sectors_kept<'a>(
    overwrites: impl Iterator<Item = (usize, &'a Record)>,
    at: &HashMap<usize, PathBuf>,
    seed: u64,
) -> Vec<(PathBuf, u64, Vec<u8>)> {
    let mut state = (seed ^ 0x5ec7_0125) | 1;
    let mut sectors = std::collections::BTreeSet::new();
    for (id, r) in overwrites {
        let Some(path) = at.get(&id).filter(|p| p.ends_with("mneme.wal")) else {
            continue;
        };
        for sector in r.off / SECTOR..(r.off + r.len).div_ceil(SECTOR) {
            sectors.insert((path.clone(), sector));
        }
    }
    let mut kept = Vec::new();
    for (path, sector) in sectors {
        if next(&mut state).is_multiple_of(2) {
            continue;
        }
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::open(&path).unwrap();
        let mut bytes = vec![0; SECTOR as usize];
        let n = file.read_at(&mut bytes, sector * SECTOR).unwrap();
        bytes.truncate(n);
        kept.push((path, sector * SECTOR, bytes));
    }
    kept
}

/// A power cut after every death of a `mneme` process in a scenario run
/// (see `scenario::Faults::power_cut`): cuts, then checks that the store
/// still opens and verifies, and tallies what the cuts dropped.
#[derive(Clone, Debug, Default)]
pub struct PowerCut {
    /// What every cut so far dropped, and what went wrong.
    pub tally: Arc<Mutex<Tally>>,
    /// `MNEME_DURABILITY` for the commands the driver runs (default: the
    /// binary's, `synced`).
    pub durability: Option<&'static str>,
    /// The state of the random draws of partial cuts ([`cut_with`]), when
    /// cuts are partial.
    pub random: Arc<Mutex<Option<u64>>>,
}

/// What the cuts of a test dropped, and the problems they revealed.
#[derive(Debug, Default)]
pub struct Tally {
    /// Cuts made.
    pub cuts: usize,
    /// Cuts that dropped writes to the log itself (sled's `db`, or the
    /// write-ahead file), not only to the holder note, snapshots or `conf`.
    pub cuts_dropping: usize,
    /// Everything dropped.
    pub dropped: CutReport,
    /// Events each session lost to a cut (seen in the page cache before the
    /// cut, gone after), summed.
    pub events_lost: usize,
    /// Problems: a store that does not open or verify after a cut, events
    /// that changed rather than went missing.
    pub problems: Vec<String>,
}

impl Tally {
    /// What the cuts dropped, as the summary lines say it: `cuts N (M
    /// dropping store writes), writes dropped W (bytes B), unsynced writes
    /// kept K (torn T)`.
    pub fn cuts_line(&self) -> String {
        let d = &self.dropped;
        format!(
            "cuts {} ({} dropping store writes), writes dropped {} (bytes {}), unsynced writes kept {} (torn {}), write-ahead sectors kept out of order {}",
            self.cuts, self.cuts_dropping, d.writes, d.bytes, d.survived, d.torn, d.sectors_kept
        )
    }
}

impl PowerCut {
    /// A new tally, the driver's commands at `durability`.
    pub fn new(durability: Option<&'static str>) -> PowerCut {
        PowerCut {
            durability,
            ..PowerCut::default()
        }
    }

    /// Makes the next cuts partial, drawn from `seed` ([`cut_with`]), or
    /// (`None`) whole again.
    pub fn randomize(&self, seed: Option<u64>) {
        *self.random.lock().unwrap() = seed.map(|s| s | 1);
    }

    /// Sets up a command the driver runs.
    pub fn configure(&self, command: &mut tokio::process::Command) {
        if let Some(durability) = self.durability {
            command.env("MNEME_DURABILITY", durability);
        }
    }

    /// Cuts the power under `world`'s data directory (its process has died)
    /// and checks what is left: every session's events after the cut must be
    /// a prefix of those before it (read from a copy taken before the cut),
    /// and the store must open and verify.
    /// Returns how many events the cut took away.
    pub fn after_death(&self, world: &crate::World) -> usize {
        let data = world.data();
        let before = world.dir.path().join("before-cut");
        let _ = std::fs::remove_dir_all(&before);
        let copied = data.exists() && copy_dir(&data, &before).is_ok();
        let seed = self.random.lock().unwrap().as_mut().map(next);
        let report = cut_with(&data, seed);
        let pre = copied.then(|| read_all(&before));
        let _ = std::fs::remove_dir_all(&before);
        settle(&before);
        let post = read_all(&data);
        let mut tally = self.tally.lock().unwrap();
        tally.cuts += 1;
        if (report.files.iter()).any(|f| f == "db" || f == "mneme.wal" || f.starts_with("segments"))
        {
            tally.cuts_dropping += 1;
        }
        tally.dropped.add(&report);
        let post = match post {
            Ok(post) => post,
            Err(e) => {
                tally
                    .problems
                    .push(format!("after a cut ({report:?}): {e}"));
                return 0;
            }
        };
        let mut lost = 0;
        if let Some(Ok(pre)) = pre {
            for (session, events) in &pre {
                let after = post.get(session).map_or(&[][..], |e| &e[..]);
                let kept = after.len().min(events.len());
                if after[..kept] != events[..kept] || after.len() > events.len() {
                    tally.problems.push(format!(
                        "session {session}: after a cut its events are not a prefix of those before ({report:?})"
                    ));
                }
                lost += events.len() - kept;
            }
        }
        tally.events_lost += lost;
        lost
    }
}

/// Every session's events (`mneme log --json`, one string each), after
/// `mneme verify` passed. (Opening writes: these commands are journalled
/// like any other, and a later cut may undo what they did not sync.)
fn read_all(data: &Path) -> Result<HashMap<String, Vec<String>>, String> {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(crate::mneme_bin())
            .arg("--data-dir")
            .arg(data)
            .args(args)
            .env_remove("MNEME_CRASH_AT")
            .output()
            .unwrap();
        out
    };
    let verify = run(&["verify"]);
    if !verify.status.success() {
        return Err(format!(
            "verify exited {:?}: {}{}",
            verify.status.code(),
            String::from_utf8_lossy(&verify.stdout),
            String::from_utf8_lossy(&verify.stderr)
        ));
    }
    let list = run(&["sessions", "--json"]);
    if !list.status.success() {
        return Err(format!(
            "sessions exited {:?}: {}",
            list.status.code(),
            String::from_utf8_lossy(&list.stderr)
        ));
    }
    let mut all = HashMap::new();
    let text = String::from_utf8_lossy(&list.stdout);
    let rows: Vec<serde_json::Value> = match serde_json::from_str(&text) {
        Ok(serde_json::Value::Array(rows)) => rows,
        _ => (text.lines())
            .map(|l| serde_json::from_str(l).map_err(|e| format!("sessions --json: {e}: {l}")))
            .collect::<Result<_, _>>()?,
    };
    for row in rows {
        let Some(id) = row["session"].as_str() else {
            return Err(format!("sessions --json: no session in {row}"));
        };
        let log = run(&["log", "--json", id]);
        if !log.status.success() {
            return Err(format!(
                "log {id} exited {:?}: {}",
                log.status.code(),
                String::from_utf8_lossy(&log.stderr)
            ));
        }
        let events = String::from_utf8_lossy(&log.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        all.insert(id.to_string(), events);
    }
    Ok(all)
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One record in the shim's layout.
    fn encode(kind: u8, size: u64, path: &Path, path2: &Path, data: &[u8]) -> Vec<u8> {
        use std::os::unix::ffi::OsStrExt;
        let mut out = vec![kind];
        for v in [0, size, 0] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for p in [path, path2] {
            let p = p.as_os_str().as_bytes();
            out.extend_from_slice(&(p.len() as u32).to_le_bytes());
            out.extend_from_slice(p);
        }
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
        out
    }

    /// A data directory with `a` (holding "a") and the journal `records`;
    /// cuts it and returns the directory.
    fn cut_after(records: impl Fn(&Path) -> Vec<Vec<u8>>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let data = data.canonicalize().unwrap();
        std::fs::write(data.join("a"), "a").unwrap();
        std::fs::write(journal_for(&data), records(&data).concat()).unwrap();
        cut(&data);
        assert!(!journal_for(&data).exists(), "the cut removes the journal");
        dir
    }

    fn read(dir: &tempfile::TempDir, name: &str) -> Option<String> {
        std::fs::read_to_string(dir.path().join("data").join(name)).ok()
    }

    #[test]
    fn a_last_change_journalled_but_not_made_is_not_undone() {
        let none = Path::new("");
        // Created, then renamed over `a` (which it replaced), all unsynced;
        // the rename was journalled and the process died before making it.
        let dir = cut_after(|d| {
            std::fs::write(d.join("b"), "").unwrap();
            vec![
                encode(CREATE, 0, &d.join("b"), none, b""),
                encode(RENAME, 1, &d.join("b"), &d.join("a"), b"a"),
            ]
        });
        assert_eq!(read(&dir, "a").as_deref(), Some("a"));
        assert_eq!(read(&dir, "b"), None, "the creation of b is undone");
        // An unlink journalled, not made: the file is left as it is.
        let dir = cut_after(|d| vec![encode(UNLINK, 0, &d.join("a"), none, b"old")]);
        assert_eq!(read(&dir, "a").as_deref(), Some("a"));
        // A creation journalled, not made: nothing to remove.
        let dir = cut_after(|d| vec![encode(CREATE, 0, &d.join("c"), none, b"")]);
        assert_eq!(read(&dir, "c"), None);
        assert_eq!(read(&dir, "a").as_deref(), Some("a"));
    }

    #[test]
    fn a_cancelled_record_and_a_record_cut_short_are_not_undone() {
        let none = Path::new("");
        let dir = cut_after(|d| {
            let torn = encode(UNLINK, 0, &d.join("a"), none, b"gone");
            vec![
                encode(UNLINK, 0, &d.join("a"), none, b"x"),
                encode(CANCEL, 0, none, none, b""),
                torn[..torn.len() - 2].to_vec(),
            ]
        });
        assert_eq!(read(&dir, "a").as_deref(), Some("a"));
    }

    #[test]
    fn a_last_change_made_is_undone() {
        let none = Path::new("");
        // `a` was renamed to `b` (made: `a` is gone) without a directory sync.
        let dir = cut_after(|d| {
            std::fs::rename(d.join("a"), d.join("b")).unwrap();
            vec![encode(RENAME, 0, &d.join("a"), &d.join("b"), b"")]
        });
        assert_eq!(read(&dir, "a").as_deref(), Some("a"));
        assert_eq!(read(&dir, "b"), None);
        // `a` was unlinked (made): put back with the bytes it had.
        let dir = cut_after(|d| {
            std::fs::remove_file(d.join("a")).unwrap();
            vec![encode(UNLINK, 0, &d.join("a"), none, b"old")]
        });
        assert_eq!(read(&dir, "a").as_deref(), Some("old"));
    }
}
