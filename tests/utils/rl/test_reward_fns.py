"""Reward functions (utils/rl/reward_fns.py): the built-in checker, the registry, functions imported from a module
or a file of the user's, and the checks on every call (an error naming the function, never a wrong reward)."""
import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from utils.data.data_utils import get_raw_dataset
from utils.data.raw_datasets import row_columns
from utils.rl import reward_fns
from utils.rl.reward_fns import REWARD_FNS, builtin_reward_fn, call_reward_fn, check_reward_fn, load_reward_fn
from utils.runtime.errors import ChatRLHFError, ConfigError

PROMPTS = [" Human: What is 7 + 12? Assistant:", ' Human: Reverse the word "cat". Assistant:',
           " Human: What is the capital of France? Assistant:"]


def test_builtin_is_the_task_checker():
    assert load_reward_fn("builtin") is builtin_reward_fn
    # exact, near miss (an anagram), near miss (another capital); trailing text, exact, several words
    assert builtin_reward_fn(PROMPTS, [" 19", " act", " Rome"]) == [1.0, 0.5, 0.5]
    assert builtin_reward_fn(PROMPTS, ["19 Human:", "tac", " Bread and"]) == [0.0, 1.0, 0.0]


def test_a_registered_name_gets_the_run_arguments(monkeypatch):
    seen = []

    def factory(args):
        seen.append(args)
        return lambda prompts, answers: [len(a) for a in answers]

    monkeypatch.setitem(REWARD_FNS, "lengths", factory)
    function = load_reward_fn("lengths", args="the args")
    assert seen == ["the args"] and function([], ["ab", "c"]) == [2, 1]


def test_function_from_a_module_on_the_working_directory_and_from_a_file(tmp_path, monkeypatch):
    package = tmp_path / "my_rewards"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scoring.py").write_text("def by_length(prompts, answers):\n    return [len(a) for a in answers]\n")
    (tmp_path / "loose.py").write_text("def shout(prompts, answers):\n    return [a.isupper() for a in answers]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    monkeypatch.delitem(sys.modules, "my_rewards.scoring", raising=False)
    assert load_reward_fn("my_rewards.scoring:by_length")(["p"], ["abc"]) == [3]
    assert load_reward_fn(f"{tmp_path}/loose.py:shout")(["p", "p"], ["YES", "no"]) == [True, False]
    assert load_reward_fn("loose.py:shout")(["p"], ["A"]) == [True]  # relative to the working directory


@pytest.mark.parametrize("spec, message", [
    ("nonsense", "--reward_fn 'nonsense' is neither a known name (builtin"),
    ("no_such_module_anywhere:f", "--reward_fn no_such_module_anywhere:f: cannot import no_such_module_anywhere: "
                                  "ModuleNotFoundError"),
    ("math:no_such_function", "--reward_fn math:no_such_function: math has no function 'no_such_function'"),
    ("math:pi", "math has no function 'pi'"),  # not callable
    ("missing.py:f", "--reward_fn missing.py:f: the file missing.py does not exist"),
    ("folder.py:f", "--reward_fn folder.py:f: the file folder.py is a folder, not a Python file"),
    ("broken.py:f", "--reward_fn broken.py:f: cannot import broken.py: ZeroDivisionError: division by zero"),
    ("mod:", "is neither a known name"),
])
def test_a_reward_fn_that_cannot_be_loaded_is_one_config_error(spec, message, tmp_path, monkeypatch):
    (tmp_path / "broken.py").write_text("1 / 0\n")
    (tmp_path / "folder.py").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        load_reward_fn(spec)
    assert message in str(error.value)


def test_call_reward_fn_returns_float32_scores():
    scores = call_reward_fn(builtin_reward_fn, "builtin", PROMPTS, [" 19", " tac", " Paris"])
    assert scores.dtype == torch.float32 and scores.tolist() == [1.0, 1.0, 1.0]
    # numpy-ish and tensor values are numbers too
    assert call_reward_fn(lambda p, a: torch.tensor([0.5, 2.0]), "t", ["a", "b"], ["x", "y"]).tolist() == [0.5, 2.0]


def raises(prompts, answers):
    raise KeyError("no score for this prompt")


@pytest.mark.parametrize("function, message", [
    (raises, "the reward function --reward_fn mine:f raised KeyError: 'no score for this prompt'"),
    (lambda p, a: [1.0], "the reward function --reward_fn mine:f returned 1 values for 2 answers"),
    (lambda p, a: [1.0, math.nan], "the reward function --reward_fn mine:f returned nan for answer 1"),
    (lambda p, a: [math.inf, 0.0], "returned inf for answer 0"),
    (lambda p, a: None, "the reward function --reward_fn mine:f did not return a list of numbers"),
    (lambda p, a: ["good", "bad"], "did not return a list of numbers"),
    # it empties its inputs and returns no value: the count is of the answers it was given (was: 0 for 0, passed)
    (lambda p, a: (p.clear(), a.clear(), [])[-1], "the reward function --reward_fn mine:f returned 0 values for 2 "
                                                  "answers"),
])
def test_a_bad_reward_is_an_error_naming_the_function(function, message):
    with pytest.raises(ChatRLHFError) as error:
        call_reward_fn(function, "mine:f", ["p1", "p2"], ["a1", "a2"])
    assert message in str(error.value)


def test_the_builtin_checker_on_a_prompt_of_another_task_is_an_error_naming_it():
    with pytest.raises(ChatRLHFError, match=r"--reward_fn builtin raised ValueError: .*Tell me a joke"):
        call_reward_fn(reward_fns.builtin_reward_fn, "builtin", [" Human: Tell me a joke. Assistant:"], [" no"])


def test_reasoning_gym_reward_fn_is_the_verifier_of_the_runs_spec():
    pytest.importorskip("reasoning_gym")
    from types import SimpleNamespace

    from utils.data.reasoning_gym_data import gym_data
    from utils.rl.reward_fns import load_reward_fn

    spec = "reasoning_gym:chain_sum?min_terms=2&max_terms=2&size=30"
    reward_fn = load_reward_fn("reasoning_gym", SimpleNamespace(data_path=["builtin", spec]))
    items = gym_data(spec).parts["train"][:3]
    right = reward_fn([item.prompt for item in items], [f" {item.answer}" for item in items])
    wrong = reward_fn([item.prompt for item in items], [" 123456789" for _ in items])
    assert right == [1.0, 1.0, 1.0] and max(wrong) < 1.0
    with pytest.raises(ConfigError, match="one --data_path reasoning_gym:<task>... spec, but --data_path gives 0"):
        load_reward_fn("reasoning_gym", SimpleNamespace(data_path=["builtin"]))


def test_reasoning_gym_solved_pays_full_marks_only():
    pytest.importorskip("reasoning_gym")
    from types import SimpleNamespace

    from utils.data.reasoning_gym_data import gym_data
    from utils.rl.reward_fns import check_reward_fn, load_reward_fn

    spec = "reasoning_gym:spell_backward?min_word_len=5&max_word_len=5&size=40"
    args = SimpleNamespace(data_path=[spec])
    verifier, solved = load_reward_fn("reasoning_gym", args), load_reward_fn("reasoning_gym_solved", args)
    items = gym_data(spec).parts["train"][:3]
    prompts = [item.prompt for item in items]
    right = [item.answer for item in items]
    echoed = [item.answer[::-1] for item in items]  # the question's word: its middle letter is in place (1/5)
    assert verifier(prompts, right) == solved(prompts, right) == [1.0] * len(items)
    assert min(verifier(prompts, echoed)) >= 0.2 and solved(prompts, echoed) == [0.0] * len(items)
    for check in (lambda: load_reward_fn("reasoning_gym_solved", SimpleNamespace(data_path=["builtin"])),
                  lambda: check_reward_fn("reasoning_gym_solved", ["builtin"], "--reward-fn")):
        with pytest.raises(ConfigError, match="reasoning_gym_solved scores the questions of one --data_path"):
            check()


def exits(prompts, answers):
    sys.exit(0)


def interrupts_itself(prompts, answers):
    raise KeyboardInterrupt


def generator_exit(prompts, answers):
    raise GeneratorExit


class ExitingNumber:
    def __float__(self):
        raise SystemExit(3)


@pytest.mark.parametrize("function, message", [
    # user code can neither end the run as a success (exit code 0, nothing trained) nor pass for a Ctrl-C
    (exits, "the reward function --reward_fn mine:f raised SystemExit: 0"),
    (interrupts_itself, "the reward function --reward_fn mine:f raised KeyboardInterrupt"),
    (generator_exit, "the reward function --reward_fn mine:f raised GeneratorExit"),
    (lambda p, a: [ExitingNumber(), 1.0], "raised SystemExit: 3"),
    # iterable, but no list of numbers: "11" would read as two rewards of 1
    (lambda p, a: "11", "did not return a list of numbers (it returned a str: '11')"),
    (lambda p, a: b"11", "did not return a list of numbers (it returned a bytes: b'11')"),
    (lambda p, a: {"a1": 1.0, "a2": 0.0}, "did not return a list of numbers (it returned a dict"),
    (lambda p, a: ["1", "0"], "did not return a list of numbers (answer 0's value is a str: '1')"),
    (lambda p, a: [10 ** 400, 1], "answer 0's value 1000000000000000000000000000000000000...: int too large"),
    # finite as Python floats, infinite in float32, the dtype the rewards are used in
    (lambda p, a: [0.0, 1e39], "the reward function --reward_fn mine:f returned 1e+39 for answer 1: rewards must be "
                               "finite numbers in float32"),
    (lambda p, a: __import__("numpy").full(2, -1e39), "returned -1e+39 for answer 0"),
])
def test_what_user_code_raises_or_returns_is_an_error_naming_the_function(function, message):
    with pytest.raises(ChatRLHFError) as error:
        call_reward_fn(function, "mine:f", ["p1", "p2"], ["a1", "a2"])
    assert message in str(error.value)


def test_the_largest_float32_reward_is_taken():
    assert call_reward_fn(lambda p, a: [3.4e38, -3.4e38], "f", ["p", "q"], ["a", "b"]).isfinite().all()


def test_a_reward_function_that_never_returns_is_an_error_after_the_timeout(monkeypatch):
    import threading

    monkeypatch.setenv(reward_fns.TIMEOUT_VARIABLE, "0.2")
    with pytest.raises(ChatRLHFError, match=r"--reward_fn mine:f did not return within 0\.2 s "
                                             r"\(CHATRLHF_REWARD_FN_TIMEOUT sets the limit\)"):
        call_reward_fn(lambda p, a: threading.Event().wait(), "mine:f", ["p"], ["a"])

    def endless(prompts, answers):
        while True:
            yield 1.0

    with pytest.raises(ChatRLHFError, match="did not return within 0.2 s"):
        call_reward_fn(endless, "mine:endless", ["p"], ["a"])
    # the endless result is no longer drawn: its thread ends instead of spinning on for the rest of the process
    for _ in range(100):
        if not any("mine:endless" in thread.name for thread in threading.enumerate()):
            break
        threading.Event().wait(0.01)
    assert not any("mine:endless" in thread.name for thread in threading.enumerate())


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf", "1e12"])  # 1e12: was faulthandler's overflow
def test_a_timeout_that_is_no_positive_number_of_seconds_is_refused(value, monkeypatch):
    monkeypatch.setenv(reward_fns.TIMEOUT_VARIABLE, value)
    with pytest.raises(ConfigError, match=f"CHATRLHF_REWARD_FN_TIMEOUT must be a positive number of seconds, at most "
                                          f"1000000, not '{value}'"):
        call_reward_fn(builtin_reward_fn, "builtin", PROMPTS[:1], [" 19"])


def test_a_module_that_exits_or_hangs_at_import_is_one_config_error(tmp_path, monkeypatch):
    (tmp_path / "exits.py").write_text("raise SystemExit(0)\n")
    (tmp_path / "hangs.py").write_text("import threading\nthreading.Event().wait()\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"--reward_fn exits.py:f: cannot import exits.py: SystemExit: 0$"):
        load_reward_fn("exits.py:f")
    monkeypatch.setenv(reward_fns.TIMEOUT_VARIABLE, "0.2")
    with pytest.raises(ConfigError, match=r"--reward_fn hangs.py:f: importing hangs.py did not finish within 0\.2 s"):
        load_reward_fn("hangs.py:f")


def test_the_function_runs_in_the_callers_autograd_mode():
    with torch.no_grad():
        assert call_reward_fn(lambda p, a: [float(torch.is_grad_enabled())], "f", ["p"], ["a"]).tolist() == [0.0]
    assert call_reward_fn(lambda p, a: [float(torch.is_grad_enabled())], "f", ["p"], ["a"]).tolist() == [1.0]


def test_a_signal_while_the_function_runs_still_interrupts_the_run(capsys):
    """A real SIGTERM (or Ctrl-C) during a call: the run's `interrupted:` line and exit code, as anywhere else."""
    import os
    import signal
    import time

    from utils.runtime.errors import cli_entry

    def stopped(prompts, answers):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
        return [0.0]

    @cli_entry
    def main():
        call_reward_fn(stopped, "mine:f", ["p"], ["a"])

    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 143
    assert capsys.readouterr().err.strip() == "interrupted: SIGTERM"


@pytest.mark.parametrize("source, why", [
    ("def score(answers):\n    return [1.0] * len(answers)\n", "not (answers)"),
    ("def score():\n    return []\n", "not ()"),
    ("def score(*, prompts, answers):\n    return []\n", "not (*, prompts, answers)"),
])
def test_a_function_that_cannot_take_prompts_and_answers_is_refused_before_anything_runs(tmp_path, source, why):
    (tmp_path / "mine.py").write_text(source)
    with pytest.raises(ConfigError) as error:
        check_reward_fn(f"{tmp_path}/mine.py:score", ["builtin"], "--reward-fn")
    assert str(error.value) == (f"--reward-fn {tmp_path}/mine.py:score: score must take (prompts, answers), two lists "
                                f"of strings, or TRL's (completions, **kwargs), {why}")


def test_a_function_with_defaults_or_varargs_beyond_the_two_is_taken(tmp_path):
    (tmp_path / "mine.py").write_text("def score(prompts, answers, scale=1.0, **kw):\n    return [scale] * len(answers)\n"
                                      "def loose(*args):\n    return [0.5] * len(args[1])\n")
    for name in ("score", "loose"):
        check_reward_fn(f"{tmp_path}/mine.py:{name}", ["builtin"], "--reward-fn")
    assert load_reward_fn(f"{tmp_path}/mine.py:loose")(["p"], ["a"]) == [0.5]



QUESTIONS = [{"prompt": " Human: What is 2 + 3? Assistant:", "solution": "5", "level": 1},
             {"prompt": " Human: What is 4 + 4? Assistant:", "solution": "8", "level": 2},
             *({"prompt": f" Human: What is {n} + 1? Assistant:", "solution": str(n + 1), "level": 3}
               for n in range(10, 30))]
COLUMN_FUNCTIONS = """
def trl(completions, solution, **kwargs):
    assert sorted(kwargs) == ["chosen", "level", "prompts", "rejected"], sorted(kwargs)
    return [float(c.strip() == s) for c, s in zip(completions, solution)]

def ours(prompts, answers, solution, level=0):
    return [float(a.strip() == s) + level / 10 for a, s, level in zip(answers, solution, level)]

def everything(prompts, answers, **columns):
    assert "prompt" not in columns and "prompts" not in columns
    return [float(level) for level in columns["level"]]

def wants(completions, ground_truth):
    return [0.0] * len(completions)
"""


@pytest.fixture
def questions(tmp_path):
    """A JSON-lines file of questions with a reference answer (`solution`) and a `level`, and a file of reward
    functions that read them."""
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in QUESTIONS))
    (tmp_path / "rewards.py").write_text(COLUMN_FUNCTIONS)
    return path


def test_a_function_in_trls_form_gets_the_columns_of_each_prompts_row(questions, tmp_path):
    args = argparse.Namespace(data_path=[str(questions)], seed=1234)
    function = load_reward_fn(f"{tmp_path}/rewards.py:trl", args)
    prompts = [" Human: What is 2 + 3? Assistant:", " Human:  What is 4 + 4?\nAssistant:",  # whitespace aside
               " Human: What is 12 + 1? Assistant:"]
    assert call_reward_fn(function, "trl", prompts, [" 5", "9", "13 "]).tolist() == [1.0, 0.0, 1.0]


def test_our_form_takes_columns_by_name_and_kwargs_every_column(questions, tmp_path):
    args = argparse.Namespace(data_path=[str(questions)], seed=1234)
    ours = load_reward_fn(f"{tmp_path}/rewards.py:ours", args)
    prompts = [QUESTIONS[0]["prompt"], QUESTIONS[1]["prompt"]]
    assert call_reward_fn(ours, "ours", prompts, ["5", "5"]).tolist() == pytest.approx([1.1, 0.2])
    everything = load_reward_fn(f"{tmp_path}/rewards.py:everything", args)
    assert call_reward_fn(everything, "everything", prompts[::-1], ["", ""]).tolist() == [2.0, 1.0]


def test_a_column_the_data_lacks_is_refused_before_anything_runs(questions, tmp_path):
    with pytest.raises(ConfigError) as error:
        check_reward_fn(f"{tmp_path}/rewards.py:wants", [str(questions)], "--reward-fn")
    assert str(error.value) == (f"--reward-fn {tmp_path}/rewards.py:wants takes the column ground_truth, which "
                                f"--data_path {questions} does not have (its columns: prompt, chosen, rejected, "
                                "solution, level)")


def test_a_prompt_that_is_no_row_of_the_data_is_an_error_naming_it(questions, tmp_path):
    function = load_reward_fn(f"{tmp_path}/rewards.py:trl", argparse.Namespace(data_path=[str(questions)]))
    with pytest.raises(ChatRLHFError, match=r"raised DataError: .*rewards.py:trl reads the data's columns, but the "
                                            r"prompt 'What is 1 \+ 1\?' is no row of --data_path"):
        call_reward_fn(function, "trl", ["What is 1 + 1?"], ["2"])


def test_columns_of_a_csv_and_a_renamed_prompt_column_reach_the_function(tmp_path):
    (tmp_path / "q.csv").write_text("question,solution\n" + "".join(f"What is {n} + 1?,{n + 1}\n" for n in range(20)))
    (tmp_path / "rewards.py").write_text("def score(prompts, answers, solution):\n"
                                         "    return [float(a == s) for a, s in zip(answers, solution)]\n")
    args = argparse.Namespace(data_path=[str(tmp_path / "q.csv")], prompt_key="question")
    function = load_reward_fn(f"{tmp_path}/rewards.py:score", args)
    assert call_reward_fn(function, "score", ["What is 3 + 1?", "What is 7 + 1?"], ["4", "4"]).tolist() == [1.0, 0.0]


def test_a_conversational_prompt_reaches_a_trl_function_as_messages_and_its_answer_as_one(tmp_path):
    """TRL's conversational form: the prompt a list of messages, each completion a list of one assistant message."""
    rows = [{"prompt": [{"role": "user", "content": f"What is {n} + 1?"}], "solution": str(n + 1)} for n in range(20)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "rewards.py").write_text(
        "def acc(prompts, completions, solution, **kwargs):\n"
        "    assert all(p[-1]['role'] == 'user' for p in prompts), prompts\n"
        "    return [float(c[0]['content'].strip() == s) for c, s in zip(completions, solution)]\n"
        "def ours(prompts, answers, solution):\n"
        "    return [float(isinstance(p, str) and a == s) for p, a, s in zip(prompts, answers, solution)]\n")
    args = argparse.Namespace(data_path=[str(tmp_path / "chat.jsonl")])
    raw = get_raw_dataset(str(tmp_path / "chat.jsonl"), 1234)
    prompts = [raw.get_prompt(row) for row in raw.get_train_data()][:2]  # the text form step 3 passes
    solutions = [row_columns(row)["solution"] for row in raw.get_train_data()][:2]
    for name in ("acc", "ours"):
        function = load_reward_fn(f"{tmp_path}/rewards.py:{name}", args)
        assert call_reward_fn(function, name, prompts, [solutions[0], "x"]).tolist() == [1.0, 0.0]


def test_a_function_with_kwargs_alone_also_scores_prompts_that_are_no_row(questions, tmp_path):
    """`**kwargs` asks for no column by name: a prompt outside the data gets none, rather than an error; a column
    with a default that the data lacks leaves the function as it was written."""
    (tmp_path / "loose.py").write_text("def score(prompts, answers, **kwargs):\n"
                                       "    return [float(len(kwargs.get('solution') or [])) for a in answers]\n"
                                       "def scaled(prompts, answers, scale=2.0):\n"
                                       "    return [scale] * len(answers)\n")
    args = argparse.Namespace(data_path=[str(questions)], seed=1234)
    loose = load_reward_fn(f"{tmp_path}/loose.py:score", args)
    assert call_reward_fn(loose, "score", ["not a row"], ["x"]).tolist() == [1.0]  # solution: [None]
    assert call_reward_fn(loose, "score", [QUESTIONS[0]["prompt"]], ["x"]).tolist() == [1.0]
    scaled = load_reward_fn(f"{tmp_path}/loose.py:scaled", args)
    assert scaled.__name__ == "scaled" and scaled(["anything"], ["a"]) == [2.0]


def test_a_reward_fn_that_holds_pythons_lock_still_ends_the_process(tmp_path):
    """A regex that backtracks without end never lets go of Python's lock, so the thread's timeout cannot fire:
    faulthandler's backstop, past the timeout, prints where the function is and ends the process."""
    (tmp_path / "regex_reward.py").write_text(
        "import re\n\ndef score(prompts, answers):\n"
        "    return [float(bool(re.match(r'(a+)+$', 'a' * 40 + 'b'))) for _ in answers]\n")
    script = ("import sys\nfrom utils.rl import reward_fns\nreward_fns.LOCK_HELD_GRACE_S = 1\n"
              f"sys.path.insert(0, {str(tmp_path)!r})\nimport regex_reward\n"
              "reward_fns.call_reward_fn(regex_reward.score, 'regex_reward.py:score', ['p'], ['a'])\n")
    root = Path(reward_fns.__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120,
                            env={**os.environ, reward_fns.TIMEOUT_VARIABLE: "1"})
    assert result.returncode == 1
    assert result.stderr.startswith("Timeout (0:00:02)!") and "regex_reward.py\", line 4 in score" in result.stderr
