//! 32-byte secrets kept in files of their own (signing keys, master keys):
//! written once from the kernel's random source, readable by their owner
//! only, and refused when others can read them.

use std::path::Path;

/// The most of a key file read: a key is 64 hex digits and a line end.
const MAX_KEY_FILE_BYTES: u64 = 4096;

/// A new secret from the kernel's random source, written (hex) to `path`,
/// which must not exist, readable by its owner only.
pub(crate) fn generate(path: &Path) -> Result<[u8; 32], String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let secret = random::<32>().map_err(|e| format!("random source: {e}"))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| e.to_string())?;
    writeln!(file, "{}", hex::encode(secret)).map_err(|e| e.to_string())?;
    file.sync_all().map_err(|e| e.to_string())?;
    Ok(secret)
}

/// The secret in `path` (as [`generate`] writes it): a regular file of at
/// most [`MAX_KEY_FILE_BYTES`], refused if its group or others can read
/// it. `keygen` is the command that writes one, named in the refusal.
pub(crate) fn load(path: &Path, keygen: &str) -> Result<[u8; 32], String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| e.to_string())?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "mode {:04o}: others can read it; `chmod 600 {}`",
            mode & 0o777,
            path.display()
        ));
    }
    let text = read_key_file(path)?;
    hex::decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format!("not 64 hex digits (write one with `{keygen}`)"))
}

/// The text of key file `path`, a regular file of at most
/// [`MAX_KEY_FILE_BYTES`].
pub(crate) fn read_key_file(path: &Path) -> Result<String, String> {
    crate::model::read_small_file(&path.display().to_string(), MAX_KEY_FILE_BYTES)
}

/// `N` bytes from the kernel's random source.
pub(crate) fn random<const N: usize>() -> Result<[u8; N], getrandom::Error> {
    let mut bytes = [0u8; N];
    getrandom::getrandom(&mut bytes)?;
    Ok(bytes)
}

/// Refuses a key file inside `data_dir`: a copy of the directory must not
/// carry the key (`why` says what it would then give away).
pub(crate) fn outside(path: &Path, data_dir: Option<&Path>, why: &str) -> Result<(), String> {
    let Some(dir) = data_dir else {
        return Ok(());
    };
    let canonical = |p: &Path| p.canonicalize().ok();
    match (canonical(path), canonical(dir)) {
        (Some(file), Some(dir)) if file.starts_with(&dir) => Err(format!(
            "it lies inside the data directory {}: keep it elsewhere, or {why}",
            dir.display()
        )),
        _ => Ok(()),
    }
}
