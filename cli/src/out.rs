//! Standard output, which a reader may close at any time (`mneme log ID |
//! head`): once it is closed nothing more is written and nothing panics;
//! the command goes on (a turn still runs to its end) or stops early where
//! all it does is print ([`closed`]).

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `bytes` to stdout and flushes them, unless it is closed. A
/// closed pipe is quiet; any other failure to write is said once on stderr.
pub fn write(bytes: &[u8]) {
    if closed() {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        CLOSED.store(true, Ordering::SeqCst);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            runtime::text::say(&format!(
                "mneme: warning: standard output: {e}; nothing more is written to it"
            ));
        }
    }
}

/// Whether stdout was found closed: what is left to print can be skipped.
pub fn closed() -> bool {
    CLOSED.load(Ordering::SeqCst)
}

/// Whether `error` is, at its root, a write to a closed pipe: the reader
/// went away, which is no failure of the command's.
pub fn is_closed_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `println!`, through [`write`].
macro_rules! outln {
    () => {
        $crate::out::write(b"\n")
    };
    ($($arg:tt)*) => {
        $crate::out::write((format!($($arg)*) + "\n").as_bytes())
    };
}

/// `print!`, through [`write`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write(format!($($arg)*).as_bytes())
    };
}
