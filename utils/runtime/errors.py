"""User-facing errors: bad input ends in one clear line and a non-zero exit, never a traceback."""
import argparse
import functools
import sys


class ChatRLHFError(Exception):
    """A problem with the user's input (a flag, a file, a model folder). Its message is one line naming it."""


class DataError(ChatRLHFError, ValueError):
    """A data set, data file, row or field that cannot be used."""


class ConfigError(ChatRLHFError, ValueError):
    """Flags that are missing, malformed or impossible together."""


EXIT_USER_ERROR = 2
_exit_callbacks = []


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


def cli_entry(main):
    """Wrap a script's `main` so that a `ChatRLHFError` prints `error: <message>` on one line and exits 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except ChatRLHFError as err:
            message = " ".join(str(err).split())
            print(f"error: {message}", file=sys.stderr, flush=True)
            sys.exit(EXIT_USER_ERROR)
        finally:
            _run_exit_callbacks()

    return wrapper


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag (argparse's own usage dump is left out)."""

    def error(self, message):
        raise ConfigError(message)
