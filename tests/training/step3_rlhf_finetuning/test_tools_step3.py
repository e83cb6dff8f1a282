"""Step 3 with --tools: multi-turn experience whose tool outputs are context, never trained on; the reward reads
the final answer; and the whole step (real launcher, real sandbox, the built-in task) runs and reports tool
statistics, in its log, its evaluations and metrics.json."""
import json
import re

import pytest
import torch
from test_critic_free import GROUP, build_engine, make_args, make_trainer, prompt_batch
from test_step3_e2e import run_step3

from inference.tool_rollout import ToolRollout
from utils.data.data_utils import tokenize_answer
from utils.runtime.errors import ConfigError
from utils.runtime.tool_format import ToolFormat

FORMAT = ToolFormat()
# (model text, tool text, model text) of each answer: the group of prompt 0 ("What is 7 + 12?") calls the tool.
TURNS = [(" <tool>print(7 + 12)</tool>", "<output>19</output>", " 19"),
         (" <tool>print(7 + 11)</tool>", "<output>18</output>", " 18"),
         (" 19", "", ""), (" <tool>print(7 * 12)</tool>", "<output>84</output>", " 84")] + [(" CAT", "", "")] * GROUP
SCORES = [1.0, 0.5, 1.0, 0.25] + [1.0] * GROUP


@pytest.fixture(scope="module")
def engine(distributed, step3_model_dirs, tiny_tokenizer):
    engine = build_engine(step3_model_dirs[0], None, tiny_tokenizer, "--tools", "python")
    yield engine
    del engine


def fake_rollout(trainer, tokenizer, prompts, prompt_mask):
    """Make `trainer` answer with TURNS: model tokens (the last with EOS), the tool's tokens between them."""
    rows, actions = [], []
    for first, tool, last in TURNS:
        ids = [tokenizer.encode(first, add_special_tokens=False), tokenizer.encode(tool, add_special_tokens=False),
               tokenize_answer(tokenizer, last) if last else []]
        if not last:
            ids[0] = tokenize_answer(tokenizer, first)
        rows.append(ids[0] + ids[1] + ids[2])
        actions.append([1] * len(ids[0]) + [0] * len(ids[1]) + [1] * len(ids[2]))
    width = max(map(len, rows))
    answers = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
    action_mask = torch.tensor([row + [0] * (width - len(row)) for row in actions], dtype=torch.float32)
    real = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows], dtype=prompt_mask.dtype)
    group_prompts, group_mask = prompts.repeat_interleave(GROUP, 0), prompt_mask.repeat_interleave(GROUP, 0)

    def generate(prompt_ids, mask):
        assert torch.equal(prompt_ids, group_prompts)
        return ToolRollout(torch.cat([group_prompts, answers], 1), torch.cat([group_mask, real], 1), action_mask,
                           torch.zeros_like(action_mask), calls=[1, 1, 0, 1] + [0] * GROUP,
                           successes=[1, 1, 0, 1] + [0] * GROUP)

    trainer.generate_with_tools = generate
    return action_mask


def test_tool_outputs_are_context_never_loss_and_the_reward_reads_the_final_answer(engine, tiny_tokenizer):
    trainer = make_trainer(engine, use_kl_loss=True)
    assert trainer.tools is not None and trainer.tools.format == FORMAT
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    action_mask = fake_rollout(trainer, tiny_tokenizer, prompts, prompt_mask)
    exp = trainer.generate_experience(prompts, prompt_mask, texts)
    assert torch.equal(exp.action_mask, action_mask)
    assert exp.stats["score"] == pytest.approx(sum(SCORES) / len(SCORES))  # " 19" after the output: right
    assert exp.stats["tool_call_rate"] == pytest.approx(3 / 8) and exp.stats["tool_success_rate"] == 1.0
    tool_positions = (exp.attention_mask[:, exp.prompt_len:] == 1) & (action_mask == 0)
    assert tool_positions.sum() > 0
    assert (exp.advantages[tool_positions] == 0).all() and (exp.advantages[action_mask == 1] != 0).any()
    # The actor's loss does not move with anything at a tool position (junk log-probs and advantages there).
    logprobs = trainer.answer_logprobs(trainer.actor, exp.seq, exp.attention_mask, exp.prompt_len)
    loss, _ = trainer.actor_loss(logprobs, exp, exp.action_mask)
    junk = exp.split(len(TURNS))[0]
    junk.logprobs = exp.logprobs + 5.0 * tool_positions
    junk.advantages = exp.advantages + 3.0 * tool_positions
    junk_loss, _ = trainer.actor_loss(logprobs + 7.0 * tool_positions, junk, exp.action_mask)
    assert torch.equal(loss, junk_loss)


def test_tools_refuse_zero3_over_several_processes(engine, monkeypatch):
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *args: 2)
    with pytest.raises(ConfigError, match="--tools runs each rank's turns on its own"):
        make_trainer(engine, actor_zero_stage=3)


@pytest.mark.e2e
def test_step3_runs_with_the_python_tool_and_reports_tool_statistics(step3_model_dirs, tmp_path):
    """The untrained tiny actor seldom if ever writes a call: the run must still go end to end and say so (about
    150 s: `pytest -m e2e`)."""
    out = tmp_path / "out"
    result = run_step3("single_gpu", (step3_model_dirs[0], ""), 0, 0, out, "--advantage_estimator", "grpo",
                       "--num_samples_per_prompt", "2", "--reward_fn", "builtin", "--tools", "python",
                       "--max_tool_calls", "1", "--eval_interval", "2", "--eval_prompts", "4",
                       "--per_device_training_batch_size", "4")
    assert re.search(r"step 2/2.*tool_call_rate", result.stdout)
    assert re.search(r"eval at step 2 .*all_without_tools=.*tool_call_rate=", result.stdout)
    metrics = json.loads((out / "metrics.json").read_text())
    for decoding in ("sampled", "greedy"):
        for figure in ("all_without_tools", "tool_calls", "tool_call_rate", "tool_success_rate"):
            assert 0 <= metrics[f"heldout_{decoding}_{figure}_end"] <= 1, (decoding, figure)
    assert metrics["steps"] == 2


@pytest.mark.parametrize("flags, message", [
    (["--tools", "bash"], "argument --tools: invalid choice: 'bash'"),
    (["--tools", "python", "--max_tool_calls", "0"], "--max_tool_calls must be at least 1, not 0"),
    (["--tools", "python", "--tool_timeout", "0"],
     "--tool_timeout must be a positive number of seconds, at most 1000000, not 0.0"),
    (["--tools", "python", "--tool_tags", "<t>", "</t>", "<t>", "</o>"], "--tool_tags: the tag '<t>' is inside"),
])
def test_bad_tool_flags_are_refused(step3_model_dirs, flags, message, capsys):
    with pytest.raises((ConfigError, SystemExit)) as err:
        make_args(step3_model_dirs[0], None, *flags)
    assert message in (str(err.value) if err.type is ConfigError else capsys.readouterr().err)
