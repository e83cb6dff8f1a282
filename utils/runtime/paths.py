"""Where chatrlhf keeps what it builds once and reuses: the built-in data, the tiny model, converted models."""
import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache root: `$CHATRLHF_CACHE`, else `~/.cache/chatrlhf`. Created on first use."""
    root = Path(os.environ.get("CHATRLHF_CACHE") or Path.home() / ".cache" / "chatrlhf")
    root.mkdir(parents=True, exist_ok=True)
    return root


def build_once(target, build):
    """Make the folder `target` with `build(tmp_dir)` unless it already exists, and return it as a Path.

    The folder is built under a temporary name beside it and renamed when complete, so a crash never leaves a
    half-built folder behind; a file lock lets concurrent processes (two ranks, two runs) build it once.
    """
    import fcntl
    import shutil

    target = Path(target)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir():
            return target
        tmp = make_temp_dir_beside(target)
        try:
            build(tmp)
            replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_file_atomic(path, write, mode="w"):
    """Write the file `path` through `write(f)` on a hidden temporary file beside it (`.<name>.<pid>.tmp`), then
    rename it into place: a reader sees the old file or the whole new one, never part of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode) as f:
            write(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def replace_dir(tmp, target):
    """Rename the finished folder `tmp` to `target`. An existing `target` is first moved into a temporary folder
    beside it and deleted after, so `target` is missing only between two renames, never half-written."""
    import shutil

    tmp, target = Path(tmp), Path(target)
    if not target.exists():
        os.replace(tmp, target)
        return
    old = make_temp_dir_beside(target)
    os.replace(target, old / target.name)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def make_temp_dir_beside(target):
    """An empty hidden folder next to `target` (same file system, so a rename moves it into place), with the
    permissions a plain mkdir would give it (mkdtemp alone makes it private to the owner)."""
    import tempfile

    target = Path(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    os.chmod(tmp, 0o777 & ~current_umask())
    return tmp


def current_umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def honour_umask(path):
    """Give the file `path` the permissions a plain open() would (0666 less the umask): safetensors writes its
    files private to the owner (0600), which a server under another user could not read."""
    os.chmod(path, 0o666 & ~current_umask())


class FolderLock:
    """An exclusive lock on a folder for one process: a file lock on `.<name>.lock` beside the folder, holding
    the holder's PID. The kernel drops a file lock however its process ends (even SIGKILL), so a lock is never
    stale; the file itself is deleted on release, and a file left by a killed process is simply locked anew.

        lock = FolderLock(folder)
        if not lock.acquire():
            print("in use by PID", lock.holder())
    """

    def __init__(self, folder):
        folder = Path(folder).resolve()
        self.path = folder.parent / f".{folder.name}.lock"
        self.fd = None

    def acquire(self):
        """Take the lock without waiting; False if another process holds it."""
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            # The holder may have deleted the file between our open and our lock: then lock the new file.
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    def holder(self):
        """The PID written by the process holding the lock ("unknown" if it has not written it yet)."""
        try:
            return self.path.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self):
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None
