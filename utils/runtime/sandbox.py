"""A sandbox for the actor's tool calls: Python code run in a separate process, cut off from the network and the
file system, under time, memory and output limits. A call that hangs, crashes or floods returns a failed
`ToolResult` (its answer earns what it earns); it never raises into the run.

Each call runs `python -I -S -c BOOTSTRAP` (isolated: no site-packages, no user site, no PYTHON* variables) in a
fresh temporary folder as its working directory, in a session (process group) of its own, with an empty
environment; the code comes on stdin, stdout and stderr go to files in the folder. The bootstrap, before the code
runs:

1. imports PRELOADED (the standard library a calculation needs);
2. leaves the network: unshare(CLONE_NEWNET), else unshare(CLONE_NEWUSER | CLONE_NEWNET) (a network namespace
   with no interface but a down loopback); `ToolResult.isolation` says which held;
3. as root, drops to the user `nobody` (then nothing outside the folder is writable, and RLIMIT_NPROC holds);
4. sets RLIMIT_AS (memory), RLIMIT_CPU (CPU seconds), RLIMIT_NPROC (no new process), RLIMIT_FSIZE (the largest
   file, stdout included), RLIMIT_NOFILE and RLIMIT_CORE (no core file);
5. installs an audit hook (sys.addaudithook, which cannot be removed) that refuses sockets, processes (fork,
   exec, spawn, subprocess, system, kill), imports of ctypes, gc and the process and socket modules, opening a
   file for writing outside the folder or reading one outside the folder and the Python installation, changing
   files or folders outside the folder, changing the working directory and opening a folder (the hook sees the
   paths of opens, never their `dir_fd`: without a folder's descriptor no `dir_fd=` path can reach past it).

The parent waits at most `timeout` seconds of wall-clock time, then kills the whole process group (and does so in
any case when the call ends); the output is cut to `output_limit` characters. tests/utils/runtime/test_sandbox.py
tries the escapes.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

PRELOADED = ("math", "cmath", "decimal", "fractions", "random", "statistics", "itertools", "functools",
             "collections", "re", "json", "string", "datetime", "heapq", "bisect", "operator")
"""The modules the code can import: loaded before the bootstrap drops its rights (after it, an import from the
installation may not be readable)."""
FILE_LIMIT = 1 << 20
"""RLIMIT_FSIZE: the largest file the code may write, its stdout and stderr included (bytes)."""
MAX_WRITTEN_FILES = 32
"""Files the code may open for writing in its folder, in all."""
OPEN_FILES = 64
NOBODY = 65534

BOOTSTRAP = r'''
import os, sys, resource
folder, memory, cpu, fsize, nofile = sys.argv[1], *map(int, sys.argv[2:6])
preload, max_written, hook = sys.argv[6], int(sys.argv[7]), sys.argv[8] == "1"
for name in preload.split(","):
    __import__(name)
import ctypes
isolation = []
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x40000000) == 0:
    isolation.append("netns")
elif os.getuid() != 0 and libc.unshare(0x10000000 | 0x40000000) == 0:
    isolation.append("userns+netns")
if os.getuid() == 0:
    try:
        os.setgroups([]); os.setgid(%(nobody)d); os.setuid(%(nobody)d)
        isolation.append("nobody")
    except OSError:
        pass
del ctypes, libc
for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_NPROC, 0),
                     (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0)):
    try:
        resource.setrlimit(limit, (value, value))
    except (ValueError, OSError):
        isolation.append("no-limit-%%d" %% limit)
code = sys.stdin.read()
sys.stdin.close()
sys.stderr.write("\x00isolation:" + ",".join(isolation) + "\n")
sys.stderr.flush()

def _hook(event, args, folder=os.path.realpath(folder) + os.sep,
          readable=tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}),
          realpath=os.path.realpath, isdir=os.path.isdir, fspath=os.fsdecode, written=[0], max_written=max_written,
          processes=frozenset(("os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                               "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn",
                               "os.startfile", "sys.remote_exec")),
          blocked_imports=frozenset(("ctypes", "_ctypes", "gc", "_posixsubprocess", "subprocess", "_socket",
                                     "socket", "ssl", "_ssl", "multiprocessing", "_multiprocessing", "mmap",
                                     "resource", "signal", "_signal", "pty", "fcntl", "select", "asyncio",
                                     "posix", "nt")),
          changes=frozenset(("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
                             "os.chmod", "os.chown", "os.truncate", "os.utime", "os.chflags", "os.lchflags",
                             "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.copyfile", "shutil.move"))):
    def inside(path, roots):
        if isinstance(path, int):
            return True
        return (realpath(fspath(path)) + "/").startswith(roots)

    if event.startswith("socket.") or event in processes:
        raise PermissionError("sandbox: %%s is not allowed" %% event)
    if event == "import" and args[0].split(".")[0] in blocked_imports:
        raise ImportError("sandbox: import of %%s is not allowed" %% args[0])
    if event == "os.chdir":  # relative paths are judged from the folder: the working directory stays there
        raise PermissionError("sandbox: changing the working folder is not allowed")
    if event == "open":
        path, mode, flags = args
        if path is None:
            return
        if not isinstance(path, int) and isdir(fspath(path)):  # a folder's descriptor would let dir_fd= paths,
            raise PermissionError("sandbox: opening a folder is not allowed")  # which this hook never sees, out
        writing = (any(c in (mode or "") for c in "wax+")
                   or (flags or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))
        if writing:
            if not inside(path, folder):
                raise PermissionError("sandbox: writing outside the working folder is not allowed")
            written[0] += 1
            if written[0] > max_written:
                raise PermissionError("sandbox: too many files written")
        elif not inside(path, (folder,) + readable):
            raise PermissionError("sandbox: reading outside the working folder is not allowed")
    if (event in ("os.listdir", "os.scandir") and args and args[0] is not None
            and not inside(args[0], (folder,) + readable)):
        raise PermissionError("sandbox: listing outside the working folder is not allowed")
    if event in changes:
        for path in args:
            if isinstance(path, (str, bytes, os.PathLike)) and not inside(path, folder):
                raise PermissionError("sandbox: %%s outside the working folder is not allowed" %% event)

for name in [name for name in sys.modules if name.split(".")[0] in ("ctypes", "_ctypes", "resource")]:
    del sys.modules[name]  # imported by the bootstrap: an import of them must go through the hook again
if hook:  # os.mkfifo and os.mknod raise no audit event: gone, and posix (whose fresh import has them) refused
    import posix
    for module, name in ((os, "mkfifo"), (os, "mknod"), (posix, "mkfifo"), (posix, "mknod")):
        if hasattr(module, name):
            delattr(module, name)
    del posix
    sys.addaudithook(_hook)
del _hook, resource
sys.argv = ["<tool>"]
exec(compile(code, "<tool>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
''' % {"nobody": NOBODY}


@dataclass
class ToolResult:
    """What a tool call gave back: `output` (stdout, then on failure the last line of the error; cut to the
    limit), `ok` (the code ran to its end with exit status 0 and its output whole), `status` ("ok", "error",
    "timeout", "memory", "output limit", "killed") and `isolation` (which layers of the bootstrap held: "netns" or
    "userns+netns", "nobody")."""
    output: str
    ok: bool
    status: str
    isolation: str = ""


def run_python(code: str, timeout: float = 5.0, memory_mb: int = 512, output_limit: int = 1000,
               audit_hook: bool = True) -> ToolResult:
    """Run `code` in the sandbox (the module docstring) and return what it printed: never raises on what the code
    does (an error, a hang, a flood, an escape attempt); the call takes at most about `timeout` seconds.
    `audit_hook=False` leaves the audit hook out, so that the tests can check what the other layers hold alone."""
    folder = tempfile.mkdtemp(prefix="chatrlhf-tool-")
    try:
        if os.getuid() == 0:
            os.chown(folder, NOBODY, NOBODY)
        with open(os.path.join(folder, ".stdout"), "wb") as stdout, \
                open(os.path.join(folder, ".stderr"), "wb") as stderr:
            command = [sys.executable, "-I", "-S", "-c", BOOTSTRAP, folder, str(memory_mb << 20),
                       str(max(1, int(timeout + 1))), str(FILE_LIMIT), str(OPEN_FILES), ",".join(PRELOADED),
                       str(MAX_WRITTEN_FILES), "1" if audit_hook else "0"]
            try:
                process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr, cwd=folder,
                                           env={}, start_new_session=True, close_fds=True)
            except OSError as err:
                return ToolResult(f"the tool could not start: {err}", False, "error")
            timed_out = False
            try:
                process.communicate(code.encode("utf-8", "replace"), timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(process)
        out = _read_head(os.path.join(folder, ".stdout"), output_limit)
        err = _read_head(os.path.join(folder, ".stderr"), FILE_LIMIT)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    isolation, err = _isolation_line(err)
    status = _status(process.returncode, timed_out, err)
    cut = len(out) > output_limit
    out = out[:output_limit]
    if status != "ok":
        reason = _last_error_line(err) if status == "error" else status
        out = (out + ("\n" if out and not out.endswith("\n") else "") + reason)[-output_limit:]
    return ToolResult(out, status == "ok" and not cut, "output limit" if cut and status == "ok" else status, isolation)


def _kill_group(process):
    """SIGKILL the call's whole process group (whatever it left running), then reap the process."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _read_head(path, limit):
    """The first `limit` characters (and one more, to tell a cut) of a file the code wrote, as text."""
    with open(path, "rb") as f:
        return f.read(4 * limit + 4).decode("utf-8", "replace")[:limit + 1]


def _isolation_line(err):
    """(the bootstrap's isolation line's value, stderr without it)."""
    marker = "\x00isolation:"
    if err.startswith(marker):
        line, _, rest = err.partition("\n")
        return line[len(marker):], rest
    return "", err


def _status(returncode, timed_out, err):
    if timed_out or returncode == -signal.SIGXCPU:
        return "timeout"
    if returncode == -signal.SIGXFSZ or "File too large" in err:
        return "output limit"
    if "MemoryError" in err:
        return "memory"
    if returncode is not None and returncode < 0:
        return "killed"
    return "ok" if returncode == 0 else "error"


def _last_error_line(err):
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "the code failed"


@dataclass(frozen=True)
class Tool:
    """A tool the actor may call (`--tools`): run(code, timeout) -> ToolResult."""
    run: Callable[..., ToolResult]
    help: str


TOOLS = {
    "python": Tool(run_python, "Python code run in a sandbox (utils/runtime/sandbox.py); what it prints comes back"),
}
