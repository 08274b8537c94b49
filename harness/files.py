"""Safe file writing: a file is replaced whole, never written through a link, a hard link or a FIFO.

    with replaced_file(path) as f:    # written beside path, flushed, renamed over it: a kill leaves the old file
        f.write(text)
    fd = open_nofollow(path, flags)   # an append or a lock: a regular file with one name, else a RunError naming it

Problems a user can act on raise RunError: one line that names the file and what to do (exit 1). No
torch here.
"""
import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile


class RunError(Exception):
    """A one-line problem with the run's files (train.py prints it and exits with code 1)."""


def refuse_link(path, elsewhere="use another --output-dir"):
    """path, unless it is a symbolic link: then a RunError naming it (whatever it points to stays as it is).
    elsewhere: how the tool is told to write elsewhere ("" for one that cannot be)."""
    if os.path.islink(path):
        raise RunError(f"{path} is a link (to {os.readlink(path)}); a run never writes through a link in its folder: "
                       "remove the link" + (f", or {elsewhere}" if elsewhere else ""))
    return path


def what_is(path, status=None):
    """What stands at path, as a refusal says it: "a link (to ...)", "a FIFO (named pipe)", "a directory",
    "a character device", "a block device", "a socket", "a hard link (one of N names of a file)" or "a file";
    None when nothing does. status: its os.lstat (or an open descriptor's os.fstat), else read here."""
    try:
        status = status or os.lstat(path)
    except FileNotFoundError:
        return None
    mode = status.st_mode
    if stat.S_ISLNK(mode):
        return f"a link (to {os.readlink(path)})"
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR,
             "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), None)
    if kind is None and status.st_nlink > 1:
        return f"a hard link (one of {status.st_nlink} names of a file)"
    return kind or ("a file" if stat.S_ISREG(mode) else "not a regular file")


PSEUDO_DEVICES = {os.stat(folder).st_dev for folder in ("/proc", "/sys") if os.path.isdir(folder)}


def not_data(path, status=None):
    """What path is, links followed, when it is no regular file to read: a FIFO or device (they
    block), a folder, "a file of /proc or /sys" (endless: /proc/self/pagemap); None for a regular
    file or nothing. status: an open descriptor's os.fstat, else os.stat(path)."""
    try:
        status = status or os.stat(path)
    except OSError:
        return None
    if stat.S_ISREG(status.st_mode):
        return "a file of /proc or /sys" if status.st_dev in PSEUDO_DEVICES else None
    return what_is(path, status)


def open_data(path):
    """open(path, "rb") of a regular file (links followed), never blocking: anything else
    (not_data) is a RunError naming it, and is never read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens without a writer
    kind = not_data(path, os.fstat(fd))
    if kind:
        os.close(fd)
        raise RunError(f"{path} is {kind}, where this program reads a file; it reads only "
                       "regular files")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def refuse_unless_file(path, status=None, *, links=False):
    """path, when nothing stands there or a regular file with one name; links=True: a symbolic link
    too (a rename replaces the link, never its target). Anything else (a hard link, FIFO, device,
    folder) is a RunError naming it."""
    kind = what_is(path, status)
    if kind in (None, "a file") or (links and kind.startswith("a link")):
        return path
    raise RunError(f"{path} is {kind}, where this program writes a file of its own; it never writes through "
                   "one: move it away")


def open_nofollow(path, flags, mode=0o644):
    """os.open of a regular file with one name, never following a link nor blocking (O_NOFOLLOW | O_NONBLOCK, then
    fstat; add O_EXCL for a new file): a link, hard link, FIFO, device or folder at path is a RunError naming it,
    and nothing it points to is opened, read or written."""
    refuse_unless_file(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as error:  # planted since the check above: a link (ELOOP), a folder, a FIFO without reader
        if error.errno in (errno.ELOOP, errno.EEXIST, errno.EISDIR, errno.ENXIO, errno.ENOTDIR):
            refuse_unless_file(path)
        raise
    try:
        refuse_unless_file(path, os.fstat(fd))  # what was opened, whatever stands at path now
    except RunError:
        os.close(fd)
        raise
    return fd


TEMPORARY = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)-\w+")  # replaced_file's .NAME.tmp-PID-XXXXXXXX


def remove_stale_temporaries(path):
    """Remove what a killed writer of path left beside it: a .NAME.tmp-PID-XXXXXXXX whose process is gone (a
    folder of that name stays)."""
    folder, name = os.path.split(path)
    for entry in os.listdir(folder or "."):
        match = TEMPORARY.fullmatch(entry)
        if not match or match.group("name") != name:
            continue
        pid, leftover = int(match.group("pid")), os.path.join(folder, entry)
        if process_alive(pid) or os.path.isdir(leftover) and not os.path.islink(leftover):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.remove(leftover)


def process_alive(pid):
    """Whether a process with this PID exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@contextlib.contextmanager
def replaced_file(path, mode="w", *, tmp=None):
    """A file object whose contents replace path once the block ends: written to a new file beside
    it (tmp, else .NAME.tmp-PID-XXXXXXXX; O_EXCL | O_NOFOLLOW), flushed and renamed over path
    (keeping its mode), so a kill leaves the old file whole. What refuse_unless_file(links=True)
    refuses at path is a RunError before anything is written. Other OSErrors are the caller's to
    word."""
    refuse_unless_file(path, links=True)
    folder, name = os.path.split(path)
    if tmp is None:
        remove_stale_temporaries(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.tmp-{os.getpid()}-", dir=folder or ".")
    else:
        if what_is(tmp) == "a file":
            os.remove(tmp)  # what a kill mid-write left
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        os.fchmod(fd, stat.S_IMODE(os.lstat(path).st_mode) if what_is(path) == "a file" else 0o644)  # its mode kept
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": ""})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        refuse_unless_file(path, links=True)  # planted meanwhile: still never replaced
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


DISK_NEARLY_FULL = 16 * 2**20  # bytes free below which a writer's own error (not an OSError) is taken as ENOSPC


def as_disk_full(error, folder):
    """error, or for an error that is not an OSError (torch.save's "[enforce fail at inline_container.cc:672] ...
    unexpected pos", safetensors' own) while folder's disk has under DISK_NEARLY_FULL bytes free, an OSError ENOSPC
    "disk full" that write_failed words as such. Any other error stays as it is (a bug keeps its own words)."""
    if isinstance(error, OSError):
        return error
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return error
    return OSError(errno.ENOSPC, f"disk full ({free} bytes free)") if free < DISK_NEARLY_FULL else error


def write_failed(what, error, *, otherwise="; use another --output-dir", elsewhere="use another --output-dir"):
    """"could not write WHAT: its cause; what to do" for a failed write: the OS's message (else the error's first
    line, else its type), then the remedy its cause calls for (`otherwise` when the cause is not the disk's).
    elsewhere: how the tool writing WHAT is told to write elsewhere ("" for a tool that cannot be)."""
    cause = getattr(error, "strerror", None) or (str(error).strip().splitlines() or [type(error).__name__])[0]
    code = getattr(error, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        remedy = "; free some disk space" + (f" or {elsewhere}" if elsewhere else "")
    elif code in (errno.EROFS, errno.EACCES, errno.EPERM):
        remedy = "; the folder is not writable" + (f": {elsewhere}" if elsewhere else "")
    else:
        remedy = otherwise
    return f"could not write {what}: {cause}{remedy}"
