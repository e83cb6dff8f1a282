"""Every flag of every command-line script says what it does: `--help` shows a non-empty text for each."""
import argparse
import importlib

import pytest

SCRIPTS = ("train", "inference.chatbot", "inference.sample_pairs", "training.step1_supervised_finetuning.main",
           "training.step1_supervised_finetuning.prompt_eval", "training.step2_reward_model_finetuning.main",
           "training.step2_reward_model_finetuning.rw_eval", "training.step2_dpo_finetuning.main",
           "training.step3_rlhf_finetuning.arguments", "bench.run", "bench.worker")


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
