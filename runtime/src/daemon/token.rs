//! The daemon's bearer token, trimmed and compared in one place, for the
//! daemon and for the CLI that talks to it.

use sha2::{Digest, Sha256};

/// A token as given (a file's content, a variable's value) without the
/// spaces and line ends around it: what the daemon expects and what the
/// CLI sends.
pub fn trimmed(given: &str) -> &str {
    given.trim()
}

/// What a request's `Authorization` header must carry, kept as the token's
/// SHA-256 so that a comparison takes the same time whatever was sent.
pub(crate) struct Expected([u8; 32]);

impl Expected {
    /// Expects `token`.
    pub(crate) fn new(token: &str) -> Expected {
        Expected(Sha256::digest(trimmed(token)).into())
    }

    /// Whether `authorization` is `Bearer <the token>`: the scheme in any
    /// case (RFC 7235), the token trimmed, their digests compared in
    /// constant time.
    pub(crate) fn admits(&self, authorization: &str) -> bool {
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
