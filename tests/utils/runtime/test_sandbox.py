"""The tool sandbox (utils/runtime/sandbox.py): code runs and prints; every escape tried fails, costs the call and
never the caller. Each layer is also tried alone (the audit hook off) where this machine provides it."""
import os
import socket
import sys
import tempfile
import threading
from pathlib import Path

import psutil
import pytest

from utils.runtime.sandbox import TOOLS, run_python


def test_code_runs_and_its_output_comes_back():
    result = run_python("import math\nprint(123 * 456 + 789, math.gcd(12, 18))")
    assert (result.output, result.ok, result.status) == ("56877 6\n", True, "ok")


def test_an_error_costs_the_call_and_says_why():
    result = run_python("print('before')\n1 / 0")
    assert not result.ok and result.status == "error"
    assert result.output == "before\nZeroDivisionError: division by zero"


def test_a_long_loop_is_stopped_at_the_time_limit():
    result = run_python("while True:\n    pass", timeout=1)
    assert (result.ok, result.status) == (False, "timeout")


def test_a_sleeping_call_is_stopped_at_the_wall_clock_limit():
    """Sleeping uses no CPU, so RLIMIT_CPU never fires: the parent's wall-clock kill does."""
    result = run_python("import time\ntime.sleep(60)", timeout=1)
    assert result.status == "timeout"


def test_huge_output_is_cut_and_costs_the_call():
    result = run_python("while True:\n    print('x' * 10000)", timeout=3, output_limit=200)
    assert not result.ok and len(result.output) <= 200 and result.output.startswith("xxx")
    small = run_python("print('y' * 500)", output_limit=100)
    assert (small.ok, small.status, small.output) == (False, "output limit", "y" * 100)


def test_memory_beyond_the_limit_is_refused():
    result = run_python("x = bytearray(2 ** 31)\nprint('allocated')", memory_mb=256)
    assert (result.ok, result.status) == (False, "memory")
    assert "allocated" not in result.output


def test_the_network_is_refused():
    for code in ("import socket", "__import__('_socket')"):
        result = run_python(code)
        assert not result.ok and ("sandbox" in result.output or "has no attribute 'mk" in result.output), code
    # urllib: refused by the audit hook, or not importable at all once the call runs as nobody
    result = run_python("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:1')\nprint('sent')")
    assert not result.ok and "sent" not in result.output


def listening_server():
    """A TCP server on 127.0.0.1 that counts the connections it accepts: (port, connections list, close)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted = []

    def accept():
        try:
            while True:
                accepted.append(server.accept()[0])
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    return server.getsockname()[1], accepted, server.close


def test_the_network_namespace_alone_keeps_the_code_off_the_machine_s_network():
    port, accepted, close = listening_server()
    try:
        probe = run_python("import socket\ns = socket.create_connection(('127.0.0.1', %d), timeout=2)\n"
                           "print('connected')" % port, audit_hook=False)
        if "netns" not in probe.isolation:
            pytest.skip(f"no network namespace on this machine (isolation: {probe.isolation!r})")
        assert not probe.ok and "connected" not in probe.output
        assert not accepted
    finally:
        close()


def test_files_outside_the_working_folder_cannot_be_written_or_read():
    target = Path(tempfile.gettempdir()) / f"sandbox-escape-{os.getpid()}"
    for code in (f"open({str(target)!r}, 'w').write('escaped')",
                 f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
                 f"import io\nio.FileIO({str(target)!r}, 'w')",
                 "import os\nos.mkdir('/tmp/sandbox-escape-dir')",
                 "import os\nos.mkfifo('/tmp/sandbox-escape-dir')",  # no audit event: gone from os
                 "import os, stat\nos.mknod('/tmp/sandbox-escape-dir', 0o666 | stat.S_IFREG)",
                 "import sys\ndel sys.modules['posix']\nimport posix\nposix.mkfifo('/tmp/sandbox-escape-dir')",
                 "print(open('/etc/hostname').read())",
                 "import os\nprint(os.listdir('/'))"):
        result = run_python(code)
        assert not result.ok and ("sandbox" in result.output or "has no attribute 'mk" in result.output), code
    assert not target.exists() and not Path("/tmp/sandbox-escape-dir").exists()
    inside = run_python("open('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())")
    assert (inside.ok, inside.output) == (True, "kept\n")


def test_no_dir_fd_path_reaches_past_the_folder_and_the_working_directory_stays():
    """The hook judges an open's path from the working directory; `dir_fd=` is never in its event. From a folder
    deep inside, `os.open('..', dir_fd=fd)` six times reached `/`, and files outside were read and written (as
    nobody, and as a user); after `os.chdir('/work')`, `os.listdir()` listed it."""
    target = Path(tempfile.gettempdir()) / f"sandbox-escape-{os.getpid()}"
    escape = ("import os\nos.makedirs('a/b/c/d/e/f/g/h')\nfd = os.open('.', os.O_RDONLY)\n"
              "os.chdir('a/b/c/d/e/f/g/h')\nfor _ in range(12):\n    fd = os.open('..', os.O_RDONLY, dir_fd=fd)\n"
              f"w = os.open({str(target)[1:]!r}, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)\nos.write(w, b'x')")
    prefix = ("import os, sys\nfd = os.open(sys.prefix, os.O_RDONLY)\n"
              "os.write(os.open('escaped', os.O_WRONLY | os.O_CREAT, dir_fd=fd), b'x')")
    for code in (escape, prefix, "import os\nos.chdir('/')\nprint(os.listdir())",
                 "import os\nos.fchdir(os.open('/', os.O_RDONLY))"):
        result = run_python(code)  # the hook's refusal, or (as nobody) the file system's
        assert not result.ok and ("sandbox" in result.output or "PermissionError" in result.output), code
    assert not target.exists() and not (Path(sys.prefix) / "escaped").exists()
    inside = run_python("import os\nos.makedirs('a/b')\nopen('a/b/n.txt', 'w').write('ok')\n"
                        "print(open('a/b/n.txt').read(), os.listdir('a'))")
    assert (inside.ok, inside.output) == (True, "ok ['b']\n")


def test_as_nobody_the_file_system_alone_refuses_writes_outside():
    folder = Path(tempfile.mkdtemp())
    try:
        result = run_python(f"open({str(folder / 'escaped')!r}, 'w').write('x')", audit_hook=False)
        if "nobody" not in result.isolation:
            pytest.skip(f"not run as root: no drop to nobody (isolation: {result.isolation!r})")
        assert not result.ok and "PermissionError" in result.output
        assert not (folder / "escaped").exists()
    finally:
        folder.rmdir()


def test_a_fork_bomb_fails_and_leaves_no_process_behind():
    bomb = "import os\nwhile True:\n    os.fork()"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    for audit_hook in (True, False):
        result = run_python(bomb, timeout=2, audit_hook=audit_hook)
        assert not result.ok
        if audit_hook:
            assert "os.fork is not allowed" in result.output
        elif "nobody" in result.isolation:  # RLIMIT_NPROC holds for a user other than root
            assert "BlockingIOError" in result.output or "Resource temporarily unavailable" in result.output
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_processes_and_ctypes_are_refused():
    for code in ("import subprocess\nsubprocess.run(['echo', 'hi'])", "import os\nos.system('echo hi')",
                 "import os\nos.execv('/bin/echo', ['echo', 'hi'])", "import ctypes",
                 "import os\nos.kill(os.getppid(), 9)", "import gc\nprint(len(gc.get_objects()))"):
        result = run_python(code)
        assert not result.ok and "sandbox" in result.output and "hi\n" not in result.output, code


def test_the_environment_is_not_passed_on_and_the_folder_is_removed(monkeypatch):
    monkeypatch.setenv("SANDBOX_SECRET", "hunter2")
    result = run_python("import os\nprint(os.environ.get('SANDBOX_SECRET'), os.getcwd())")
    assert result.ok
    secret, folder = result.output.split()
    assert secret == "None" and "chatrlhf-tool-" in folder
    assert not Path(folder).exists()


def test_the_registry_runs_python():
    assert TOOLS["python"].run("print(6 * 7)").output == "42\n"
