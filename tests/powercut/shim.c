/*
 * A power-cut model for the end-to-end tests (tests/src/powercut.rs).
 *
 * Loaded into `mneme` with LD_PRELOAD. Active only when MNEME_POWERCUT is
 * set, and only for files under one data directory: MNEME_POWERCUT_ROOT if
 * set, else the `--data-dir` argument of the process (from /proc/self/cmdline).
 * The journal is MNEME_POWERCUT_JOURNAL if set, else `<root>.powercut`.
 *
 * Before each change to a file under the root it appends an UNDO record to
 * the journal (the bytes and the size the change is about to overwrite), then
 * makes the change; after an fsync/fdatasync it appends a SYNC record for the
 * file (or a DIRSYNC for a directory). Creating, renaming and unlinking are
 * journalled too, with what they replace, so that the harness can undo every
 * change no sync covered (a power cut), once the process is dead. What is
 * durable (the semantics of LazyFS, stricter than ext4):
 *   - a write or truncation: once fsync/fdatasync of the same file (any fd,
 *     any process) returned after it; sync_file_range promises nothing;
 *   - a file's creation, a rename, an unlink: once fsync of the parent
 *     directory (of both, for a rename) returned after it;
 *   - sync()/syncfs(): everything before it.
 * A write through an O_SYNC/O_DSYNC fd is durable when it returns.
 * The harness decides what a cut keeps: every unsynced change lost
 * (LazyFS), or per file a random number of its oldest unsynced writes kept,
 * the next one torn at a 512-byte sector boundary (powercut::cut_with).
 * Not modelled: directories' own creation (mkdir is taken as durable), a
 * rename into or out of the root (taken as durable), unsynced writes kept
 * out of their order within one file, a file whose size survives but not
 * its data (zeros), mmap'ed writes, hard links, and changes made by a
 * process without the shim.
 *
 * The journal is written with the real write(2): it models the disk, and it
 * survives the SIGKILL of the process through the page cache.
 *
 * Every change is journalled before it is made (a failed call is followed by
 * a CANCEL record), so that a process that dies between the two (SIGKILLed,
 * or exiting at a crash point on another thread) leaves at most its last
 * record unmade: the harness checks the files for whether it was made, and
 * ignores a last record cut short.
 *
 * Record layout (little endian): u8 type, u64 off, u64 size, u64 len,
 * u32 path_len, path, u32 path2_len, path2, u64 data_len, data.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum {
    REC_WRITE = 1,   /* off, size = old size, len = bytes written; data = old bytes */
    REC_TRUNC = 2,   /* off = new size, size = old size; data = old bytes past new size */
    REC_SYNC = 3,    /* path: a file */
    REC_DIRSYNC = 4, /* path: a directory */
    REC_CREATE = 5,  /* path */
    REC_RENAME = 6,  /* path -> path2; size = 1 if path2 existed, data = its bytes */
    REC_UNLINK = 7,  /* path; data = its bytes */
    REC_SYNCALL = 8,
    REC_CANCEL = 9,  /* the record before it: its call failed, nothing changed */
};

static pthread_mutex_t lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static int state; /* 0: not initialised, 1: active, 2: inactive */
static char root[PATH_MAX];
static size_t root_len;
static int journal = -1;

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off64_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t (*real_pwritev64)(int, const struct iovec *, int, off64_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off64_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static void (*real_sync)(void);
static int (*real_syncfs)(int);
static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);

#define RESOLVE(name) real_##name = dlsym(RTLD_NEXT, #name)

static void die(const char *what) {
    char msg[256];
    int n = snprintf(msg, sizeof msg, "powercut shim: %s: %s\n", what, strerror(errno));
    if (real_write)
        real_write(2, msg, (size_t)n);
    abort();
}

static void resolve_all(void) {
    RESOLVE(write); RESOLVE(pwrite); RESOLVE(pwrite64); RESOLVE(writev);
    RESOLVE(pwritev); RESOLVE(pwritev64); RESOLVE(ftruncate); RESOLVE(ftruncate64);
    RESOLVE(fsync); RESOLVE(fdatasync); RESOLVE(sync); RESOLVE(syncfs);
    RESOLVE(open); RESOLVE(open64); RESOLVE(openat); RESOLVE(openat64);
    RESOLVE(rename); RESOLVE(renameat); RESOLVE(renameat2);
    RESOLVE(unlink); RESOLVE(unlinkat);
}

/* Resolves `path` (absolute) with realpath on its parent: the file itself
 * need not exist. Returns 0 on success. */
static int canonical(const char *path, char *out) {
    char parent[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        return -1;
    size_t n = (size_t)(slash - path);
    if (n == 0)
        n = 1;
    if (n >= sizeof parent)
        return -1;
    memcpy(parent, path, n);
    parent[n] = 0;
    char real[PATH_MAX];
    if (!realpath(parent, real))
        return -1;
    const char *base = slash + 1;
    if (*base == 0) {
        strcpy(out, real);
        return 0;
    }
    if (strlen(real) + 1 + strlen(base) + 1 > PATH_MAX)
        return -1;
    if (strcmp(real, "/") == 0)
        snprintf(out, PATH_MAX, "/%s", base);
    else
        snprintf(out, PATH_MAX, "%s/%s", real, base);
    return 0;
}

static void init(void) {
    if (state)
        return;
    resolve_all();
    state = 2;
    if (!getenv("MNEME_POWERCUT"))
        return;
    const char *r = getenv("MNEME_POWERCUT_ROOT");
    char from_args[PATH_MAX] = {0};
    if (!r) {
        /* The --data-dir argument. */
        int fd = real_open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return;
        static char buf[65536];
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0)
            return;
        buf[n] = 0;
        for (char *a = buf; a < buf + n; a += strlen(a) + 1) {
            if (strcmp(a, "--data-dir") == 0 && a + strlen(a) + 1 < buf + n) {
                snprintf(from_args, sizeof from_args, "%s", a + strlen(a) + 1);
                break;
            }
            if (strncmp(a, "--data-dir=", 11) == 0) {
                snprintf(from_args, sizeof from_args, "%s", a + 11);
                break;
            }
        }
        if (!from_args[0])
            return;
        r = from_args;
    }
    char abs[PATH_MAX];
    if (r[0] != '/') {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
            return;
        snprintf(abs, sizeof abs, "%s/%s", cwd, r);
    } else {
        snprintf(abs, sizeof abs, "%s", r);
    }
    while (strlen(abs) > 1 && abs[strlen(abs) - 1] == '/')
        abs[strlen(abs) - 1] = 0;
    if (canonical(abs, root) != 0)
        return;
    root_len = strlen(root);
    char jpath[PATH_MAX];
    const char *j = getenv("MNEME_POWERCUT_JOURNAL");
    if (j)
        snprintf(jpath, sizeof jpath, "%s", j);
    else
        snprintf(jpath, sizeof jpath, "%s.powercut", root);
    journal = real_open(jpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (journal < 0)
        die("opening the journal");
    state = 1;
}

/* A child forked while another thread held the lock must not inherit it
 * held. */
static void child_after_fork(void) {
    pthread_mutex_t fresh = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
    memcpy(&lock, &fresh, sizeof lock);
}

__attribute__((constructor)) static void shim_init(void) {
    pthread_atfork(NULL, NULL, child_after_fork);
    pthread_mutex_lock(&lock);
    init();
    pthread_mutex_unlock(&lock);
}

static int under_root(const char *path) {
    return strncmp(path, root, root_len) == 0 && (path[root_len] == '/' || path[root_len] == 0);
}

/* The path of an open fd, if it is a regular file (or, with dirs, a
 * directory) under the root. */
static int fd_path(int fd, char *out, int dirs) {
    if (state != 1 || fd < 0 || fd == journal)
        return 0;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return 0;
    if (!S_ISREG(st.st_mode) && !(dirs && S_ISDIR(st.st_mode)))
        return 0;
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, PATH_MAX - 1);
    if (n <= 0)
        return 0;
    out[n] = 0;
    return under_root(out);
}

/* The absolute, canonical path of `path` relative to `dirfd`, if it is under
 * the root. */
static int at_path(int dirfd, const char *path, char *out) {
    if (state != 1 || !path)
        return 0;
    char abs[PATH_MAX];
    if (path[0] == '/') {
        snprintf(abs, sizeof abs, "%s", path);
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) {
            if (!getcwd(base, sizeof base))
                return 0;
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t n = readlink(link, base, sizeof base - 1);
            if (n <= 0)
                return 0;
            base[n] = 0;
        }
        snprintf(abs, sizeof abs, "%s/%s", base, path);
    }
    if (canonical(abs, out) != 0)
        return 0;
    return under_root(out);
}

struct buf {
    char *p;
    size_t len, cap;
};

static void put(struct buf *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p)
            die("out of memory");
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put32(struct buf *b, uint32_t v) { put(b, &v, 4); }

/* Appends one record with one write(2). */
static void record(int type, uint64_t off, uint64_t size, uint64_t len, const char *path,
                   const char *path2, const void *data, size_t data_len) {
    struct buf b = {0};
    uint8_t t = (uint8_t)type;
    put(&b, &t, 1);
    put64(&b, off);
    put64(&b, size);
    put64(&b, len);
    size_t pl = path ? strlen(path) : 0, p2l = path2 ? strlen(path2) : 0;
    put32(&b, (uint32_t)pl);
    put(&b, path, pl);
    put32(&b, (uint32_t)p2l);
    put(&b, path2, p2l);
    put64(&b, data_len);
    put(&b, data, data_len);
    size_t done = 0;
    while (done < b.len) {
        ssize_t n = real_write(journal, b.p + done, b.len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die("writing the journal");
        done += (size_t)n;
    }
    free(b.p);
}

/* Reads `n` bytes of `path` at `off` (fewer at its end) into a new buffer. */
static char *read_range(const char *path, uint64_t off, uint64_t n, size_t *got) {
    *got = 0;
    if (n == 0)
        return NULL;
    int fd = real_open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *p = malloc(n);
    if (!p)
        die("out of memory");
    while (*got < n) {
        ssize_t r = pread(fd, p + *got, n - *got, (off_t)(off + *got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        *got += (size_t)r;
    }
    close(fd);
    return p;
}

static int64_t size_of(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return -1;
    return st.st_size;
}

/* The undo record for writing `len` bytes at `off` of `path`. */
static void before_write(const char *path, uint64_t off, uint64_t len) {
    int64_t size = size_of(path);
    if (size < 0)
        size = 0;
    uint64_t keep = 0;
    if (off < (uint64_t)size)
        keep = ((uint64_t)size - off) < len ? (uint64_t)size - off : len;
    size_t got;
    char *old = read_range(path, off, keep, &got);
    record(REC_WRITE, off, (uint64_t)size, len, path, NULL, old, got);
    free(old);
}

/* The undo record for cutting or growing `path` to `new_size`. */
static void before_truncate(const char *path, uint64_t new_size) {
    int64_t size = size_of(path);
    if (size < 0)
        return;
    size_t got = 0;
    char *old = NULL;
    if ((uint64_t)size > new_size)
        old = read_range(path, new_size, (uint64_t)size - new_size, &got);
    record(REC_TRUNC, new_size, (uint64_t)size, 0, path, NULL, old, got);
    free(old);
}

/* The offset a write(2) on fd writes at. */
static uint64_t current_offset(int fd, const char *path) {
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0 && (flags & O_APPEND)) {
        int64_t size = size_of(path);
        return size < 0 ? 0 : (uint64_t)size;
    }
    off_t at = lseek(fd, 0, SEEK_CUR);
    return at < 0 ? 0 : (uint64_t)at;
}

static size_t iov_len(const struct iovec *iov, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += iov[i].iov_len;
    return total;
}

/* After a write through an O_SYNC or O_DSYNC fd: it is durable already. */
static void after_write(int fd, const char *path, ssize_t r) {
    int flags = fcntl(fd, F_GETFL);
    if (r >= 0 && flags >= 0 && (flags & (O_SYNC | O_DSYNC)))
        record(REC_SYNC, 0, 0, 0, path, NULL, NULL, 0);
}

#define ENTER()                                                                         \
    pthread_mutex_lock(&lock);                                                                     \
    init();

#define LEAVE() pthread_mutex_unlock(&lock)

/* One write-like call on `fd`: journals what the bytes at `offset` (an
 * expression that may use `path_`, the file's path) held before `len`
 * bytes go there, makes the call, notes what it wrote, and returns its
 * result with its errno. */
#define JOURNALED_WRITE(fd, offset, len, call)                                          \
    do {                                                                                \
        ENTER();                                                                        \
        char path_[PATH_MAX];                                                           \
        int tracked_ = fd_path((fd), path_, 0);                                         \
        if (tracked_)                                                                   \
            before_write(path_, (offset), (len));                                       \
        ssize_t r_ = (call);                                                            \
        int e_ = errno;                                                                 \
        if (tracked_)                                                                   \
            after_write((fd), path_, r_);                                               \
        LEAVE();                                                                        \
        errno = e_;                                                                     \
        return r_;                                                                      \
    } while (0)

ssize_t write(int fd, const void *data, size_t n) {
    JOURNALED_WRITE(fd, current_offset(fd, path_), n, real_write(fd, data, n));
}

ssize_t pwrite(int fd, const void *data, size_t n, off_t off) {
    JOURNALED_WRITE(fd, (uint64_t)off, n, real_pwrite(fd, data, n, off));
}

ssize_t pwrite64(int fd, const void *data, size_t n, off64_t off) {
    JOURNALED_WRITE(fd, (uint64_t)off, n, real_pwrite64(fd, data, n, off));
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    JOURNALED_WRITE(fd, current_offset(fd, path_), iov_len(iov, cnt), real_writev(fd, iov, cnt));
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    JOURNALED_WRITE(fd, (uint64_t)off, iov_len(iov, cnt), real_pwritev(fd, iov, cnt, off));
}

ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t off) {
    JOURNALED_WRITE(fd, (uint64_t)off, iov_len(iov, cnt), real_pwritev64(fd, iov, cnt, off));
}

int ftruncate(int fd, off_t len) {
    ENTER();
    char path[PATH_MAX];
    if (fd_path(fd, path, 0))
        before_truncate(path, (uint64_t)len);
    int r = real_ftruncate(fd, len);
    int e = errno;
    LEAVE();
    errno = e;
    return r;
}

int ftruncate64(int fd, off64_t len) {
    ENTER();
    char path[PATH_MAX];
    if (fd_path(fd, path, 0))
        before_truncate(path, (uint64_t)len);
    int r = real_ftruncate64(fd, len);
    int e = errno;
    LEAVE();
    errno = e;
    return r;
}

static int synced(int fd, int r) {
    char path[PATH_MAX];
    if (r == 0 && fd_path(fd, path, 1)) {
        struct stat st;
        int dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
        record(dir ? REC_DIRSYNC : REC_SYNC, 0, 0, 0, path, NULL, NULL, 0);
    }
    return r;
}

int fsync(int fd) {
    ENTER();
    int r = real_fsync(fd);
    int e = errno;
    synced(fd, r);
    LEAVE();
    errno = e;
    return r;
}

int fdatasync(int fd) {
    ENTER();
    int r = real_fdatasync(fd);
    int e = errno;
    synced(fd, r);
    LEAVE();
    errno = e;
    return r;
}

void sync(void) {
    ENTER();
    real_sync();
    if (state == 1)
        record(REC_SYNCALL, 0, 0, 0, NULL, NULL, NULL, 0);
    LEAVE();
}

int syncfs(int fd) {
    ENTER();
    int r = real_syncfs(fd);
    int e = errno;
    if (r == 0 && state == 1)
        record(REC_SYNCALL, 0, 0, 0, NULL, NULL, NULL, 0);
    LEAVE();
    errno = e;
    return r;
}

/* Opening: a creation, or a truncation by O_TRUNC, is journalled first. */
static int opened(int dirfd, const char *path, int flags, mode_t mode, int which) {
    char full[PATH_MAX];
    int tracked = (flags & (O_CREAT | O_TRUNC)) && at_path(dirfd, path, full);
    int existed = 0;
    if (tracked) {
        struct stat st;
        existed = stat(full, &st) == 0;
        if (existed && S_ISREG(st.st_mode) && (flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY)
            before_truncate(full, 0);
    }
    int creating = tracked && !existed;
    if (creating)
        record(REC_CREATE, 0, 0, 0, full, NULL, NULL, 0);
    int fd;
    switch (which) {
    case 0: fd = real_open(path, flags, mode); break;
    case 1: fd = real_open64(path, flags, mode); break;
    case 2: fd = real_openat(dirfd, path, flags, mode); break;
    default: fd = real_openat64(dirfd, path, flags, mode); break;
    }
    int e = errno;
    if (fd < 0 && creating)
        record(REC_CANCEL, 0, 0, 0, NULL, NULL, NULL, 0);
    errno = e;
    return fd;
}

#define OPEN_BODY(dirfd, which)                                                                    \
    mode_t mode = 0;                                                                               \
    if (flags & (O_CREAT | O_TMPFILE)) {                                                           \
        va_list ap;                                                                                \
        va_start(ap, flags);                                                                       \
        mode = va_arg(ap, mode_t);                                                                 \
        va_end(ap);                                                                                \
    }                                                                                              \
    ENTER();                                                                                       \
    int fd = opened(dirfd, path, flags, mode, which);                                              \
    int e = errno;                                                                                 \
    LEAVE();                                                                                       \
    errno = e;                                                                                     \
    return fd;

int open(const char *path, int flags, ...) { OPEN_BODY(AT_FDCWD, 0) }
int open64(const char *path, int flags, ...) { OPEN_BODY(AT_FDCWD, 1) }
int openat(int dirfd, const char *path, int flags, ...) { OPEN_BODY(dirfd, 2) }
int openat64(int dirfd, const char *path, int flags, ...) { OPEN_BODY(dirfd, 3) }

int creat(const char *path, mode_t mode) {
    return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

int creat64(const char *path, mode_t mode) {
    return open64(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

/* A rename keeps what it replaces, so that the harness can put it back. */
static int renamed(int olddir, const char *from, int newdir, const char *to, unsigned flags,
                   int which) {
    char a[PATH_MAX], b[PATH_MAX];
    int ta = at_path(olddir, from, a), tb = at_path(newdir, to, b);
    int tracked = ta && tb;
    char *old = NULL;
    size_t got = 0;
    int existed = 0;
    if (tracked) {
        int64_t size = size_of(b);
        existed = size >= 0;
        if (size > 0)
            old = read_range(b, 0, (uint64_t)size, &got);
    }
    if (tracked)
        record(REC_RENAME, 0, existed, 0, a, b, old, got);
    free(old);
    int r;
    switch (which) {
    case 0: r = real_rename(from, to); break;
    case 1: r = real_renameat(olddir, from, newdir, to); break;
    default: r = real_renameat2(olddir, from, newdir, to, flags); break;
    }
    int e = errno;
    if (r != 0 && tracked)
        record(REC_CANCEL, 0, 0, 0, NULL, NULL, NULL, 0);
    /* A rename into or out of the root is, seen from the root, a creation or
     * an unlink, taken as durable (not modelled). */
    errno = e;
    return r;
}

int rename(const char *from, const char *to) {
    ENTER();
    int r = renamed(AT_FDCWD, from, AT_FDCWD, to, 0, 0);
    int e = errno;
    LEAVE();
    errno = e;
    return r;
}

int renameat(int olddir, const char *from, int newdir, const char *to) {
    ENTER();
    int r = renamed(olddir, from, newdir, to, 0, 1);
    int e = errno;
    LEAVE();
    errno = e;
    return r;
}

int renameat2(int olddir, const char *from, int newdir, const char *to, unsigned flags) {
    ENTER();
    int r = renamed(olddir, from, newdir, to, flags, 2);
    int e = errno;
    LEAVE();
    errno = e;
    return r;
}

static int unlinked(int dirfd, const char *path, int flags, int which) {
    char full[PATH_MAX];
    char *old = NULL;
    size_t got = 0;
    int tracked = !(flags & AT_REMOVEDIR) && at_path(dirfd, path, full) && size_of(full) >= 0;
    if (tracked) {
        int64_t size = size_of(full);
        if (size > 0)
            old = read_range(full, 0, (uint64_t)size, &got);
    }
    if (tracked)
        record(REC_UNLINK, 0, 0, 0, full, NULL, old, got);
    free(old);
    int r = which == 0 ? real_unlink(path) : real_unlinkat(dirfd, path, flags);
    int e = errno;
    if (r != 0 && tracked)
        record(REC_CANCEL, 0, 0, 0, NULL, NULL, NULL, 0);
    errno = e;
    return r;
}

int unlink(const char *path) {
    ENTER();
    int r = unlinked(AT_FDCWD, path, 0, 0);
    int e = errno;
    LEAVE();
    errno = e;
    return r;
}

int unlinkat(int dirfd, const char *path, int flags) {
    ENTER();
    int r = unlinked(dirfd, path, flags, 1);
    int e = errno;
    LEAVE();
    errno = e;
    return r;
}
