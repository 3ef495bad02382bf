//! Bounded capture of what a tool sends back: its output is untrusted, may
//! be huge or endless, and must never be buffered whole.

use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;

/// What was kept of a stream, and how long it really was.
#[derive(Debug, Default)]
pub(crate) struct Captured {
    /// The bytes kept (the head of the stream, or its tail).
    pub kept: Vec<u8>,
    /// Bytes the stream carried in all, kept or not.
    pub total: u64,
}

impl Captured {
    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.kept.len() as u64
    }
}

/// Which part of a stream to keep.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Keep {
    /// The first N bytes (a result).
    Head(usize),
    /// The last N bytes (the end of stderr, where errors are).
    Tail(usize),
}

/// After the process exited, how long a pipe may stay quiet before it is
/// given up: a descendant that escaped the process group (`setsid`) can hold
/// it open forever, but what the process wrote is already in the pipe.
const QUIET_AFTER_EXIT: Duration = Duration::from_millis(100);
/// After the process exited, how long a pipe is read at most.
const READ_AFTER_EXIT: Duration = Duration::from_secs(1);

/// Reads `pipe` to its end, keeping what `keep` says and counting the rest,
/// in memory bounded by `keep`'s size. Once `exited` turns true the pipe is
/// read only while it still delivers (see [`QUIET_AFTER_EXIT`]).
pub(crate) async fn capture(
    mut pipe: impl AsyncRead + Unpin,
    keep: Keep,
    mut exited: watch::Receiver<bool>,
) -> Captured {
    let mut out = Captured::default();
    let mut chunk = vec![0u8; 64 << 10];
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let read = match deadline {
            None => tokio::select! {
                read = pipe.read(&mut chunk) => read,
                changed = exited.changed() => {
                    if changed.is_err() || *exited.borrow() {
                        deadline = Some(tokio::time::Instant::now() + READ_AFTER_EXIT);
                    }
                    continue;
                }
            },
            Some(deadline) => {
                let quiet = tokio::time::Instant::now() + QUIET_AFTER_EXIT;
                match tokio::time::timeout_at(quiet.min(deadline), pipe.read(&mut chunk)).await {
                    Ok(read) => read,
                    Err(_) => break,
                }
            }
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => out.take(&chunk[..n], keep),
        }
    }
    out
}

impl Captured {
    /// Adds `bytes` of the stream, keeping within `keep`.
    pub fn take(&mut self, bytes: &[u8], keep: Keep) {
        self.total += bytes.len() as u64;
        match keep {
            Keep::Head(max) => {
                let room = max.saturating_sub(self.kept.len());
                self.kept.extend_from_slice(&bytes[..room.min(bytes.len())]);
            }
            Keep::Tail(max) => {
                self.kept.extend_from_slice(bytes);
                // Trim in batches, so a stream of small writes costs O(n).
                if self.kept.len() > 2 * max {
                    let cut = self.kept.len() - max;
                    self.kept.drain(..cut);
                }
            }
        }
    }

    /// The kept bytes as text (for a tail, only its last `max` bytes); a
    /// character cut at the edge is dropped, other invalid UTF-8 replaced.
    pub fn text(&self, keep: Keep) -> String {
        let bytes = match keep {
            Keep::Tail(max) if self.kept.len() > max => &self.kept[self.kept.len() - max..],
            _ => &self.kept[..],
        };
        let bytes = match (keep, std::str::from_utf8(bytes)) {
            (Keep::Head(_), Err(e)) if e.error_len().is_none() => &bytes[..e.valid_up_to()],
            _ => bytes,
        };
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// The note the model gets after a cut result.
pub(crate) fn truncation_note(kept: usize, total: u64, complete: bool) -> String {
    let total = if complete {
        format!("{total}")
    } else {
        format!("more than {total}")
    };
    format!("\n[mneme] output truncated: kept the first {kept} of {total} bytes (max_output_bytes)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_keeps_the_start_and_counts_everything() {
        let mut c = Captured::default();
        for _ in 0..100 {
            c.take(&[b'a'; 1000], Keep::Head(2500));
        }
        assert_eq!((c.kept.len(), c.total), (2500, 100_000));
        assert!(c.truncated());
    }

    #[test]
    fn tail_keeps_the_end_in_bounded_memory() {
        let mut c = Captured::default();
        for i in 0..10_000u32 {
            c.take(format!("{i:05}\n").as_bytes(), Keep::Tail(12));
            assert!(c.kept.len() <= 24 + 6);
        }
        assert_eq!(c.text(Keep::Tail(12)), "09998\n09999\n");
        assert_eq!(c.total, 60_000);
    }

    #[test]
    fn a_character_cut_at_the_edge_is_dropped() {
        let mut c = Captured::default();
        c.take("aé".as_bytes(), Keep::Head(2));
        assert_eq!(c.text(Keep::Head(2)), "a");
    }
}
