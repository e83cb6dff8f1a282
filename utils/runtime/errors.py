"""User-facing errors: bad input ends in one clear line and a non-zero exit, never a traceback; so does an
interruption (SIGINT, SIGTERM): `interrupted: SIGTERM; resume with --resume`, exit 128 + the signal's number."""
import argparse
import contextlib
import functools
import signal
import sys
import threading


class ChatRLHFError(Exception):
    """A problem with the user's input (a flag, a file, a model folder). Its message is one line naming it."""


class DataError(ChatRLHFError, ValueError):
    """A data set, data file, row or field that cannot be used."""


class ConfigError(ChatRLHFError, ValueError):
    """Flags that are missing, malformed or impossible together."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, as KeyboardInterrupt, so no `except Exception` swallows it."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


EXIT_USER_ERROR = 2
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
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
    """What the line printed on an interruption adds from now on (a training run: "resume with --resume")."""
    _interrupt["hint"] = hint


def _raise_interrupted(signum, frame):
    if _interrupt["deferred"]:
        _interrupt["held"].append(signum)
    else:
        raise Interrupted(signum)


@contextlib.contextmanager
def interrupts_deferred():
    """Hold SIGINT and SIGTERM back while the block runs (a checkpoint or model being written, which then is
    finished, never left half-written), and act on them once it has ended."""
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
    SIGINT or SIGTERM prints `interrupted: <signal>[; <hint>]` on one line and exits 128 + its number (130,
    143), what a shell reports for a process the signal ended."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = {signum: signal.signal(signum, _raise_interrupted) for signum in INTERRUPT_SIGNALS} \
            if in_main_thread else {}
        try:
            return main(*args, **kwargs)
        except ChatRLHFError as err:
            message = " ".join(str(err).split())
            _close_progress_bars()
            print(f"error: {message}", file=sys.stderr, flush=True)
            sys.exit(EXIT_USER_ERROR)
        except Interrupted as stop:
            hint = f"; {_interrupt['hint']}" if _interrupt["hint"] else ""
            _close_progress_bars()
            print(f"interrupted: {stop}{hint}", file=sys.stderr, flush=True)
            sys.exit(128 + stop.signum)
        finally:
            _interrupt["deferred"] += 1  # the clean-up runs to its end
            _run_exit_callbacks()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            _interrupt.update(hint=None, deferred=0, held=[])

    return wrapper


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
