"""Tests of the chat CLI (chat.py, inference/chatbot.py): the history object in-process, the CLI as a subprocess."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inference import chatbot
from inference.chatbot import ChatBot
from inference.generation import generate, max_prompt_tokens, tokenize_prompts
from utils.runtime.errors import one_line
from utils.data import builtin_task as task
from utils.data.prompting import format_turns

REPO = Path(__file__).resolve().parents[2]
Q1, Q2, Q3 = "What is 3 + 4?", 'Reverse the word "cat".', "What is the capital of France?"


pytestmark = pytest.mark.usefixtures("one_thread")


def run_chat(*args, stdin=""):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # a tiny model: threads only add start-up and contention
    return subprocess.run([sys.executable, str(REPO / "chat.py"), *args], input=stdin, capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=120)


# ---------------------------------------------------------------------------------------------------------
# The history, in-process
# ---------------------------------------------------------------------------------------------------------


def test_chatbot_keeps_the_history_and_clear_resets_it(tiny):
    bot = ChatBot(*tiny, max_new_tokens=6, greedy=True)
    first = bot.reply(Q1)
    assert bot.last_prompt == task.format_prompt(Q1)
    bot.reply(Q2)
    assert bot.last_prompt == f"{task.format_prompt(Q1)} {first}{task.format_prompt(Q2)}"
    assert [user for user, _ in bot.conversation.turns] == [Q1, Q2]
    bot.clear()
    bot.reply(Q3)
    assert bot.last_prompt == task.format_prompt(Q3)


def test_chatbot_drops_the_oldest_turns_when_the_history_outgrows_the_context(tiny):
    model, tokenizer = tiny
    bot = ChatBot(model, tokenizer, max_new_tokens=64)
    for i in range(200):
        bot.conversation.add(f"What is {i} + 1?", str(i + 1))
    prompt = bot.build_prompt(Q3)
    assert len(tokenize_prompts(tokenizer, [prompt])[0]) <= max_prompt_tokens(model, 64)
    assert prompt.endswith(f"What is 199 + 1? Assistant: 200{task.format_prompt(Q3)}")
    assert "What is 0 + 1?" not in prompt
    assert len(bot.conversation.turns) == 200


def test_chatbot_cuts_the_answer_where_the_model_starts_the_next_human_turn(tiny):
    bot = ChatBot(*tiny)
    assert bot.clean_answer(" 7 Human: What is 1 + 1? Assistant: 2") == "7"
    assert bot.clean_answer("  Paris\n") == "Paris"


def test_interactive_loop_answers_skips_empty_lines_and_honours_clear_and_quit(tiny, monkeypatch, capsys):
    lines = iter([Q1, "", "   ", "clear", Q2, "quit", Q3])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    bot = ChatBot(*tiny, max_new_tokens=4, greedy=True)
    chatbot.interactive(bot, show_prompt=False)
    out = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("Assistant: ") for line in out) == 2
    assert "(history cleared)" in out
    assert [user for user, _ in bot.conversation.turns] == [Q2]  # cleared after Q1; Q3 came after quit
    assert next(lines) == Q3


# ---------------------------------------------------------------------------------------------------------
# The CLI, as a subprocess
# ---------------------------------------------------------------------------------------------------------


def test_prompt_mode_prints_the_answer_and_exits_0(tiny):
    result = run_chat("--path", "tiny", "--prompt", Q1, "--greedy", "--max_new_tokens", "8")
    assert result.returncode == 0, result.stderr
    model, tokenizer = tiny
    expected = generate(model, tokenizer, [format_turns(tokenizer, [(Q1, None)])], max_new_tokens=8, greedy=True)
    assert result.stdout == one_line(ChatBot(*tiny).clean_answer(expected[0])) + "\n"


def test_an_answer_cut_at_max_new_tokens_gets_a_note_on_stderr(tiny, monkeypatch, capsys):
    import copy

    import torch

    model, tokenizer = tiny
    bot = ChatBot(model, tokenizer, max_new_tokens=8, greedy=True)
    answer = chatbot.answer_turn(bot, Q1, show_prompt=False)  # the untrained model does not stop within 8 tokens
    out, err = capsys.readouterr()
    assert bot.last_hit_limit and out == ""
    assert err == ("(answer cut at --max_new_tokens 8 before its end; give a larger --max_new_tokens for longer "
                   "answers)\n")
    with torch.no_grad():  # the model "ends its turn" at its greedy first token: no note
        ids = torch.tensor(tokenize_prompts(tokenizer, [format_turns(tokenizer, [(Q1, None)])]))
        first = int(model(input_ids=ids).logits[0, -1].argmax())
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = [tokenizer.eos_token_id, first]
    monkeypatch.setattr(model, "generation_config", config)
    bot.clear()
    assert chatbot.answer_turn(bot, Q1, show_prompt=False) == "" != answer
    assert not bot.last_hit_limit and capsys.readouterr().err == ""


def test_the_answer_length_defaults_to_the_one_the_model_was_trained_to(tiny, tmp_path):
    import shutil

    from utils.model.model_utils import resolve_model_path
    from utils.model.save import TRAINING_SETTINGS

    actor = tmp_path / "actor"
    shutil.copytree(resolve_model_path("tiny"), actor)
    (actor / TRAINING_SETTINGS).write_text('{"step": 3, "max_prompt_seq_len": 32, "max_answer_seq_len": 3}')
    result = run_chat("--path", str(actor), "--prompt", Q1, "--greedy")
    assert result.returncode == 0, result.stderr
    model, tokenizer = tiny
    prompt = [format_turns(tokenizer, [(Q1, None)])]
    three, eight = (generate(model, tokenizer, prompt, max_new_tokens=n, greedy=True)[0] for n in (3, 8))
    assert three != eight  # the untrained tiny model does not stop by itself within 8 tokens
    assert result.stdout == one_line(ChatBot(*tiny).clean_answer(three)) + "\n"


def test_stdin_mode_is_one_conversation_with_clear_and_quit():
    stdin = f"{Q1}\n{Q2}\n\nclear\n{Q3}\nquit\nWhat is 1 + 1?\n"
    result = run_chat("--path", "tiny", "--greedy", "--max_new_tokens", "6", "--show_prompt", stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3  # Q1, Q2, Q3: the blank line skipped, nothing after quit
    prompts = [line for line in result.stderr.splitlines() if line.startswith("prompt: ")]
    assert len(prompts) == 3
    assert prompts[0] == f"prompt: {task.format_prompt(Q1)!r}"
    assert prompts[1].startswith(f"prompt: {task.format_prompt(Q1)!r}"[:-1])  # the history: turn 1 first
    assert task.format_prompt(Q2) in prompts[1] and prompts[1].count("Human:") == 2
    assert prompts[2] == f"prompt: {task.format_prompt(Q3)!r}"  # after clear


@pytest.mark.parametrize("args, message", [
    (["--path", "/nonexistent/actor"], "error: model path /nonexistent/actor does not exist"),
    (["--path", "tiny", "--prompt", "  "],
     "error: argument --prompt: the value is blank: give one, or leave --prompt out"),
])
def test_errors_are_one_line_and_exit_2(args, message):
    result = run_chat(*args)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [message]
    assert result.stdout == ""
