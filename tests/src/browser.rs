//! A minimal headless-Chromium driver for end-to-end tests, speaking the
//! Chrome DevTools Protocol (CDP) over `--remote-debugging-pipe`.
//!
//! Chromium's pipe mode, as found out writing this:
//!
//! - Chromium reads CDP commands from fd 3 and writes replies and events to
//!   fd 4; each message is one JSON object followed by a NUL byte. Nothing
//!   else is said on either pipe, and there is no handshake: the first
//!   command is answered once the browser is up.
//! - The child must find the pipes at exactly fds 3 and 4 without
//!   `FD_CLOEXEC`. `dup2` onto a fd clears that flag, but `dup2(fd, fd)` does
//!   nothing, so the ends are first copied above 4 and then moved into place.
//! - All the browser's own fds are created `O_CLOEXEC` so that no other child
//!   of the test process (tests spawn many) holds a pipe end: were one to,
//!   the reader would never see end-of-file after the browser dies.
//! - The Debian `/usr/bin/chromium` is a shell script that `exec`s the real
//!   binary; fds 3 and 4 survive it, and the pid is the browser's.
//! - Replies to a page session carry its `sessionId` (with
//!   `Target.attachToTarget {flatten: true}`); replies to browser-level
//!   commands carry none. Events are messages with `method` and no `id`.
//! - `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits,
//!   not the process. The browser is therefore spawned by a keeper thread that
//!   lives exactly as long as the browser, so a `Browser` may be shared
//!   between test threads and still dies with the test process.

use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long one CDP command may take to be answered.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Page::goto`] waits for the page to finish loading.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How often [`Page::wait_for`] re-evaluates its condition.
const POLL: Duration = Duration::from_millis(100);
/// How many events are kept for [`Page::take_events`]; older ones are dropped.
const MAX_EVENTS: usize = 1000;
/// How much of chromium's stderr an error quotes.
const STDERR_TAIL: u64 = 2000;

/// A headless Chromium process driven over CDP.
///
/// Guarantees: the process runs in its own process group, which is killed
/// (SIGKILL) and reaped when the `Browser` is dropped; if the test process
/// dies first, the kernel kills the browser (`PR_SET_PDEATHSIG`). Its profile
/// lives in a fresh temporary directory, removed on drop.
pub struct Browser {
    conn: Arc<Conn>,
    pid: u32,
    keeper: Option<JoinHandle<Option<ExitStatus>>>,
    dir: PathBuf,
}

/// One tab of a [`Browser`], attached through a flat CDP session, with the
/// `Page` and `Runtime` domains enabled.
///
/// Guarantees: every command waits at most 30 s for its answer. Once the
/// browser is dropped, every command fails with an error saying so. The tab
/// is closed when the `Page` is dropped.
pub struct Page {
    conn: Arc<Conn>,
    session: String,
    target: String,
}

/// The connection to the browser: the pipe we write commands to, and what
/// the reader thread has received.
struct Conn {
    to_browser: Mutex<File>,
    inbox: Mutex<Inbox>,
    arrived: Condvar,
    next_id: AtomicU64,
    stderr_log: PathBuf,
}

/// What the reader thread has received.
#[derive(Default)]
struct Inbox {
    /// Replies by command id: `None` while the caller still waits for it.
    /// Replies to ids not in here (abandoned or fire-and-forget) are dropped.
    replies: HashMap<u64, Option<Value>>,
    /// The most recent events, oldest first.
    events: VecDeque<Value>,
    /// Why the browser's output ended, once it has.
    closed: Option<String>,
}

impl Browser {
    /// Starts headless Chromium (`$MNEME_CHROMIUM`, else `chromium` or
    /// `chromium-browser` on `PATH`) on `about:blank` and waits until it
    /// answers a CDP command.
    ///
    /// Errors name what failed; once the process runs, they quote the tail of
    /// its stderr.
    pub fn start() -> Result<Browser, String> {
        let exe = find_chromium()?;
        let dir = fresh_temp_dir()?;
        let stderr_log = dir.join("chromium.stderr");
        let result = Browser::launch(&exe, &dir, &stderr_log);
        if result.is_err() {
            // A browser that started is killed by dropping it; remove what
            // is left when none did.
            let _ = std::fs::remove_dir_all(&dir);
        }
        result
    }

    fn launch(exe: &Path, dir: &Path, stderr_log: &Path) -> Result<Browser, String> {
        let (child_reads, we_write) = cloexec_pipe()?;
        let (we_read, child_writes) = cloexec_pipe()?;
        let command = chromium_command(exe, dir, stderr_log, &child_reads, &child_writes)?;
        let (pid, keeper) = spawn_kept(command, vec![child_reads, child_writes])
            .map_err(|e| format!("starting {}: {e}", exe.display()))?;
        let conn = Arc::new(Conn {
            to_browser: Mutex::new(File::from(we_write)),
            inbox: Mutex::new(Inbox::default()),
            arrived: Condvar::new(),
            next_id: AtomicU64::new(1),
            stderr_log: stderr_log.to_path_buf(),
        });
        let browser = Browser {
            conn: Arc::clone(&conn),
            pid,
            keeper: Some(keeper),
            dir: dir.to_path_buf(),
        };
        thread::Builder::new()
            .name("chromium-cdp-reader".into())
            .spawn(move || read_messages(File::from(we_read), &conn))
            .map_err(|e| format!("starting the CDP reader thread: {e}"))?;
        browser
            .conn
            .call(None, "Browser.getVersion", json!({}))
            .map_err(|e| format!("{} did not answer over CDP: {e}", exe.display()))?;
        Ok(browser)
    }

    /// Opens a new tab on `about:blank` and attaches to it, with the `Page`
    /// and `Runtime` domains enabled.
    pub fn new_page(&self) -> Result<Page, String> {
        let created = self
            .conn
            .call(None, "Target.createTarget", json!({"url": "about:blank"}))?;
        let target = str_field(&created, "targetId", "Target.createTarget")?;
        let attached = self.conn.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        )?;
        let session = str_field(&attached, "sessionId", "Target.attachToTarget")?;
        let page = Page {
            conn: Arc::clone(&self.conn),
            session,
            target,
        };
        page.call("Page.enable", json!({}))?;
        page.call("Runtime.enable", json!({}))?;
        Ok(page)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a negative pid signals that process group;
        // the group is the browser's own (process_group(0)).
        unsafe {
            libc::kill(-(self.pid as libc::pid_t), libc::SIGKILL);
        }
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Page {
    /// Sends one CDP command to this tab and returns its `result`.
    ///
    /// Errors name the method and carry CDP's error message, or say that no
    /// answer came within 30 s or that the browser is gone.
    pub fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        self.conn.call(Some(&self.session), method, params)
    }

    /// Navigates to `url` and waits (up to 30 s) until the new document's
    /// `document.readyState` is `"complete"`.
    ///
    /// Errors if the navigation fails (such as a refused connection) or the
    /// load does not finish in time.
    pub fn goto(&self, url: &str) -> Result<(), String> {
        let nav = self.call("Page.navigate", json!({"url": url}))?;
        if let Some(error) = nav["errorText"].as_str().filter(|e| !e.is_empty()) {
            return Err(format!("navigating to {url}: {error}"));
        }
        // A cross-document navigation names its loader: wait until the main
        // frame shows it, so the old document's readyState is never taken.
        let loader = nav["loaderId"].as_str();
        let deadline = Instant::now() + LOAD_TIMEOUT;
        loop {
            if self.loaded(loader)? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "navigating to {url}: not loaded within {LOAD_TIMEOUT:?} ({})",
                    self.describe()
                ));
            }
            // The driver's own poll (an error describing the page, not a
            // panic; blocking, as the whole driver is), not a sleep for time.
            thread::sleep(POLL);
        }
    }

    /// Whether the main frame is showing `loader` (if given) and its
    /// document has finished loading. A context torn down mid-navigation
    /// counts as not loaded yet.
    fn loaded(&self, loader: Option<&str>) -> Result<bool, String> {
        if let Some(loader) = loader {
            let tree = self.call("Page.getFrameTree", json!({}))?;
            if tree["frameTree"]["frame"]["loaderId"].as_str() != Some(loader) {
                return Ok(false);
            }
        }
        Ok(self.eval("document.readyState").ok() == Some(json!("complete")))
    }

    /// Evaluates `js` in the page (awaiting it if it is a promise) and
    /// returns its value as JSON; `undefined` and values JSON cannot hold
    /// come back as `null`.
    ///
    /// A thrown exception (or rejected promise) is an error carrying its
    /// description.
    pub fn eval(&self, js: &str) -> Result<Value, String> {
        let reply = self.call(
            "Runtime.evaluate",
            json!({"expression": js, "awaitPromise": true, "returnByValue": true}),
        )?;
        if let Some(details) = reply.get("exceptionDetails") {
            return Err(format!(
                "evaluating `{}`: {}",
                excerpt(js, 200),
                exception_text(details)
            ));
        }
        Ok(reply["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    /// Evaluates `js_condition` every 100 ms until its value is truthy (not
    /// `null`, `false`, `0` or `""`) and returns that value.
    ///
    /// A condition that throws counts as not yet true. On timeout the error
    /// names the condition, the last exception it threw (if any), the page's
    /// URL and up to 2000 characters of its `document.body.innerText`.
    pub fn wait_for(&self, js_condition: &str, timeout: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let last_error = match self.eval(js_condition) {
                Ok(value) if truthy(&value) => return Ok(value),
                Ok(_) => None,
                Err(e) => Some(e),
            };
            if Instant::now() >= deadline {
                let thrown = last_error
                    .map(|e| format!("; last error: {e}"))
                    .unwrap_or_default();
                return Err(format!(
                    "waited {timeout:?} for `{js_condition}`{thrown} ({})",
                    self.describe()
                ));
            }
            // As in `goto`: the driver's own poll, not a sleep for time.
            thread::sleep(POLL);
        }
    }

    /// Clicks the first element matching `css_selector` (scrolled into view,
    /// through its `click()` method).
    ///
    /// Errors, naming the selector, when nothing matches or the selector is
    /// invalid.
    pub fn click(&self, css_selector: &str) -> Result<(), String> {
        let selector = Value::from(css_selector).to_string();
        let js = format!(
            "(() => {{ const el = document.querySelector({selector}); \
             if (!el) return false; \
             el.scrollIntoView({{block: 'center'}}); el.click(); return true; }})()"
        );
        match self.eval(&js) {
            Ok(Value::Bool(true)) => Ok(()),
            Ok(_) => Err(format!(
                "click: no element matches `{css_selector}` ({})",
                self.describe()
            )),
            Err(e) => Err(format!("click on `{css_selector}`: {e}")),
        }
    }

    /// Saves a PNG screenshot of the whole page to `path`, creating its
    /// parent directories. The page is brought to the front first: a
    /// headless tab in the background is not painted, and its screenshot
    /// never comes.
    pub fn screenshot(&self, path: &Path) -> Result<(), String> {
        self.call("Page.bringToFront", json!({}))?;
        let shot = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        )?;
        let data = str_field(&shot, "data", "Page.captureScreenshot")?;
        let png = base64_decode(&data).map_err(|e| format!("Page.captureScreenshot data: {e}"))?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(path, png).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// The cookies the browser would send to the current page's URL: CDP's
    /// array of `{name, value, domain, path, httpOnly, secure, sameSite, ...}`
    /// (`sameSite` is `"Strict"`, `"Lax"` or `"None"` when set).
    pub fn cookies(&self) -> Result<Value, String> {
        let reply = self.call("Network.getCookies", json!({}))?;
        match reply.get("cookies") {
            Some(cookies @ Value::Array(_)) => Ok(cookies.clone()),
            _ => Err(format!("Network.getCookies: no cookies array in {reply}")),
        }
    }

    /// Removes and returns the events CDP sent for this tab so far (such as
    /// `Runtime.consoleAPICalled` or `Runtime.exceptionThrown`), oldest
    /// first. Only the browser's most recent 1000 events are kept.
    pub fn take_events(&self) -> Vec<Value> {
        let mut inbox = self.conn.inbox.lock().expect("CDP inbox lock poisoned");
        let (mine, others): (Vec<Value>, Vec<Value>) = std::mem::take(&mut inbox.events)
            .into_iter()
            .partition(|event| event["sessionId"].as_str() == Some(self.session.as_str()));
        inbox.events = others.into();
        mine
    }

    /// The page's URL and the start of its text, for error messages.
    fn describe(&self) -> String {
        let js = "JSON.stringify([location.href, document.body ? document.body.innerText : ''])";
        let state = self.eval(js).map(|v| v.as_str().map(str::to_owned));
        match state.map(|s| s.and_then(|s| serde_json::from_str::<(String, String)>(&s).ok())) {
            Ok(Some((url, text))) => format!("page {url}, text: {:?}", excerpt(&text, 2000)),
            Ok(None) => "page state unreadable".to_owned(),
            Err(e) => format!("page state unreadable: {e}"),
        }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // Fire and forget: a hung browser must not hang the drop.
        let _ = self
            .conn
            .send(None, "Target.closeTarget", json!({"targetId": self.target}));
    }
}

impl Conn {
    /// Sends a command (to `session`, or to the browser) and waits up to
    /// [`CALL_TIMEOUT`] for its reply's `result`.
    fn call(&self, session: Option<&str>, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut inbox = self.lock_inbox();
            if let Some(why) = &inbox.closed {
                return Err(format!("CDP {method}: {why}{}", self.stderr_tail()));
            }
            inbox.replies.insert(id, None);
        }
        let reply = self
            .write(id, session, method, params)
            .and_then(|()| self.wait_reply(id, method));
        self.lock_inbox().replies.remove(&id);
        let reply = reply?;
        if let Some(error) = reply.get("error") {
            return Err(format!("CDP {method} failed: {}", cdp_error_text(error)));
        }
        Ok(reply.get("result").cloned().unwrap_or(Value::Null))
    }

    /// Sends a command whose reply nobody waits for.
    fn send(&self, session: Option<&str>, method: &str, params: Value) -> Result<(), String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.write(id, session, method, params)
    }

    fn write(
        &self,
        id: u64,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<(), String> {
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = Value::from(session);
        }
        let mut bytes = message.to_string().into_bytes();
        bytes.push(0);
        let mut pipe = self.to_browser.lock().expect("CDP pipe lock poisoned");
        pipe.write_all(&bytes).map_err(|e| {
            format!(
                "CDP {method}: writing to the browser: {e}{}",
                self.stderr_tail()
            )
        })
    }

    fn wait_reply(&self, id: u64, method: &str) -> Result<Value, String> {
        let deadline = Instant::now() + CALL_TIMEOUT;
        let mut inbox = self.lock_inbox();
        loop {
            if let Some(Some(reply)) = inbox.replies.get_mut(&id).map(Option::take) {
                return Ok(reply);
            }
            if let Some(why) = &inbox.closed {
                return Err(format!("CDP {method}: {why}{}", self.stderr_tail()));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "CDP {method}: no answer within {CALL_TIMEOUT:?}{}",
                    self.stderr_tail()
                ));
            }
            inbox = self
                .arrived
                .wait_timeout(inbox, deadline - now)
                .expect("CDP inbox lock poisoned")
                .0;
        }
    }

    fn lock_inbox(&self) -> std::sync::MutexGuard<'_, Inbox> {
        self.inbox.lock().expect("CDP inbox lock poisoned")
    }

    /// The end of chromium's stderr, as a suffix for error messages.
    fn stderr_tail(&self) -> String {
        let tail = File::open(&self.stderr_log).and_then(|mut file| {
            let len = file.metadata()?.len();
            file.seek(SeekFrom::Start(len.saturating_sub(STDERR_TAIL)))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        });
        match tail {
            Ok(tail) if !tail.trim().is_empty() => {
                format!("\nchromium's stderr ends:\n{}", tail.trim_end())
            }
            Ok(_) => String::new(),
            // Removed with the dropped browser's temp dir.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => format!(" (reading {}: {e})", self.stderr_log.display()),
        }
    }
}

/// The reader thread: splits the browser's output on NUL, files replies by
/// id and keeps events, until the pipe ends.
fn read_messages(pipe: File, conn: &Conn) {
    let mut reader = BufReader::new(pipe);
    let why = loop {
        let mut message = Vec::new();
        match reader.read_until(0, &mut message) {
            Ok(0) => break "the browser closed its CDP pipe".to_owned(),
            Ok(_) if message.last() != Some(&0) => {
                break "the browser's CDP pipe ended mid-message".to_owned()
            }
            Ok(_) => {
                message.pop();
                if let Err(e) = file_message(conn, &message) {
                    break e;
                }
            }
            Err(e) => break format!("reading the browser's CDP pipe: {e}"),
        }
    };
    conn.lock_inbox().closed = Some(why);
    conn.arrived.notify_all();
}

/// Files one message: a reply under its id (if awaited), an event in the
/// bounded queue.
fn file_message(conn: &Conn, message: &[u8]) -> Result<(), String> {
    let value: Value = serde_json::from_slice(message).map_err(|e| {
        format!(
            "the browser sent invalid JSON ({e}): {}",
            excerpt(&String::from_utf8_lossy(message), 200)
        )
    })?;
    let mut inbox = conn.lock_inbox();
    if let Some(id) = value.get("id").and_then(Value::as_u64) {
        if let Some(slot) = inbox.replies.get_mut(&id) {
            *slot = Some(value);
            conn.arrived.notify_all();
        }
    } else if value.get("method").is_some() {
        if inbox.events.len() == MAX_EVENTS {
            inbox.events.pop_front();
        }
        inbox.events.push_back(value);
    }
    Ok(())
}

/// `$MNEME_CHROMIUM`, else the first of `chromium`, `chromium-browser` on
/// `PATH`.
fn find_chromium() -> Result<PathBuf, String> {
    if let Some(exe) = std::env::var_os("MNEME_CHROMIUM") {
        return Ok(PathBuf::from(exe));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["chromium", "chromium-browser"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| {
            "no chromium: set MNEME_CHROMIUM or put chromium on PATH (scripts/chromium.sh installs it)"
                .to_owned()
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A new, empty directory under the system's temp dir.
fn fresh_temp_dir() -> Result<PathBuf, String> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let name = format!(
        "mneme-chromium-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir)
}

/// A pipe as (read end, write end), both close-on-exec.
fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), String> {
    let mut fds: [RawFd; 2] = [-1, -1];
    // SAFETY: pipe2 writes two fds into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The chromium command line: headless, quiet, in its own process group,
/// with `child_reads` as its fd 3 and `child_writes` as its fd 4.
fn chromium_command(
    exe: &Path,
    dir: &Path,
    stderr_log: &Path,
    child_reads: &OwnedFd,
    child_writes: &OwnedFd,
) -> Result<Command, String> {
    let log =
        File::create(stderr_log).map_err(|e| format!("creating {}: {e}", stderr_log.display()))?;
    let log_too = log
        .try_clone()
        .map_err(|e| format!("duplicating {}: {e}", stderr_log.display()))?;
    let mut command = Command::new(exe);
    command
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--remote-debugging-pipe",
            "--window-size=1280,900",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--metrics-recording-only",
            "--disable-default-apps",
            "--disable-breakpad",
            "--disable-domain-reliability",
            "--disable-client-side-phishing-detection",
            "--no-pings",
            "--mute-audio",
            "--password-store=basic",
            "--use-mock-keychain",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(log_too)
        .stderr(log)
        .process_group(0);
    let (reads, writes) = (child_reads.as_raw_fd(), child_writes.as_raw_fd());
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure only makes async-signal-safe calls (fcntl, dup2,
    // prctl, getppid) between fork and exec.
    unsafe {
        command.pre_exec(move || setup_child_fds(reads, writes, parent));
    }
    Ok(command)
}

/// In the child before exec: `reads` becomes fd 3 and `writes` fd 4, both
/// inherited across exec; the child dies with `parent` (the test process).
fn setup_child_fds(reads: RawFd, writes: RawFd, parent: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: plain syscalls on fds this process owns; all async-signal-safe.
    unsafe {
        // Copies above 4 (close-on-exec), so neither end is clobbered when
        // the other is moved onto 3 or 4, and dup2 never gets fd == target.
        let reads = check(libc::fcntl(reads, libc::F_DUPFD_CLOEXEC, 5))?;
        let writes = check(libc::fcntl(writes, libc::F_DUPFD_CLOEXEC, 5))?;
        // dup2 leaves the new fds without FD_CLOEXEC.
        check(libc::dup2(reads, 3))?;
        check(libc::dup2(writes, 4))?;
        check(libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
        ))?;
        // Parent gone before prctl: the signal would never come.
        if libc::getppid() != parent {
            return Err(std::io::Error::other("the test process exited"));
        }
    }
    Ok(())
}

fn check(ret: libc::c_int) -> std::io::Result<libc::c_int> {
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Spawns `command` from a keeper thread that waits for the child, so the
/// child's `PR_SET_PDEATHSIG` (tied to the forking thread) fires only when
/// the browser is reaped or the whole process dies. `child_fds` are closed
/// in this process once the child has them. Returns the pid and the keeper.
fn spawn_kept(
    mut command: Command,
    child_fds: Vec<OwnedFd>,
) -> Result<(u32, JoinHandle<Option<ExitStatus>>), String> {
    let (started, pid) = mpsc::channel();
    let keeper = thread::Builder::new()
        .name("chromium-keeper".into())
        .spawn(move || {
            let spawned = command.spawn();
            drop(child_fds);
            drop(command);
            match spawned {
                Ok(mut child) => {
                    let _ = started.send(Ok(child.id()));
                    child.wait().ok()
                }
                Err(e) => {
                    let _ = started.send(Err(e.to_string()));
                    None
                }
            }
        })
        .map_err(|e| format!("starting the keeper thread: {e}"))?;
    match pid.recv() {
        Ok(Ok(pid)) => Ok((pid, keeper)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("the keeper thread died before spawning".to_owned()),
    }
}

fn str_field(reply: &Value, field: &str, method: &str) -> Result<String, String> {
    reply[field].as_str().map(str::to_owned).ok_or_else(|| {
        format!(
            "CDP {method}: no {field} in {}",
            excerpt(&reply.to_string(), 200)
        )
    })
}

fn cdp_error_text(error: &Value) -> String {
    let message = error["message"].as_str().unwrap_or("unknown error");
    let code = &error["code"];
    match error["data"].as_str() {
        Some(data) => format!("{message} ({data}; code {code})"),
        None => format!("{message} (code {code})"),
    }
}

/// The text of CDP's `exceptionDetails`: the exception's description (which
/// includes the stack) if there is one, else its summary text.
fn exception_text(details: &Value) -> String {
    let exception = &details["exception"];
    exception["description"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| exception.get("value").map(Value::to_string))
        .or_else(|| details["text"].as_str().map(str::to_owned))
        .unwrap_or_else(|| details.to_string())
}

/// JavaScript truthiness of a JSON value.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// At most `max` characters of `text`, marked when cut.
fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Decodes standard, padded base64 (what CDP sends).
fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut nbits) = (0u32, 0u32);
    for (i, c) in text.bytes().enumerate() {
        let sextet = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return Err(format!("invalid base64 byte {c:#04x} at {i}")),
        };
        bits = (bits << 6) | u32::from(sextet);
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            out.push((bits >> nbits) as u8);
            bits &= (1 << nbits) - 1;
        }
    }
    Ok(out)
}

/// Installs Debian's Chromium if this machine has none
/// (`scripts/chromium.sh`).
pub fn install_chromium() {
    let script =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/chromium.sh");
    let status = tokio::task::block_in_place(|| std::process::Command::new(&script).status());
    assert!(status.unwrap().success(), "{} failed", script.display());
}

/// The link `mneme ui --print-url --as NAME` prints for the daemon on
/// `world`'s data directory (a one-time sign-in; the token stays out of it).
pub async fn sign_in_link(world: &crate::World, name: &str) -> String {
    let out = world
        .mneme()
        .env("MNEME_TOKEN", crate::daemon::TOKEN)
        .args(["ui", "--print-url", "--as", name])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", crate::stderr(&out));
    let url = crate::stdout(&out).trim().to_string();
    assert!(url.contains("/ui/login?code="), "{url}");
    assert!(
        !url.contains(crate::daemon::TOKEN),
        "the token stays out of the link"
    );
    url
}

/// A browser with a page signed in as `name` to the daemon on `world`'s
/// data directory, showing its sessions (`wait` at most). Needs a
/// multi-threaded runtime: the browser's steps block.
pub async fn signed_in_page(world: &crate::World, name: &str, wait: Duration) -> (Browser, Page) {
    let link = sign_in_link(world, name).await;
    install_chromium();
    let signed_in = || -> Result<(Browser, Page), String> {
        let browser = Browser::start()?;
        let page = browser.new_page()?;
        page.goto(&link)?;
        page.wait_for("document.getElementById('sessions')", wait)?;
        Ok((browser, page))
    };
    tokio::task::block_in_place(signed_in).unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_every_padding() {
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("Zg==").unwrap(), b"f");
        assert_eq!(base64_decode("Zm8=").unwrap(), b"fo");
        assert_eq!(base64_decode("Zm9v").unwrap(), b"foo");
        assert_eq!(base64_decode("iVBORw0KGgo=").unwrap(), b"\x89PNG\r\n\x1a\n");
        assert_eq!(base64_decode("+/+/").unwrap(), [0xfb, 0xff, 0xbf]);
        assert!(base64_decode("Zm9v!").is_err());
    }

    #[test]
    fn truthiness_follows_javascript() {
        for falsy in [json!(null), json!(false), json!(0), json!(0.0), json!("")] {
            assert!(!truthy(&falsy), "{falsy}");
        }
        for true_ in [json!(true), json!(1), json!("0"), json!([]), json!({})] {
            assert!(truthy(&true_), "{true_}");
        }
    }
}
