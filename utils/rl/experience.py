"""One batch of experience: sampled answers to prompts and everything the policy update needs about them.

Shapes: `seq` is (B, P + A): P left-padded prompt columns, then A answer columns. Per-token tensors of the answer
(logprobs, ref_logprobs, values, advantages, returns) are (B, A); `action_mask` marks the real answer tokens, the
first EOS included, so the policy is rewarded (or not) for stopping.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch


@dataclass
class Experience:
    seq: torch.Tensor  # (B, P + A) prompt and answer token ids
    attention_mask: torch.Tensor  # (B, P + A) 1 on real prompt and answer tokens
    action_mask: torch.Tensor  # (B, A) 1 on real answer tokens, EOS included
    prompt_len: int  # P
    logprobs: torch.Tensor  # (B, A) log pi_old(a_t | s_t) at the rollout temperature
    ref_logprobs: torch.Tensor  # (B, A) log pi_ref(a_t | s_t)
    advantages: torch.Tensor  # (B, A)
    values: torch.Tensor | None = None  # (B, A) V_old(s_t); None without a critic
    returns: torch.Tensor | None = None  # (B, A) value targets; None without a critic
    positive: torch.Tensor | None = None  # (B,) bool: scored at least --positive_score_threshold; None unasked
    stats: dict = field(default_factory=dict)  # per-batch scalars for logging

    def split(self, minibatch_size: int) -> list[Experience]:
        """Minibatches of `minibatch_size` rows (the row count must divide); stats stay with each."""
        rows = self.seq.shape[0]
        if rows % minibatch_size:
            raise ValueError(f"{rows} rows do not split into minibatches of {minibatch_size}")
        return [dataclasses.replace(self, **{f.name: getattr(self, f.name)[start:start + minibatch_size]
                                             for f in dataclasses.fields(self)
                                             if torch.is_tensor(getattr(self, f.name))})
                for start in range(0, rows, minibatch_size)]


def answer_action_mask(answers: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 on each answer token up to and including the first EOS (all tokens when there is none)."""
    is_eos = answers == eos_token_id
    positions = torch.arange(answers.shape[1], device=answers.device)
    first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1), answers.shape[1])
    return (positions.unsqueeze(0) <= first_eos.unsqueeze(1)).to(torch.float32)
