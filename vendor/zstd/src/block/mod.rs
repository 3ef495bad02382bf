//! Compress and decompress individual blocks.
//!
//! These methods process all the input data at once.
//! It is therefore best used with relatively small blocks
//! (like small network packets).

mod compressor;
mod decompressor;

pub use self::compressor::Compressor;
pub use self::decompressor::Decompressor;

use std::io;

/// Compresses a single block of data to the given destination buffer.
///
/// Returns the number of bytes written, or an error if something happened
/// (for instance if the destination buffer was too small).
///
/// A level of `0` uses zstd's default (currently `3`).
pub fn compress_to_buffer(
    source: &[u8],
    destination: &mut [u8],
    level: i32,
) -> io::Result<usize> {
    Compressor::new().compress_to_buffer(source, destination, level)
}

/// Compresses a block of data and returns the compressed result.
///
/// A level of `0` uses zstd's default (currently `3`).
pub fn compress(data: &[u8], level: i32) -> io::Result<Vec<u8>> {
    // mneme: sled's level 1 runs at zstd's level -1 (see Cargo.toml).
    let level = if level == 1 { SLED_LEVEL_1 } else { level };
    // mneme: one context per thread (see Cargo.toml).
    COMPRESSOR
        .try_with(|c| match c.try_borrow_mut() {
            Ok(mut c) => c.compress(data, level),
            Err(_) => Compressor::new().compress(data, level),
        })
        .unwrap_or_else(|_| Compressor::new().compress(data, level))
}

/// mneme: the zstd level sled's level 1 (the lowest sled accepts) runs at.
/// At negative levels zstd stores literals raw instead of building Huffman
/// tables for each block, and sled compresses each record it logs on its
/// own, a small block each time: on a 1,000-turn session, 4% more bytes on
/// disk for about 7% less of the daemon's CPU.
const SLED_LEVEL_1: i32 = -1;

thread_local! {
    static COMPRESSOR: std::cell::RefCell<Compressor> =
        std::cell::RefCell::new(Compressor::new());
    pub(crate) static DECOMPRESSOR: std::cell::RefCell<Decompressor> =
        std::cell::RefCell::new(Decompressor::new());
}

/// Decompresses with this thread's context (a new one if it is in use).
pub(crate) fn with_decompressor<T>(f: impl Fn(&mut Decompressor) -> T) -> T {
    DECOMPRESSOR
        .try_with(|d| match d.try_borrow_mut() {
            Ok(mut d) => f(&mut d),
            Err(_) => f(&mut Decompressor::new()),
        })
        .unwrap_or_else(|_| f(&mut Decompressor::new()))
}

/// Deompress a single block of data to the given destination buffer.
///
/// Returns the number of bytes written, or an error if something happened
/// (for instance if the destination buffer was too small).
pub fn decompress_to_buffer(
    source: &[u8],
    destination: &mut [u8],
) -> io::Result<usize> {
    Decompressor::new().decompress_to_buffer(source, destination)
}

/// Decompresses a block of data and returns the decompressed result.
///
/// The decompressed data should be less than `capacity` bytes,
/// or an error will be returned.
pub fn decompress(data: &[u8], capacity: usize) -> io::Result<Vec<u8>> {
    with_decompressor(|d| d.decompress(data, capacity))
}

#[cfg(test)]
mod tests {
    use super::{compress, decompress};

    #[test]
    fn test_direct() {
        // Can we include_str!("assets/example.txt")?
        // It's excluded from the packaging step, so maybe not.
        let text = include_str!("../../assets/example.txt");
        crate::test_cycle_unwrap(
            text.as_bytes(),
            |data| compress(data, 1),
            |data| decompress(data, text.len()),
        );
    }
}
