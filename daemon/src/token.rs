//! The daemon's bearer token, read, checked and compared in one place, for
//! the daemon and for the CLI that talks to it.

use runtime::RuntimeError;
use sha2::{Digest, Sha256};
use std::path::Path;

/// The fewest bytes a token may have.
pub const MIN_BYTES: usize = 16;

/// A token as given (a file's content, a variable's value) without the
/// spaces and line ends around it: what the daemon expects and what the
/// CLI sends.
pub fn trimmed(given: &str) -> &str {
    given.trim()
}

/// The token in `given`, which came from `origin` (named in the error):
/// trimmed, and refused if shorter than [`MIN_BYTES`].
pub fn checked(given: &str, origin: &str) -> Result<String, RuntimeError> {
    let token = trimmed(given);
    if token.len() < MIN_BYTES {
        return Err(RuntimeError::Daemon(format!(
            "the token in {origin} has {} bytes, fewer than {MIN_BYTES} bytes: use a long random one (e.g. `openssl rand -hex 32`)",
            token.len()
        )));
    }
    Ok(token.to_string())
}

/// The token in file `path`, which nobody but its owner may read or change.
pub fn read_file(path: &Path) -> Result<String, RuntimeError> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let failed = |e: std::io::Error| {
        RuntimeError::Daemon(format!("reading token file {}: {e}", path.display()))
    };
    let mut file = std::fs::File::open(path).map_err(failed)?;
    let mode = file.metadata().map_err(failed)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(RuntimeError::Daemon(format!(
            "token file {} has mode {mode:04o}: its group or others can read or change it; `chmod 600 {}`",
            path.display(),
            path.display()
        )));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(failed)?;
    checked(&text, &format!("token file {}", path.display()))
}

/// What a request's `Authorization` header must carry, kept as the token's
/// SHA-256 so that a comparison takes the same time whatever was sent.
pub struct Expected([u8; 32]);

impl Expected {
    /// Expects `token`.
    pub fn new(token: &str) -> Expected {
        Expected(Sha256::digest(trimmed(token)).into())
    }

    /// Whether `authorization` is `Bearer <the token>`: the scheme in any
    /// case (RFC 7235), the token trimmed, their digests compared in
    /// constant time.
    pub fn admits(&self, authorization: &str) -> bool {
        let Some((scheme, token)) = authorization.trim_start().split_once([' ', '\t']) else {
            return false;
        };
        let given: [u8; 32] = Sha256::digest(trimmed(token)).into();
        let differences = given
            .iter()
            .zip(&self.0)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        scheme.eq_ignore_ascii_case("bearer") & (differences == 0)
    }
}
