"""utils/runtime/errors.py's `cli_entry`: what ends a run ends it in one line and an exit code a shell reads the
same way: a user error, a full disk, memory running out, a closed standard output, and every signal that ends
a terminal session (SIGHUP too, unless the run was started under `nohup`)."""
import errno
import io
import os
import signal
import sys

import pytest

from utils.runtime.errors import INTERRUPT_SIGNALS, ConfigError, cli_entry


def ended(function, capsys):
    """(exit code, stderr) of `function` run as a cli_entry main."""
    with pytest.raises(SystemExit) as exit_info:
        cli_entry(function)()
    return exit_info.value.code, capsys.readouterr().err


def test_a_user_error_is_one_line(capsys):
    def main():
        raise ConfigError("--flag is\nwrong")

    assert ended(main, capsys) == (2, "error: --flag is wrong\n")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_anywhere_is_one_line_naming_the_file(code, capsys):
    def main():
        raise OSError(code, os.strerror(code), "/out/metrics.json")

    assert ended(main, capsys) == (2, f"error: no space left on device writing /out/metrics.json "
                                      f"({os.strerror(code)}); free some space and run again\n")


def test_memory_running_out_is_one_line(capsys):
    def main():
        raise MemoryError

    code, err = ended(main, capsys)
    assert code == 2 and err.startswith("error: out of memory") and err.count("\n") == 1


def test_another_os_error_is_left_to_show_its_traceback():
    def main():
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError, match="Input/output error"):
        cli_entry(main)()


class ClosedPipe(io.TextIOBase):
    def write(self, text):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def test_standard_output_closed_under_the_run_ends_it_as_sigpipe_would(capsys, monkeypatch):
    """`chat.py ... | head -1`: before, a BrokenPipeError traceback."""
    monkeypatch.setattr(sys, "stdout", ClosedPipe())

    def main():
        print("an answer", flush=True)

    assert ended(main, capsys) == (141, "interrupted: SIGPIPE (standard output was closed)\n")


def test_sighup_ends_a_run_as_sigterm_does(capsys):
    assert signal.SIGHUP in INTERRUPT_SIGNALS

    def main():
        os.kill(os.getpid(), signal.SIGHUP)
        signal.sigtimedwait([], 0.1)  # the handler runs at the next bytecode
        raise AssertionError("the run went on after SIGHUP")

    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        assert ended(main, capsys) == (129, "interrupted: SIGHUP\n")
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL  # restored at the end
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_signal_ignored_from_the_start_stays_ignored(capsys):
    """`nohup python train.py &`: the run must outlive its terminal, so an ignored SIGHUP is left ignored."""
    def main():
        os.kill(os.getpid(), signal.SIGHUP)
        return "went on"

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert cli_entry(main)() == "went on"
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS])
def test_a_path_the_user_may_not_write_is_one_line_naming_it(code, capsys):
    def main():
        raise PermissionError(code, os.strerror(code), "/sys/out/metrics.json")

    assert ended(main, capsys) == (2, f"error: /sys/out/metrics.json: {os.strerror(code)}; choose a path this user "
                                      f"may read and write\n")
