"""A limit on how long a block of library code may run, for code that may never return (a reasoning-gym task at
settings it cannot meet, a model's chat template that loops): SIGALRM, so the main thread only."""
import contextlib
import signal
import threading


class Overtime(BaseException):
    """Raised into a block that ran past its time_limit: a BaseException, so that no `except Exception` in the code
    it interrupts swallows it."""


@contextlib.contextmanager
def time_limit(seconds):
    """Raise Overtime into the block once `seconds` have passed; outside the main thread, where no signal handler
    runs, the block has no limit. The previous SIGALRM handler is put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def overtime(signum, frame):
        raise Overtime

    previous = signal.signal(signal.SIGALRM, overtime)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
