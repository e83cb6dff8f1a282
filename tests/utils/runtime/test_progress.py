"""Progress bars: drawn only on rank 0 with stdout and stderr terminals, and a log line printed while a bar is up
lands on a line of its own, the bar cleared before it and redrawn after."""
import io
import sys

import pytest

from utils.runtime import progress as progress_module
from utils.runtime.dist import print_rank_0
from utils.runtime.progress import progress, show_progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def fake_terminal(monkeypatch):
    """stdout and stderr one fake terminal (as on a console, where both show in the same place). Set in the test's
    body: pytest puts its own capture in place between the fixtures and the test."""
    screen = Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    return screen


def test_bars_show_on_rank_0_at_a_terminal(monkeypatch):
    terminal = fake_terminal(monkeypatch)
    assert show_progress()
    bar = progress(range(3), desc="train")
    assert not bar.disable
    assert list(bar) == [0, 1, 2]
    assert "train" in terminal.getvalue()


@pytest.mark.parametrize("redirected", ["stdout", "stderr"])
def test_no_bar_when_stdout_or_stderr_is_not_a_terminal(monkeypatch, redirected):
    terminal = fake_terminal(monkeypatch)
    log = io.StringIO()
    monkeypatch.setattr(sys, redirected, log)
    assert not show_progress()
    bar = progress(range(3), desc="train")
    assert bar.disable
    assert list(bar) == [0, 1, 2]
    assert "train" not in terminal.getvalue() + log.getvalue()


def test_no_bar_on_ranks_above_0(monkeypatch):
    terminal = fake_terminal(monkeypatch)
    monkeypatch.setattr(progress_module, "is_rank_0", lambda: False)
    assert not show_progress()
    assert progress(range(3), desc="train").disable
    assert terminal.getvalue() == ""


def test_a_log_line_clears_the_bar_and_stands_on_its_own_line(monkeypatch):
    terminal = fake_terminal(monkeypatch)
    bar = progress(total=10, desc="train")
    bar.update(1)
    bar.refresh()
    before = terminal.getvalue()
    assert "train" in before and not before.endswith("\n")  # the bar is up, the cursor on its line
    print_rank_0("epoch 1 step 1/10: loss 0.5")
    screen = terminal.getvalue()
    after_bar = screen[len(before):]
    line_start = after_bar.index("epoch 1 step 1/10")
    assert after_bar[:line_start].endswith("\r")  # the bar was erased, the cursor back at the line's start
    assert after_bar[:line_start].strip() == ""  # nothing of the bar is left before the line
    assert "train" in after_bar[line_start:]  # and it is redrawn below the line
    bar.close()
