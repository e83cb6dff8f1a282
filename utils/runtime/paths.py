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
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def make_temp_dir_beside(target):
    """An empty hidden folder next to `target` (same file system, so a rename moves it into place), with the
    permissions a plain mkdir would give it (mkdtemp alone makes it private to the owner)."""
    import tempfile

    target = Path(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    return tmp
