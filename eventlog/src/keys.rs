//! Per-session keys of a data directory: one small file each in `keys/`,
//! outside the storage engine, so that destroying one is an overwrite and
//! an unlink this module controls (sled keeps old versions of values in
//! its segments until it happens to rewrite them).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use uuid::Uuid;

/// The directory, under a data directory, that holds the keys.
pub const KEYS_DIR: &str = "keys";

/// The largest key file read (a wrapped key is under 100 bytes).
const MAX_KEY_BYTES: u64 = 4096;

/// The key files of one data directory.
#[derive(Debug, Clone)]
pub(crate) struct KeyFiles {
    dir: PathBuf,
}

impl KeyFiles {
    /// The key files under `data_dir` (the directory is made on first put).
    pub(crate) fn new(data_dir: &Path) -> KeyFiles {
        KeyFiles {
            dir: data_dir.join(KEYS_DIR),
        }
    }

    fn path(&self, session: Uuid) -> PathBuf {
        self.dir.join(session.simple().to_string())
    }

    /// The key of `session`, if one is kept.
    pub(crate) fn get(&self, session: Uuid) -> std::io::Result<Option<Vec<u8>>> {
        let mut bytes = Vec::new();
        match File::open(self.path(session)) {
            Ok(file) => file.take(MAX_KEY_BYTES).read_to_end(&mut bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(bytes))
    }

    /// Keeps `key` for `session` unless a key is kept already; returns the
    /// key kept. Durable when it returns: the file and its name are synced.
    pub(crate) fn put(&self, session: Uuid, key: &[u8]) -> std::io::Result<Vec<u8>> {
        if let Some(kept) = self.get(session)? {
            return Ok(kept);
        }
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(session);
        let temp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut file = crate::create_private(&temp)?;
        file.write_all(key)?;
        file.sync_all()?;
        // A hard link creates the name only if it does not exist: of two
        // writers, one key wins and both return it.
        let linked = std::fs::hard_link(&temp, &path);
        std::fs::remove_file(&temp)?;
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        File::open(&self.dir)?.sync_all()?;
        Ok(self.get(session)?.unwrap_or_default())
    }

    /// Destroys the key of `session`: its bytes are overwritten with zeros
    /// and synced, then its name is removed and the directory synced.
    /// Destroying a key that is not kept does nothing.
    pub(crate) fn destroy(&self, session: Uuid) -> std::io::Result<()> {
        let path = self.path(session);
        let mut file = match std::fs::OpenOptions::new().write(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len().min(MAX_KEY_BYTES) as usize;
        file.write_all(&vec![0; len])?;
        file.sync_data()?;
        std::fs::remove_file(&path)?;
        File::open(&self.dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_key_put_wins_and_a_destroyed_key_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let keys = KeyFiles::new(dir.path());
        let session = Uuid::now_v7();
        assert_eq!(keys.get(session).unwrap(), None);
        assert_eq!(keys.put(session, b"first").unwrap(), b"first");
        assert_eq!(keys.put(session, b"second").unwrap(), b"first");
        keys.destroy(session).unwrap();
        assert_eq!(keys.get(session).unwrap(), None);
        keys.destroy(session).unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path().join(KEYS_DIR))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
