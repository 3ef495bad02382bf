//! Starting tool processes so that they die with mneme.
//!
//! `PR_SET_PDEATHSIG` kills a child when the *thread* that forked it exits,
//! and an async runtime retires its worker threads; so every tool process is
//! forked by one thread that lives as long as the process. When mneme is
//! killed (SIGKILL included), the kernel sends each direct child SIGKILL;
//! the rest of a tool's process group is stopped by the call's own cleanup
//! while mneme lives.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type Request = (
    tokio::process::Command,
    tokio::runtime::Handle,
    tokio::sync::oneshot::Sender<std::io::Result<tokio::process::Child>>,
);

/// No umask was set for tools: they inherit mneme's.
const INHERIT_UMASK: u32 = u32::MAX;
static TOOL_UMASK: AtomicU32 = AtomicU32::new(INHERIT_UMASK);

/// Tool processes start with this umask instead of mneme's own (mneme
/// keeps its files private with a strict umask; a tool's files are the
/// user's business).
pub fn set_tool_umask(mask: libc::mode_t) {
    TOOL_UMASK.store(mask, Ordering::Relaxed);
}

fn spawner() -> &'static Mutex<mpsc::Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (send, receive) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("mneme-tool-spawner".into())
            .spawn(move || {
                for (mut command, runtime, reply) in receive {
                    let _entered = runtime.enter();
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("the tool spawner thread starts");
        Mutex::new(send)
    })
}

/// Spawns `command` from the long-lived spawner thread, with SIGKILL as its
/// parent-death signal and the tools' umask. Waits without blocking the
/// async runtime's threads.
pub(crate) async fn spawn(
    mut command: tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let umask = TOOL_UMASK.load(Ordering::Relaxed);
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls async-signal-safe functions (prctl, getppid, umask, kill).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // mneme died between fork and prctl: the signal was missed.
            if libc::getppid() != parent {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            if umask != INHERIT_UMASK {
                libc::umask(umask);
            }
            Ok(())
        });
    }
    let gone = || std::io::Error::other("the tool spawner thread is gone");
    let (reply, answer) = tokio::sync::oneshot::channel();
    let request = (command, tokio::runtime::Handle::current(), reply);
    spawner()
        .lock()
        .expect("spawner lock")
        .send(request)
        .map_err(|_| gone())?;
    answer.await.map_err(|_| gone())?
}

/// Kills a process group when dropped: when the call ends, times out or is
/// abandoned (or an MCP server is stopped), nothing it started keeps running.
pub(crate) struct GroupKiller(pub(crate) u32);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        // SAFETY: kill(2) has no memory-safety preconditions. The group id is
        // the pid of our child, which cannot be reused while the group lives.
        unsafe {
            libc::kill(-(self.0 as i32), libc::SIGKILL);
        }
    }
}
