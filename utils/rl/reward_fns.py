"""Reward functions: programs that score answers (a checker of the right answer, a format rule...), beside or
instead of a learned reward model.

A reward function is called on two lists of the same length and returns one finite number per answer:

    reward_fn(prompts: list[str], answers: list[str]) -> list[float]

prompts are the data set's prompts as written there (DeepSpeed-Chat's `" Human: ... Assistant:"`, not the
model's chat template), answers the generated text up to the first EOS, decoded without special tokens.

`--reward_fn SPEC` names one:
    builtin                     the built-in task's checker `utils.data.builtin_task.score_answer` (1 exact, 0.5 near
                                miss, 0.25 right format only, 0 otherwise)
    reasoning_gym               the verifier of the run's `--data_path reasoning_gym:...` tasks, in [0, 1]
    reasoning_gym_solved        1 where that verifier gives full marks, else 0: no partial credit (many verifiers
                                pay a share for a near answer, which an answer can earn without the skill, for
                                example by copying the question's words back)
    NAME                        any other name of REWARD_FNS (a source that registers itself, below)
    package.module:function     a function imported from the user's path (the working directory first)
    path/to/file.py:function    a function of a Python file

A source registers a reward function with one line here, a factory that gets step 3's arguments:

    REWARD_FNS["my_source"] = lambda args: my_reward_fn

Every call is checked (`call_reward_fn`): a function that raises, returns a wrong number of values, or a value
that is not a finite number stops the run with one `error:` line naming the function.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from pathlib import Path

import torch

from utils.data.builtin_task import score_answer
from utils.data.reasoning_gym_data import reasoning_gym_reward_fn as verifier_of
from utils.runtime.errors import ChatRLHFError, ConfigError


def builtin_reward_fn(prompts, answers):
    """The built-in task's checker on each (prompt, answer): a score in [0, 1]."""
    return [score_answer(prompt, answer) for prompt, answer in zip(prompts, answers)]


def reasoning_gym_reward_fn(args, name="reasoning_gym"):
    """The verifier of the run's reasoning-gym data (`--data_path reasoning_gym:...`): each task's `score_answer`
    on the answer to the question the prompt asks, in [0, 1]. `name` is the reward function's, for errors."""
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
    try:
        if location.endswith(".py"):
            path = Path(location)
            if not path.is_file():
                raise ConfigError(f"{flag} {spec}: the file {location} does not exist")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(location)
    except ChatRLHFError:
        raise
    except Exception as err:  # the user's module failed to import: say which and why, in one line
        raise ConfigError(f"{flag} {spec}: cannot import {location}: {type(err).__name__}: {err}") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ConfigError(f"{flag} {spec}: {location} has no function {attribute!r}")
    return function


def load_reward_fn(spec, args=None):
    """The reward function `spec` names (see the module's docstring); ConfigError naming it if there is none."""
    if spec in REWARD_FNS:
        return REWARD_FNS[spec](args)
    return _import_function(spec)


def check_reward_fn(spec, data_paths, flag):
    """Refuse (ConfigError naming `flag`) a spec that names no reward function, before anything runs: train.py
    checks its --reward-fn and --pair-judge so that a typo does not surface only after step 1 has trained. A
    user's module is imported to find the function."""
    if spec in GYM_REWARD_FNS:
        _one_gym_spec(data_paths, flag, spec)
    elif spec not in REWARD_FNS:
        _import_function(spec, flag)


def call_reward_fn(reward_fn, name, prompts, answers):
    """reward_fn(prompts, answers) as a float32 tensor (B,), checked: ChatRLHFError naming the function (`name`,
    as given to --reward_fn) if it raises, returns something other than one number per answer, or a value that
    is not finite."""
    what = f"the reward function --reward_fn {name}"
    try:
        values = reward_fn(list(prompts), list(answers))
    except Exception as err:
        raise ChatRLHFError(f"{what} raised {type(err).__name__}: {err}") from None
    try:
        values = [float(value) for value in values]
    except (TypeError, ValueError) as err:
        raise ChatRLHFError(f"{what} did not return a list of numbers ({err})") from None
    if len(values) != len(answers):
        raise ChatRLHFError(f"{what} returned {len(values)} values for {len(answers)} answers")
    for index, value in enumerate(values):
        if not math.isfinite(value):
            raise ChatRLHFError(f"{what} returned {value} for answer {index}: rewards must be finite numbers")
    return torch.tensor(values, dtype=torch.float32)
