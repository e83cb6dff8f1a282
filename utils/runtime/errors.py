"""User-facing errors: bad input ends in one clear line and a non-zero exit, never a traceback; so does an
interruption (SIGINT, SIGTERM, SIGHUP: every signal that ends a terminal session): `interrupted: SIGTERM; resume
with --resume`, exit 128 + the signal's number."""
import argparse
import contextlib
import errno
import functools
import signal
import sys
import threading


def one_line(text, limit=None):
    """`text` on one line, its whitespace runs as single spaces (cut to `limit` characters with "...")."""
    text = " ".join(str(text).split())
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def error_line(err):
    """`Type: message` of an exception, on one line (the type alone when it has no message)."""
    text = one_line(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class ChatRLHFError(Exception):
    """A problem with the user's input (a flag, a file, a model folder). Its message is one line naming it."""


class DataError(ChatRLHFError, ValueError):
    """A data set, data file, row or field that cannot be used."""


class ConfigError(ChatRLHFError, ValueError):
    """Flags that are missing, malformed or impossible together."""


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP arrived. A BaseException, as KeyboardInterrupt, so no `except Exception` swallows
    it."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


EXIT_USER_ERROR = 2
# Ctrl-C; a scheduler's or `kill`'s stop; a closed terminal or dropped ssh session. One left ignored (SIG_IGN) when
# the process starts stays ignored: `nohup` ignores SIGHUP so that a run outlives its terminal.
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
NOT_PERMITTED = (errno.EACCES, errno.EPERM, errno.EROFS)
_exit_callbacks = []
_interrupt = {"hint": None, "deferred": 0, "held": []}


def on_exit(callback):
    """Run `callback()` when the running `cli_entry` main ends, however it ends (done, error, interrupt); the
    last registered runs first. For what a run holds until its end: the output folder's lock."""
    _exit_callbacks.append(callback)


def _run_exit_callbacks():
    while _exit_callbacks:
        try:
            _exit_callbacks.pop()()
        except Exception as err:  # one failed clean-up must not hide the run's outcome or skip the others
            print(f"warning: clean-up at exit failed: {err}", file=sys.stderr, flush=True)


def interrupt_hint(hint):
    """What the line printed on an interruption adds from now on (a training run with a checkpoint to resume
    from: "resume with --resume"); None: nothing."""
    _interrupt["hint"] = hint


def _raise_interrupted(signum, frame):
    if _interrupt["deferred"]:
        _interrupt["held"].append(signum)
    else:
        raise Interrupted(signum)


@contextlib.contextmanager
def interrupts_deferred():
    """Hold SIGINT, SIGTERM and SIGHUP back while the block runs (a checkpoint or model being written, which then
    is finished, never left half-written), and act on them once it has ended."""
    _interrupt["deferred"] += 1
    try:
        yield
    finally:
        _interrupt["deferred"] -= 1
    if not _interrupt["deferred"] and _interrupt["held"]:
        signum = _interrupt["held"][0]
        _interrupt["held"].clear()
        raise Interrupted(signum)


def cli_entry(main):
    """Wrap a script's `main` so that a `ChatRLHFError` prints `error: <message>` on one line and exits 2, and
    SIGINT, SIGTERM or SIGHUP prints `interrupted: <signal>[; <hint>]` on one line and exits 128 + its number
    (130, 143, 129), what a shell reports for a process the signal ended. A disk that fills up (ENOSPC,
    EDQUOT) wherever a file is written, a path this user may not read or write, memory running out, and standard
    output closed under it (a broken pipe) end in one line too."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = {signum: signal.signal(signum, _raise_interrupted) for signum in INTERRUPT_SIGNALS
                    if signal.getsignal(signum) != signal.SIG_IGN} if in_main_thread else {}
        try:
            return main(*args, **kwargs)
        except ChatRLHFError as err:
            _print_error(str(err))
            sys.exit(EXIT_USER_ERROR)
        except BrokenPipeError:
            if not _stdout_closed():
                raise
            _print_interrupted("SIGPIPE (standard output was closed)")  # its reader has gone (`| head`, a dead tee)
            sys.exit(128 + signal.SIGPIPE)
        except OSError as err:
            if err.errno in NOT_PERMITTED and err.filename:  # a folder or file the user named, or a default one
                _print_error(f"{err.filename}: {err.strerror}; choose a path this user may read and write")
                sys.exit(EXIT_USER_ERROR)
            if err.errno not in DISK_FULL:
                raise
            where = f" writing {err.filename}" if err.filename else ""
            _print_error(f"no space left on device{where} ({err.strerror or err}); free some space and run again")
            sys.exit(EXIT_USER_ERROR)
        except (MemoryError, RuntimeError) as err:
            if not _out_of_memory(err):
                raise
            _print_error("out of memory: the data, model or batch does not fit this machine's memory")
            sys.exit(EXIT_USER_ERROR)
        except Interrupted as stop:
            _print_interrupted(str(stop))
            sys.exit(128 + stop.signum)
        finally:
            _interrupt["deferred"] += 1  # the clean-up runs to its end
            _run_exit_callbacks()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            _interrupt.update(hint=None, deferred=0, held=[])

    return wrapper


def _out_of_memory(err):
    """Whether `err` is memory running out: Python's MemoryError, torch's OutOfMemoryError (a GPU's), or the
    RuntimeError torch's CPU allocator raises for a tensor it cannot allocate."""
    return (isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError"
            or "DefaultCPUAllocator: can't allocate memory" in str(err))


def _print_error(message):
    _close_progress_bars()
    try:
        print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    except OSError:  # stderr gone with the terminal: the exit code says it
        pass


def _print_interrupted(what):
    hint = f"; {_interrupt['hint']}" if _interrupt["hint"] else ""
    _close_progress_bars()
    try:
        print(f"interrupted: {what}{hint}", file=sys.stderr, flush=True)
    except OSError:  # stderr gone with the terminal (a hang-up): the exit code says it
        pass


def _stdout_closed():
    """Whether standard output's reader has gone (its pipe is broken); then what is left for it is dropped, so
    that flushing it at exit does not fail once more."""
    import os

    try:
        sys.stdout.flush()
        return False
    except BrokenPipeError:
        pass
    except Exception:  # noqa: BLE001 (another failure: not a closed pipe)
        return False
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except Exception:  # noqa: BLE001 (stdout without a file descriptor of its own)
        pass
    return True


def _close_progress_bars():
    """Clear the progress bars a failed run leaves on the terminal, so its last line stands alone."""
    if "tqdm" in sys.modules:
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag (argparse's own usage dump is left out)."""

    def error(self, message):
        raise ConfigError(message)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, refusing an integer flag past sys.maxsize, which no batch, length or count can use and which
        torch and itertools fail on with their own tracebacks, and a blank value of a text flag that is off by
        default (`--pairs_file "$UNSET"`), which would read as the flag left out."""
        parsed, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(parsed, action.dest, None)
            values = value if isinstance(value, list) else [value]
            flag = "/".join(action.option_strings)
            if action.type is int and action.option_strings and any(
                    isinstance(v, int) and abs(v) > sys.maxsize for v in values):
                raise ConfigError(f"argument {flag}: {value} is out of range (at most {sys.maxsize} in size)")
            if (action.type in (None, str) and action.default is None and action.option_strings
                    and any(isinstance(v, str) and not v.strip() for v in values)):
                raise ConfigError(f"argument {flag}: the value is blank: give one, or leave {flag} out")
        return parsed, extras
