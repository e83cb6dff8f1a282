"""Answers of several turns: the actor writes, calls a tool, reads its output, and writes on.

Each turn samples the running rows' contexts (prompt and answer so far) with `inference.sampling.sample`, which
stops a row at its EOS or at the closing tag of a tool call (a stop-string check on each row's last tokens per
step). A row stopped at a call has its code run by the tool (`utils.runtime.sandbox`: in parallel, each in its
own process), and the output block (`utils.data.tool_format`) is tokenized and appended to its answer as
context: attended to, never an action. Rows go on until their EOS, `max_tool_calls` calls (after the last, the
closing tag no longer stops a row), or `max_new_tokens` tokens of answer in all, model and tool tokens together.

The layout is step 3's: `seq` (B, P + A) is the left-padded prompts, then A answer columns right-padded; the
answer mask (`attention_mask[:, P:]`) is 1 on every answer token, the action mask only on the tokens the model
sampled (its EOS included). Each turn runs its rows' whole context again (no cache is kept between turns), with
positions from the mask, so the log-probs the sampler gives equal those of one training forward pass over the
finished trajectory to float rounding (tests/inference/test_tool_rollout.py).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from inference.sampling import sample
from utils.data.data_utils import attention_mask_left, pad_left
from utils.runtime.sandbox import ToolResult

TOOL_WORKERS = 4
"""Tool calls of one turn run at once (each is a process of its own, mostly waiting on its start-up)."""


@dataclass
class ToolRollout:
    """Trajectories of a batch and what their tool calls did."""
    seq: torch.Tensor  # (B, P + A) prompts (left-padded) and answers (right-padded with the pad token)
    attention_mask: torch.Tensor  # (B, P + A) 1 on real prompt, model and tool tokens
    action_mask: torch.Tensor  # (B, A) float: 1 on the tokens the model sampled, EOS included
    logprobs: torch.Tensor  # (B, A) the sampler's log pi(a_t | s_t) of the actions, 0 elsewhere
    calls: list = field(default_factory=list)  # tool calls of each row
    successes: list = field(default_factory=list)  # of them, those whose code ran cleanly (ToolResult.ok)

    @property
    def prompt_len(self):
        return self.seq.shape[1] - self.action_mask.shape[1]

    def stats(self):
        return tool_stats(self.calls, self.successes)


def tool_stats(calls, successes):
    """{"tool_calls": mean calls per answer, "tool_call_rate": the share of answers with at least one call,
    "tool_success_rate": the share of calls that ran cleanly (0 without a call)} of per-answer counts."""
    rows, total = len(calls), sum(calls)
    return {"tool_calls": total / max(rows, 1), "tool_call_rate": sum(c > 0 for c in calls) / max(rows, 1),
            "tool_success_rate": sum(successes) / total if total else 0.0}


class StopAtText:
    """`sample`'s stop check: a row ends at the step whose token completes `text` in its new tokens (the tokens it
    has seen of each row are kept, `hit` says which rows it ended)."""

    def __init__(self, tokenizer, text, rows):
        self.tokenizer, self.text, self.window = tokenizer, text, len(text) + 1
        self.tokens = [[] for _ in range(rows)]
        self.hit = [False] * rows

    def __call__(self, rows, tokens, running):
        ended = torch.zeros_like(running)
        for i in running.nonzero().flatten().tolist():
            row = int(rows[i])
            self.tokens[row].append(int(tokens[i]))
            if self.text in self.tokenizer.decode(self.tokens[row][-self.window:], skip_special_tokens=False):
                self.hit[row] = ended[i] = True
        return ended


def output_token_ids(tokenizer, text):
    """The tool output block's token ids: the text with the tokenizer's special tokens taken out first (a tool
    cannot end the answer or open a turn by printing `<|im_end|>`)."""
    for special in getattr(tokenizer, "all_special_tokens", []):
        text = text.replace(special, "")
    return tokenizer.encode(text, add_special_tokens=False)


@torch.no_grad()
def tool_rollout(model, tokenizer, input_ids, attention_mask, max_new_tokens, tool, tool_format, max_tool_calls,
                 tool_timeout=5.0, temperature=1.0, top_p=1.0, eos_token_id=None, pad_token_id=0, greedy=False):
    """Multi-turn answers to left-padded prompts (the module docstring): a ToolRollout. `tool(code, timeout) ->
    ToolResult` runs a call (utils.runtime.sandbox.TOOLS' `run`); `tool_format` is a ToolFormat; `eos_token_id`
    an id or a list of ids."""
    eos_ids = set([] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
    batch, device = input_ids.shape[0], input_ids.device
    prompts = [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]
    answers = [[] for _ in range(batch)]
    actions = [[] for _ in range(batch)]  # 1 where the model sampled the token
    logprobs = [[] for _ in range(batch)]
    calls, successes = [0] * batch, [0] * batch
    active = list(range(batch))
    for turn in range(max_tool_calls + 1):
        contexts = [prompts[b] + answers[b] for b in active]
        budget = max(max_new_tokens - len(answers[b]) for b in active)
        stop = StopAtText(tokenizer, tool_format.call_close, len(active)) if turn < max_tool_calls else None
        ids, mask = pad_left(contexts, pad_token_id).to(device), attention_mask_left(contexts).to(device)
        seq, turn_logprobs = sample(model, ids, mask, budget, temperature, top_p, list(eos_ids), pad_token_id,
                                    return_logprobs=True, greedy=greedy, stop=stop)
        called = []
        for i, b in enumerate(active):
            new, new_logprobs = seq[i, ids.shape[1]:].tolist(), turn_logprobs[i].tolist()
            if stop is not None and stop.hit[i]:
                length = len(stop.tokens[i])
            else:
                length = next((t + 1 for t, token in enumerate(new) if token in eos_ids), len(new))
            length = min(length, max_new_tokens - len(answers[b]))
            answers[b] += new[:length]
            actions[b] += [1] * length
            logprobs[b] += new_logprobs[:length]
            if stop is not None and stop.hit[i] and len(answers[b]) < max_new_tokens:
                called.append((b, tokenizer.decode(new[:length], skip_special_tokens=False)))
        results = run_calls(tool, tool_format, [text for _, text in called], tool_timeout)
        for (b, text), result in zip(called, results):
            calls[b] += 1
            successes[b] += int(result.ok)
            block = tool_format.output(result.output)
            overshoot = tool_format.overshoot(text)
            if overshoot and block.startswith(overshoot):  # the closing tag's token carried the block's start
                block = block[len(overshoot):]
            tokens = output_token_ids(tokenizer, block)[:max_new_tokens - len(answers[b])]
            answers[b] += tokens
            actions[b] += [0] * len(tokens)
            logprobs[b] += [0.0] * len(tokens)
        active = [b for b, _ in called if len(answers[b]) < max_new_tokens]
        if not active:
            break
    width = max(1, max(len(answer) for answer in answers))

    def right(rows, value, dtype):
        return torch.tensor([row + [value] * (width - len(row)) for row in rows], dtype=dtype, device=device)

    answer_mask = right([[1] * len(answer) for answer in answers], 0, attention_mask.dtype)
    return ToolRollout(seq=torch.cat([input_ids, right(answers, pad_token_id, input_ids.dtype)], dim=1),
                       attention_mask=torch.cat([attention_mask, answer_mask], dim=1),
                       action_mask=right(actions, 0, torch.float32), logprobs=right(logprobs, 0.0, torch.float32),
                       calls=calls, successes=successes)


def run_calls(tool, tool_format, texts, timeout):
    """The tool's result for the call each turn's text ends with, TOOL_WORKERS at a time (a text without an
    opening tag gets a failed result saying so)."""
    def run(text):
        code = tool_format.parse_call(text)
        if code is None:
            return ToolResult(f"no {tool_format.call_open} before {tool_format.call_close}", False, "error")
        return tool(code, timeout=timeout)

    if len(texts) <= 1:
        return [run(text) for text in texts]
    with ThreadPoolExecutor(min(TOOL_WORKERS, len(texts))) as pool:
        return list(pool.map(run, texts))
