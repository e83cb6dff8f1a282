"""Tests of inference/tool_rollout.py: answers of several turns whose tool outputs are context, never actions, and
whose sampled log-probs equal a training forward pass over the finished trajectory. A random Llama with the tiny
tokenizer answers, its output layer biased towards the tags (single characters) and EOS so that it calls the tool
often and ends its answers (a trained model writes `<tool>...</tool>`)."""
import pytest
import torch

from inference.generation import tokenize_prompts
from inference.tool_rollout import output_token_ids, run_calls, tool_rollout
from utils.data.data_utils import attention_mask_left, pad_left
from utils.runtime.tool_format import ToolFormat
from utils.model.model_utils import answer_logits
from utils.rl.tokens import logprobs_from_logits
from utils.runtime.sandbox import TOOLS, ToolResult

pytestmark = pytest.mark.usefixtures("one_thread")

FORMAT = ToolFormat("3", "5", "[", "]")
QUESTIONS = ["What is 7 + 12?", "hi", "Which city is the capital of France?", "2 + 2?"]
TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2,
                         tie_word_embeddings=False, pad_token_id=tiny_tokenizer.pad_token_id)
    model = LlamaForCausalLM(config).eval()
    head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=True)
    head.weight.data.copy_(model.lm_head.weight.data)
    head.bias.data.zero_()
    for text, bias in ((FORMAT.call_open, 3.0), (FORMAT.call_close, 3.0), (tiny_tokenizer.eos_token, 1.5)):
        head.bias.data[tiny_tokenizer.convert_tokens_to_ids(text)] = bias
    model.lm_head = head
    return model


class FakeTool:
    """Answers every call with the same text; every other call fails. Records the code it was given."""

    def __init__(self):
        self.codes = []

    def __call__(self, code, timeout):
        self.codes.append(code)
        return ToolResult("ok", len(self.codes) % 2 == 1, "ok" if len(self.codes) % 2 else "error")


def prompts(tokenizer, group=1):
    rows = tokenize_prompts(tokenizer, [f" Human: {q} Assistant:" for q in QUESTIONS for _ in range(group)])
    return pad_left(rows, tokenizer.pad_token_id), attention_mask_left(rows)


def rollout(model, tokenizer, group=1, max_tool_calls=3, max_new_tokens=40, tool=None, seed=0):
    torch.manual_seed(seed)
    input_ids, attention_mask = prompts(tokenizer, group)
    return tool_rollout(model, tokenizer, input_ids, attention_mask, max_new_tokens, tool or FakeTool(), FORMAT,
                        max_tool_calls, temperature=TEMPERATURE, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)


@pytest.mark.parametrize("group", [1, 3])
def test_tool_outputs_are_context_and_logprobs_equal_a_training_pass(model, tiny_tokenizer, group):
    """group 3: rows repeat their prompt, so the training pass runs each prompt once (answer_logits' cache path)."""
    out = rollout(model, tiny_tokenizer, group)
    assert sum(out.calls) > 0
    holes = (out.action_mask[:, :-1] == 0) & (out.action_mask[:, 1:] == 1)  # a tool output, then the model again
    assert holes.any()
    real = out.attention_mask[:, out.prompt_len:]
    assert bool(((out.action_mask == 1) <= (real == 1)).all())  # every action is a real token
    for row, actions, mask, calls in zip(out.seq[:, out.prompt_len:], out.action_mask, real, out.calls):
        tool_text = tiny_tokenizer.decode(row[(mask == 1) & (actions == 0)])
        assert tool_text.count(FORMAT.output_open) == calls  # each call's output block, and only it, is tool text
    with torch.no_grad():
        logits = answer_logits(model, out.seq, out.attention_mask, out.prompt_len)
    training = logprobs_from_logits(logits, out.seq[:, out.prompt_len:], TEMPERATURE) * out.action_mask
    torch.testing.assert_close(training, out.logprobs, atol=1e-4, rtol=0)


def test_calls_and_tokens_stay_within_their_limits(model, tiny_tokenizer):
    tool = FakeTool()
    out = rollout(model, tiny_tokenizer, group=2, max_tool_calls=1, max_new_tokens=24, tool=tool)
    assert max(out.calls) == 1 and 0 < len(tool.codes) <= sum(out.calls)  # a closing tag alone is a failed call
    assert int(out.attention_mask[:, out.prompt_len:].sum(1).max()) <= 24
    assert sum(out.successes) == (len(tool.codes) + 1) // 2  # FakeTool fails every other call
    stats = out.stats()
    assert stats["tool_calls"] == sum(out.calls) / len(out.calls)
    assert 0 < stats["tool_call_rate"] <= 1 and stats["tool_success_rate"] == sum(out.successes) / sum(out.calls)


def test_without_calls_allowed_the_rollout_is_the_plain_sampler(model, tiny_tokenizer):
    """max_tool_calls 0: one turn, no stop at the closing tag: the same tokens as `sample` from the same seed."""
    from inference.sampling import sample

    out = rollout(model, tiny_tokenizer, max_tool_calls=0, max_new_tokens=12)
    torch.manual_seed(0)
    input_ids, attention_mask = prompts(tiny_tokenizer)
    seq = sample(model, input_ids, attention_mask, 12, TEMPERATURE, eos_token_id=[tiny_tokenizer.eos_token_id],
                 pad_token_id=tiny_tokenizer.pad_token_id)
    assert sum(out.calls) == 0 and bool((out.action_mask == out.attention_mask[:, out.prompt_len:]).all())
    plain = seq[:, input_ids.shape[1]:]
    assert torch.equal(out.seq[:, out.prompt_len:][:, :plain.shape[1]] * out.action_mask[:, :plain.shape[1]].long(),
                       plain * out.action_mask[:, :plain.shape[1]].long())


def test_the_real_sandbox_answers_a_call_and_special_tokens_are_taken_out(tiny_tokenizer):
    python = TOOLS["python"].run
    fmt = ToolFormat()
    ok, hang, missing = run_calls(python, fmt, ["Let me compute <tool>print(2 + 3)</tool>",
                                                "<tool>while True: pass</tool>", "no call </tool>"], timeout=1)
    assert (ok.output, ok.ok) == ("5\n", True)
    assert (hang.ok, hang.status) == (False, "timeout")
    assert not missing.ok and "no <tool>" in missing.output
    ids = output_token_ids(tiny_tokenizer, f"<output>1{tiny_tokenizer.eos_token}2</output>")
    assert tiny_tokenizer.eos_token_id not in ids and tiny_tokenizer.decode(ids) == "<output>12</output>"


def test_evaluation_scores_final_answers_with_and_without_the_tool(model, tiny_tokenizer):
    """evaluate_models with tools: the checker sees final answers (after the last output block), and each decoding
    reports the score without the tool and how often the tool was called and ran cleanly."""
    from inference.evaluation import evaluate_models
    from utils.runtime.tool_format import ToolUse

    seen = []

    def checker(prompts, answers):
        seen.extend(answers)
        return {"all": sum(len(answer) for answer in answers) / len(answers)}

    tools = ToolUse(FakeTool(), FORMAT, max_calls=2, timeout=1.0)
    prompts = [f" Human: {q} Assistant:" for q in QUESTIONS]
    result = evaluate_models({"m": (model, tiny_tokenizer)}, prompts, max_new_tokens=30, seed=3, checker=checker,
                             tools=tools)["m"]
    for decoding in ("sampled", "greedy"):
        scores, answers = result[decoding], result["answers"][decoding]
        calls = [answer.count(FORMAT.output_open) for answer in answers]
        assert scores["tool_call_rate"] == sum(c > 0 for c in calls) / len(calls)
        assert 0 <= scores["tool_success_rate"] <= 1 and "all_without_tools" in scores
        finals = [FORMAT.final_answer(answer) for answer in answers]
        assert scores["all"] == sum(map(len, finals)) / len(finals)
    assert result["sampled"]["tool_call_rate"] > 0
    assert not any(FORMAT.output_close in answer for answer in seen)


def test_the_sampled_decoding_without_the_tool_answers_each_prompt_once(model, tiny_tokenizer):
    """With several samples a prompt, the answers without the tool (a measure of what the tool adds) are one a
    prompt: the checker scores 3 x n answers with the tool, then n without, for each decoding."""
    from inference.evaluation import evaluate_models
    from utils.runtime.tool_format import ToolUse

    sizes = []

    def checker(prompts, answers):
        sizes.append((len(prompts), len(answers)))
        return {"all": 0.0}

    prompts = [f" Human: {q} Assistant:" for q in QUESTIONS]
    evaluate_models({"m": (model, tiny_tokenizer)}, prompts, max_new_tokens=20, seed=3, checker=checker,
                    tools=ToolUse(FakeTool(), FORMAT, max_calls=1, timeout=1.0), samples_per_prompt=3)
    n = len(prompts)
    sizes = [size for size in sizes if size != (1, 1)]  # answer_stats' calls on one answer each, apart
    assert sizes[:2] == [(3 * n, 3 * n), (n, n)]  # sampled: with the tool, then without
    assert sizes[2:4] == [(n, n), (n, n)]  # greedy: one answer a prompt either way


def test_chat_answers_call_the_tool(model, tiny_tokenizer):
    from inference.chatbot import ChatBot
    from utils.runtime.tool_format import ToolUse

    bot = ChatBot(model, tiny_tokenizer, max_new_tokens=30, temperature=1.0, top_p=1.0, seed=0,
                  tools=ToolUse(FakeTool(), FORMAT, max_calls=1, timeout=1.0))
    answers = [bot.reply(question) for question in QUESTIONS]
    assert any(FORMAT.output_close in answer.partition(FORMAT.call_close)[2] for answer in answers)  # an output block
