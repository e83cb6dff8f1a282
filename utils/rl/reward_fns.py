"""Reward functions: programs that score answers (a checker of the right answer, a format rule...), beside or
instead of a learned reward model.

A reward function is called on two lists of the same length and returns one finite number per answer:

    reward_fn(prompts: list[str], answers: list[str]) -> list[float]

prompts are the data set's prompts as written there (DeepSpeed-Chat's `" Human: ... Assistant:"`, not the
model's chat template), answers the generated text up to the first EOS, decoded without special tokens. A user's
function may also take the data's columns (a reference answer), in our form or TRL's
`fn(completions, solution, **kwargs)`: utils/rl/reward_columns.py.

`--reward_fn SPEC` names one:
    builtin                     the built-in task's checker `utils.data.builtin_task.score_answer` (1 exact, 0.5 near
                                miss, 0.25 right format only, 0 otherwise)
    reasoning_gym               the verifier of the run's `--data_path reasoning_gym:...` tasks, in [0, 1]; full
                                marks or nothing for the tasks on reasoning-gym's default scorer, whose partial
                                credit is for holding the reference anywhere ("24" earns half of "2")
    reasoning_gym_solved        1 where that verifier gives full marks, else 0: no partial credit (many verifiers
                                pay a share for a near answer, which an answer can earn without the skill, for
                                example by copying the question's words back)
    NAME                        any other name of REWARD_FNS (a source that registers itself, below)
    package.module:function     a function imported from the user's path (the working directory first)
    path/to/file.py:function    a function of a Python file

A source registers a reward function with one line here, a factory that gets step 3's arguments:

    REWARD_FNS["my_source"] = lambda args: my_reward_fn

Every call is checked (`call_reward_fn`): a function that raises (anything: SystemExit, KeyboardInterrupt and
GeneratorExit too, so that user code can neither end the run as a success nor look like a Ctrl-C), does not
return within REWARD_FN_TIMEOUT seconds, returns something other than one number per answer (a string is not a
list of numbers), or a value that is not finite in float32, the dtype the rewards are used in, stops the run with
one `error:` line naming the function. Importing a user's module is guarded the same way. A real Ctrl-C (or
SIGTERM, SIGHUP) while the function runs still interrupts the run. A function that never lets go of Python's lock
(a regex that backtracks without end) leaves no thread able to report it: LOCK_HELD_GRACE_S past the timeout,
faulthandler prints where it is and ends the process with exit 1.
"""
from __future__ import annotations

import faulthandler
import importlib
import importlib.util
import math
import os
import sys
import threading
from pathlib import Path

import torch

from utils.data.builtin_task import score_answer
from utils.data.reasoning_gym_data import reasoning_gym_reward_fn as verifier_of
from utils.rl.reward_columns import ColumnCall, DataRows, check_columns, with_columns
from utils.runtime.args import MAX_TIMEOUT_SECONDS, column_keys
from utils.runtime.errors import ChatRLHFError, ConfigError, error_line

REWARD_FN_TIMEOUT = 600.0
"""Seconds one call of a reward function (or the import of its module) may take before the run stops with an
error naming it; the environment variable TIMEOUT_VARIABLE overrides it. Generous: a call scores one batch."""
TIMEOUT_VARIABLE = "CHATRLHF_REWARD_FN_TIMEOUT"
LOCK_HELD_GRACE_S = 30.0
"""Seconds past the timeout after which a reward function that holds Python's lock ends the process (run_guarded)."""
NOT_A_LIST = (str, bytes, bytearray, dict, set, frozenset)
"""Results that iterate but are no list of numbers: "1111" would read as four rewards of 1, a dict as its keys."""


def builtin_reward_fn(prompts, answers):
    """The built-in task's checker on each (prompt, answer): a score in [0, 1]."""
    return [score_answer(prompt, answer) for prompt, answer in zip(prompts, answers)]


def reasoning_gym_reward_fn(args, name="reasoning_gym"):
    """The verifier of the run's reasoning-gym data (`--data_path reasoning_gym:...`) as a reward: each task's
    `score_answer` on the answer to the question the prompt asks, in [0, 1], without the default scorer's
    containment credit (utils.data.reasoning_gym_data.Item.reward). `name` is the reward function's, for errors."""
    return verifier_of(_one_gym_spec(getattr(args, "data_path", None), name=name))


def solved_only(reward_fn):
    """`reward_fn` paying 1 for full marks (a score of 1) and 0 for anything less."""
    def solved(prompts, answers):
        return [1.0 if score >= 1.0 else 0.0 for score in reward_fn(prompts, answers)]
    return solved


def _one_gym_spec(data_paths, flag="--reward_fn", name="reasoning_gym"):
    """The one reasoning-gym spec of `data_paths` that `name` scores; ConfigError otherwise."""
    specs = [path for path in data_paths or [] if path.startswith("reasoning_gym:")]
    if len(specs) != 1:
        raise ConfigError(f"{flag} {name} scores the questions of one --data_path reasoning_gym:<task>... "
                          f"spec, but --data_path gives {len(specs)}")
    return specs[0]


REWARD_FNS = {
    "builtin": lambda args: builtin_reward_fn,
    "reasoning_gym": reasoning_gym_reward_fn,
    "reasoning_gym_solved": lambda args: solved_only(reasoning_gym_reward_fn(args, "reasoning_gym_solved")),
}
"""Reward-function sources by name: NAME -> factory(args) -> reward_fn."""
GYM_REWARD_FNS = ("reasoning_gym", "reasoning_gym_solved")
"""The names that score the run's reasoning-gym questions (they need one `--data_path reasoning_gym:...`)."""


def _import_function(spec, flag="--reward_fn"):
    """The function `module:function` or `file.py:function` names; ConfigError naming `flag` and the spec
    otherwise."""
    location, _, attribute = spec.rpartition(":")
    if not location or not attribute:
        raise ConfigError(f"{flag} {spec!r} is neither a known name ({', '.join(sorted(REWARD_FNS))}) nor "
                          "package.module:function or path/to/file.py:function")
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            what = "is a folder, not a Python file" if path.is_dir() else "does not exist"
            raise ConfigError(f"{flag} {spec}: the file {location} {what}")

        def load():
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
            return module
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())

        def load():
            return importlib.import_module(location)
    timeout = reward_fn_timeout()
    outcome, module = run_guarded(load, timeout, f"import of {location}")
    if outcome == RUNNING:
        raise ConfigError(f"{flag} {spec}: importing {location} did not finish within {timeout:g} s "
                          f"({TIMEOUT_VARIABLE} sets the limit)")
    if outcome == RAISED:
        if isinstance(module, ChatRLHFError):
            raise module
        # the user's module failed to import: say which and why, in one line
        raise ConfigError(f"{flag} {spec}: cannot import {location}: {error_line(module)}")
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ConfigError(f"{flag} {spec}: {location} has no function {attribute!r}")
    return function, ColumnCall(function, f"{flag} {spec}: {attribute}")


def load_reward_fn(spec, args=None, flag="--reward_fn"):
    """The reward function `spec` names (see the module's docstring); ConfigError naming it and `flag`, the flag
    that gave it, if there is none. A user's function that takes data-set columns reads them from the rows of
    `args.data_path` (utils/rl/reward_columns.py)."""
    if spec in GYM_REWARD_FNS:
        _one_gym_spec(getattr(args, "data_path", None), flag, spec)
    if spec in REWARD_FNS:
        return REWARD_FNS[spec](args)
    function, call = _import_function(spec, flag)
    if call.plain:
        return function
    rows = _data_rows(args)
    check_columns(call, rows, f"{flag} {spec}")
    return with_columns(function, call, rows, f"{flag} {spec}") if call.reads(rows.names) else function


def check_reward_fn(spec, data_paths, flag, columns=None):
    """Refuse (ConfigError naming `flag`) a spec that names no reward function, or a function that takes a column
    the data (`data_paths`, columns renamed by `columns`) does not have, before anything runs: train.py checks its
    --reward-fn and --pair-judge so that a typo does not surface only after step 1 has trained. A user's module is
    imported to find the function."""
    if spec in GYM_REWARD_FNS:
        _one_gym_spec(data_paths, flag, spec)
    elif spec not in REWARD_FNS:
        _, call = _import_function(spec, flag)
        if not call.plain:
            check_columns(call, DataRows(data_paths or ["builtin"], columns=columns), f"{flag} {spec}")


def _data_rows(args):
    """The rows a column-reading reward function looks its prompts up in: those of the run's --data_path."""
    return DataRows(getattr(args, "data_path", None) or ["builtin"], getattr(args, "seed", 1234),
                    column_keys(args) if args is not None else None)


def reward_fn_timeout():
    """REWARD_FN_TIMEOUT, or the seconds the environment variable TIMEOUT_VARIABLE gives (ConfigError naming it
    if they are not a positive number)."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return REWARD_FN_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_SECONDS):
        raise ConfigError(f"{TIMEOUT_VARIABLE} must be a positive number of seconds, at most {MAX_TIMEOUT_SECONDS}, "
                          f"not {text!r}")
    return seconds


RETURNED, RAISED, RUNNING = "returned", "raised", "running"


def run_guarded(function, timeout, name):
    """(RETURNED, function()) if it returns within `timeout` seconds, (RAISED, the exception) if it raises
    anything (any BaseException: user code may call sys.exit or raise KeyboardInterrupt), (RUNNING, None) if it
    is still running then: it runs in a daemon thread of its own (`name`), left behind to end with the process.
    The waiting thread stays interruptible: a signal (Ctrl-C) raises there as it would in the function."""
    outcome = [RUNNING, None]
    grad = torch.is_grad_enabled()

    def target():
        try:
            with torch.set_grad_enabled(grad):  # the caller's autograd mode, which is per thread
                outcome[:] = RETURNED, function()
        except BaseException as err:  # noqa: B036 (whatever user code raises is reported, never let through)
            outcome[:] = RAISED, err

    thread = threading.Thread(target=target, name=f"chatrlhf {name}", daemon=True)
    # The backstop for a function that never lets go of Python's lock (a regex that backtracks without end, one
    # long C call): then neither this join's timeout nor a signal handler can run, and only faulthandler's own
    # thread, outside the lock, still can: it prints where each thread is and ends the process (exit 1).
    armed = _arm_backstop(timeout + LOCK_HELD_GRACE_S)
    try:
        thread.start()
        thread.join(timeout)
    finally:
        if armed:
            faulthandler.cancel_dump_traceback_later()
    return (RUNNING, None) if thread.is_alive() else tuple(outcome)


def _arm_backstop(seconds):
    """faulthandler's dump-and-exit after `seconds`, to the process's standard error; False where it has none that
    faulthandler can write to (a file descriptor)."""
    try:
        faulthandler.dump_traceback_later(seconds, exit=True, file=sys.__stderr__ or sys.stderr)
    except (AttributeError, RuntimeError, ValueError, OSError):
        return False
    return True


class _NotANumber(Exception):
    """A value of a reward function's result that is not a number (what is wrong, for the error line)."""


def call_reward_fn(reward_fn, name, prompts, answers, flag="--reward_fn"):
    """reward_fn(prompts, answers) as a float32 tensor (B,), checked: ChatRLHFError naming the function (`name`,
    as given to `flag`) if it raises, does not return (its result drawn to the end) within
    reward_fn_timeout() seconds, returns something other than one number per answer, or a value that is not
    finite in float32 (1e39 is a finite Python float, and inf in float32)."""
    what = f"the reward function {flag} {name}"
    prompts, answers = list(prompts), list(answers)
    timeout = reward_fn_timeout()
    stop = threading.Event()

    def scores():
        values = reward_fn(list(prompts), list(answers))  # copies: what it does to them changes no count here
        if isinstance(values, NOT_A_LIST) or not hasattr(values, "__iter__"):
            raise _NotANumber(f"it returned a {type(values).__name__}: {_short(values)}")
        numbers = []
        for index, value in enumerate(values):  # a lazy result (a generator) is drawn here, under the time limit
            if stop.is_set():
                break
            if isinstance(value, (str, bytes, bytearray)):
                raise _NotANumber(f"answer {index}'s value is a {type(value).__name__}: {_short(value)}")
            try:
                numbers.append(float(value))
            except (TypeError, ValueError, OverflowError) as err:
                raise _NotANumber(f"answer {index}'s value {_short(value)}: {err}") from None
        return numbers

    outcome, values = run_guarded(scores, timeout, what)
    if outcome == RUNNING:
        stop.set()
        raise ChatRLHFError(f"{what} did not return within {timeout:g} s ({TIMEOUT_VARIABLE} sets the limit)")
    if outcome == RAISED:
        raise ChatRLHFError(f"{what} did not return a list of numbers ({values})" if isinstance(values, _NotANumber)
                            else f"{what} raised {error_line(values)}")
    if len(values) != len(answers):
        raise ChatRLHFError(f"{what} returned {len(values)} values for {len(answers)} answers")
    rewards = torch.tensor(values, dtype=torch.float32)
    finite = torch.isfinite(rewards)
    if not finite.all():
        index = int((~finite).nonzero()[0])
        raise ChatRLHFError(f"{what} returned {values[index]!r} for answer {index}: rewards must be finite numbers "
                            f"in float32, the dtype training uses (|r| < {torch.finfo(torch.float32).max:.3g})")
    return rewards


def _short(value, limit=40):
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."
