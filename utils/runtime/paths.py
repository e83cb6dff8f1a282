"""Where chatrlhf keeps what it builds once and reuses (the built-in data, the tiny model, converted models), how it
writes files and folders atomically, and how a run claims the folder it writes (`claim_folder`)."""
import os
import re
import shutil
from pathlib import Path

from utils.runtime.errors import ConfigError, on_exit

# Left by an interrupted write: make_temp_dir_beside's `.<name>.<8 characters>.tmp`, write_file_atomic's
# `.<name>.<pid>.tmp`, and `.<name>.old` (a model folder swapped by an earlier version).
TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?:[a-z0-9_]{8}\.tmp|old|\d+\.tmp)")
NAME_MAX = 255
"""The longest file name (in bytes) most file systems take."""
NAME_MARGIN = 26
"""What the temporary names a save makes from an output's name add to it: make_temp_dir_beside's `.<name>.<8
characters>.tmp` 14, write_file_atomic's `.<name>.<pid>.tmp` at most 13, and the folder a save that failed writes
the model into instead, `chatrlhf-unsaved-<name>-<8 characters>` (utils/model/save.py), 26."""


def cache_dir() -> Path:
    """The cache root: `$CHATRLHF_CACHE`, else `~/.cache/chatrlhf`. Created on first use."""
    given = os.environ.get("CHATRLHF_CACHE")
    if given and not given.strip():  # as a name, a folder of blanks in the working folder
        raise ConfigError(f"CHATRLHF_CACHE={given!r} is blank: name the cache folder, or unset it")
    root = Path(given).expanduser() if given else Path.home() / ".cache" / "chatrlhf"  # "~/x": no shell expanded it
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file there, a read-only parent
        where = f"CHATRLHF_CACHE={given}" if given else f"the cache folder {root} (set CHATRLHF_CACHE)"
        raise ConfigError(f"{where}: cannot make the folder ({err.strerror})") from None
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


# ---- the folder a run writes -------------------------------------------------------------------------------------


def claim_folder(out, flag="--output_dir", inputs=None, model_dirs=None, files=None, scratch=()):
    """Claim the folder `out` a run writes, before any data or model is loaded (ConfigError naming `flag` if it
    cannot be had), so that nothing fails late or does harm:

    - no input (`inputs`: {flag: path}, or (flag, path) pairs) is written over: a folder the run saves a model
      into (`model_dirs`, replaced whole; default `out` itself), a file it writes (`files`, paths in `out`), or
      the folder holding such a file (a data folder whose train.jsonl the run would replace);
    - `out` is, or can be made, a folder this process can write in (a file is created there and deleted);
    - no other run writes it at the same time: an exclusive FolderLock, held until this process's `cli_entry` main
      ends, naming its PID. Folders made here are removed at the end if the run left them empty, or holding only
      `scratch` files (names of files it writes as it goes, such as its monitor's history, that keep nothing).
    Every tool that writes an output folder claims it so (the training steps through
    utils.trainer.checkpoint.claim_output_dir, which adds their checkpoints' rules).
    """
    out = Path(out)
    for path in [out, *(model_dirs or ()), *(files or ())]:
        check_output_path(flag, path)
    written = [(Path(path), False) for path in (model_dirs or ([] if files else [out]))]
    written += [(Path(path), True) for path in files or []]
    for input_flag, path in (inputs.items() if isinstance(inputs, dict) else inputs or ()):
        if not path or not Path(path).exists():
            continue
        source = Path(path).resolve()
        for target, is_file in written:
            target = target.resolve()
            if not is_file and source == target:
                harm = f"save the trained model into {input_flag} {path}, replacing the weights it starts from"
            elif is_file and source == target:
                harm = f"write its {target.name} over {input_flag} {path}"
            elif is_file and source == target.parent:
                harm = f"write {target.name} into {input_flag} {path}, replacing what the run reads there"
            else:
                continue
            raise ConfigError(f"{flag} {out} would {harm}; pick another {flag}")
    created = _make_dirs(out, flag)
    lock = FolderLock(out)
    if not lock.acquire():
        remove_if_empty(created)
        raise ConfigError(f"{flag} {out} is in use by another run (PID {lock.holder()}, holding {lock.path}); wait "
                          f"for it to end or pick another {flag}")
    on_exit(lambda: (lock.release(), remove_if_empty(created, scratch)))
    return lock


def delete_leftovers(out, *inside, say=print):
    """Delete the temporary folders and files an interrupted save left: `out`'s own beside it, and any in `out`
    and in the folders `inside`, saying so with `say`."""
    out = Path(out)
    for folder, name in ((out.resolve().parent, out.resolve().name), (out, None), *((Path(f), None) for f in inside)):
        for path in folder.iterdir() if folder.is_dir() else ():
            match = TEMPORARY.fullmatch(path.name)
            if match and (name is None or match.group("name") == name):
                say(f"deleting {path}, left by an interrupted save")
                shutil.rmtree(path) if path.is_dir() else path.unlink()


def probe_write(folder):
    """Make and remove a file in `folder`, raising the OSError if it cannot: what os.access cannot tell (root, a
    read-only mount, /sys)."""
    import tempfile

    tempfile.TemporaryFile(dir=folder).close()


def check_output_path(flag, path):
    """Refuse, before any work, an output path no save could finish in: a link that loops, or a name so long that
    the temporary names a save makes from it (NAME_MARGIN more) would pass NAME_MAX."""
    try:
        Path(path).resolve()
    except (OSError, RuntimeError):  # Python before 3.13: RuntimeError("Symlink loop from ...")
        raise ConfigError(f"{flag} {path}: a link that loops") from None
    length = len(os.fsencode(Path(path).resolve().name))
    if length > NAME_MAX - NAME_MARGIN:
        raise ConfigError(f"{flag} {path}: its name is {length} bytes long; at most {NAME_MAX - NAME_MARGIN} leave "
                          "room for the temporary names a save writes beside it")


def check_output_file(flag, path):
    """Refuse an output file whose folder does not exist or cannot be written, or that is a folder, before any
    work that would be lost at the end (a blank name is the parser's to refuse: utils.runtime.errors)."""
    if not path:
        return
    check_output_path(flag, path)
    parent = Path(path).resolve().parent
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"{flag} {path}: {parent} is a file, not a folder")
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: its folder {parent} does not exist")
    if Path(path).is_dir():
        raise ConfigError(f"{flag} {path} is a folder; name a file to write")
    try:
        probe_write(parent)
    except OSError as err:
        raise ConfigError(f"{flag} {path}: its folder {parent} cannot be written ({err.strerror})") from None


def _make_dirs(out, flag, named=None):
    """Create `out` (and missing parents) and check that a file can be written in it (probe_write); the folders
    created, deepest first. ConfigError naming `flag` and `named` (default: `out`) if not."""
    named = out if named is None else named
    missing = [path for path in [out, *out.parents] if not path.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe_write(out)
    except OSError as err:
        remove_if_empty(missing)
        if out.exists() and not out.is_dir():
            raise ConfigError(f"{flag} {named}: {out} is a file, not a folder" if named != out else
                              f"{flag} {out} is a file, not a folder") from None
        raise ConfigError(f"{flag} {named}: cannot write there ({err.strerror or err})") from None
    return missing


def remove_if_empty(folders, scratch=()):
    """Remove each folder in turn (deepest first) while it is empty, or holds only files named in `scratch`."""
    for folder in folders:
        try:
            entries = list(folder.iterdir())
            if all(entry.name in scratch and entry.is_file() for entry in entries):
                for entry in entries:
                    entry.unlink()
            folder.rmdir()
        except OSError:
            return


def check_writable_file(flag, path):
    """Refuse (ConfigError naming `flag`) an output file that is a folder or whose folder cannot be made or
    written, before the work whose result it keeps; the folders tried are removed again."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; name a file to write")
    remove_if_empty(_make_dirs(path.parent, flag, named=path))


def check_writable_folder(flag, path):
    """Refuse (ConfigError naming `flag`) an output folder that is a file or cannot be made or written, before the
    work it keeps; the folders made to try are removed again."""
    remove_if_empty(_make_dirs(Path(path), flag))


def check_not_an_input(flag, path, inputs):
    """Refuse (ConfigError) an output file `path` that is one of the `inputs` ({flag: path} or (flag, path)
    pairs) the run reads, or lies inside one that is a folder (a model's: its weights or config), before the run
    reads it."""
    if not path:
        return
    for input_flag, source in (inputs.items() if isinstance(inputs, dict) else inputs):
        if not source or not Path(source).exists():
            continue
        if Path(source).resolve() == Path(path).resolve():
            raise ConfigError(f"{flag} {path} would overwrite {input_flag} {source}; name another file")
        if Path(source).is_dir() and Path(path).resolve().is_relative_to(Path(source).resolve()):
            raise ConfigError(f"{flag} {path} is inside {input_flag} {source}, which the run reads; name a file "
                              "outside it")
