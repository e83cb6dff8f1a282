"""Every flag of every command-line script says what it does: `--help` shows a non-empty text for each."""
import argparse
import importlib

import pytest

SCRIPTS = ("train", "inference.chatbot", "inference.sample_pairs", "training.step1_supervised_finetuning.main",
           "training.step1_supervised_finetuning.prompt_eval", "training.step2_reward_model_finetuning.main",
           "training.step2_reward_model_finetuning.rw_eval", "training.step2_dpo_finetuning.main",
           "training.step2_kto_finetuning.main", "training.step3_rlhf_finetuning.arguments", "bench.run",
           "bench.worker")


class _Parsed(Exception):
    def __init__(self, parser):
        super().__init__("parsed")
        self.parser = parser


def script_parser(module_name, monkeypatch):
    """The parser a script's parse_args builds, caught as it starts parsing (so nothing runs)."""
    def catch(parser, *args, **kwargs):
        raise _Parsed(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    with pytest.raises(_Parsed) as caught:
        importlib.import_module(module_name).parse_args([])
    return caught.value.parser


@pytest.mark.parametrize("module_name", SCRIPTS)
def test_every_flag_has_help(module_name, monkeypatch):
    parser = script_parser(module_name, monkeypatch)
    actions = [action for action in parser._actions if not isinstance(action, argparse._HelpAction)]
    assert len(actions) > 2
    missing = [action.option_strings[0] if action.option_strings else action.dest for action in actions
               if not (action.help or "").strip() or action.help == argparse.SUPPRESS]
    assert not missing, f"{module_name}: flags without help: {missing}"


# The scripts whose numeric flags are checked against utils/runtime/args.py's FLAG_RANGES (train.py checks its own
# flags; bench/ is a measuring tool), with the flags each needs to parse at all.
REQUIRED = {"inference.chatbot": ["--path", "tiny"],
            "inference.sample_pairs": ["--model_name_or_path", "tiny", "--reward_fn", "builtin", "--output_dir", "x"],
            "training.step1_supervised_finetuning.main": [],
            "training.step1_supervised_finetuning.prompt_eval": ["--model_name_or_path_baseline", "tiny",
                                                                 "--model_name_or_path_finetune", "tiny"],
            "training.step2_reward_model_finetuning.main": [],
            "training.step2_reward_model_finetuning.rw_eval": ["--model_name_or_path", "tiny"],
            "training.step2_dpo_finetuning.main": [],
            "training.step3_rlhf_finetuning.arguments": ["--actor_model_name_or_path", "tiny"]}
# Numeric flags whose range depends on another flag, checked by their script.
CHECKED_BY_THE_SCRIPT = {"overlong_buffer": "in [1, --max_answer_seq_len]", "local_rank": "set by the launcher"}


def numeric_flags(parser):
    return [action for action in parser._actions
            if action.type in (int, float) and not action.choices and action.dest not in CHECKED_BY_THE_SCRIPT]


@pytest.mark.parametrize("module_name", REQUIRED)
def test_every_numeric_flag_has_a_range_and_the_script_checks_it(module_name, monkeypatch):
    """Each int or float flag is a row of FLAG_RANGES (a name means the same range in every script), and the
    script refuses a value outside it (-1 for an int, which no row allows, NaN for a float) with an error naming
    the flag."""
    from utils.runtime.args import FLAG_RANGES
    from utils.runtime.errors import ConfigError

    with monkeypatch.context() as patched:
        flags = numeric_flags(script_parser(module_name, patched))
    assert not [action.option_strings[0] for action in flags if action.dest not in FLAG_RANGES]
    parse_args = importlib.import_module(module_name).parse_args
    for action in flags:
        value = "-1" if action.type is int else "nan"
        with pytest.raises(ConfigError, match=f"^--{action.dest} must be "):
            parse_args([*REQUIRED[module_name], "--output_dir", "unused", action.option_strings[0], value]
                       if module_name.endswith((".main", ".arguments")) else
                       [*REQUIRED[module_name], action.option_strings[0], value])


def test_each_flag_name_is_declared_once():
    """Every `add_argument("--name"` / `add("--name"` of the pipeline and its scripts (train.py, chat.py, training/,
    inference/, utils/, scripts/; bench/ is a measuring tool with a CLI of its own) is written out (no f-string
    names) and, but for the flags listed here, once: the scripts share a flag through a function of
    utils/runtime/args.py."""
    import re
    from collections import Counter
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    declared = Counter()
    folders = ("training", "inference", "utils", "scripts")
    for path in [root / "train.py", root / "chat.py",
                 *(path for folder in folders for path in (root / folder).rglob("*.py"))]:
        declared.update(re.findall(r'''(?:add_argument|\badd)\(\s*(f?["']--[^"']+)["']''', path.read_text()))
    assert not [name for name in declared if name.startswith("f")]
    twice = {name.lstrip("\"'") for name, count in declared.items() if count > 1}
    assert twice <= {
        "--resume",  # steps: resume from a checkpoint; sample_pairs.py: keep finished pairs; train.py: both
        "--eval_interval",  # steps 2 and DPO: optimizer steps (0: before and after only); step 3: prompt batches
        "--seed",  # train.py's own (every stage's seed) beside the steps' and tools'
        "--tools",  # train.py's own (step 3's and the closing evaluation's) beside utils/runtime/args.py's group
    }


@pytest.mark.parametrize("module_name", [name for name in REQUIRED if name.endswith((".main", ".arguments"))])
def test_a_relative_output_dir_is_made_absolute_where_the_step_starts(module_name, tmp_path, monkeypatch):
    """A reward function (or a tool) that changes the working directory must not move where the step saves."""
    monkeypatch.chdir(tmp_path)
    critic = ["--critic_model_name_or_path", "tiny"] if module_name.endswith(".arguments") else []
    args = importlib.import_module(module_name).parse_args([*REQUIRED[module_name], *critic, "--output_dir",
                                                            "out/run"])
    assert args.output_dir == str(tmp_path / "out" / "run")
