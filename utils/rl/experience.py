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

    @property
    def rows(self) -> int:
        return self.seq.shape[0]

    def split(self, minibatch_size: int, ragged: bool = False) -> list[Experience]:
        """Minibatches of `minibatch_size` rows; stats stay with each. The row count must divide, unless `ragged`:
        then the last minibatch holds what is left."""
        if self.rows % minibatch_size and not ragged:
            raise ValueError(f"{self.rows} rows do not split into minibatches of {minibatch_size}")
        return [self.select(slice(start, start + minibatch_size)) for start in range(0, self.rows, minibatch_size)]

    def select(self, rows) -> Experience:
        """The experience of `rows` only (a slice, indices or a (B,) bool mask); stats stay."""
        return dataclasses.replace(self, **{name: tensor[rows] for name, tensor in self._tensors().items()})

    def _tensors(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if torch.is_tensor(getattr(self, f.name))}


PER_TOKEN = ("action_mask", "logprobs", "ref_logprobs", "advantages", "values", "returns")
"""The (B, A) fields of an Experience."""


def concat_experiences(experiences: list[Experience], pad_token_id: int) -> Experience:
    """One experience of the rows of `experiences` (one round's prompt batches, each with its own prompt and
    answer widths): prompts left-padded and answers right-padded to the widest, the padding out of the attention
    mask and 0 in every per-token tensor (so out of every loss); the stats of the first."""
    if len(experiences) == 1:
        return experiences[0]
    prompt_len = max(exp.prompt_len for exp in experiences)
    answer_len = max(exp.seq.shape[1] - exp.prompt_len for exp in experiences)

    def widen(exp):
        left, right = prompt_len - exp.prompt_len, answer_len - (exp.seq.shape[1] - exp.prompt_len)
        per_token = {name: torch.nn.functional.pad(getattr(exp, name), (0, right))
                     for name in PER_TOKEN if getattr(exp, name) is not None}
        return dataclasses.replace(exp, seq=torch.nn.functional.pad(exp.seq, (left, right), value=pad_token_id),
                                   attention_mask=torch.nn.functional.pad(exp.attention_mask, (left, right)),
                                   prompt_len=prompt_len, **per_token)

    wide = [widen(exp) for exp in experiences]
    return dataclasses.replace(wide[0], **{name: torch.cat([exp._tensors()[name] for exp in wide])
                                           for name in wide[0]._tensors()})


def answer_action_mask(answers: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 on each answer token up to and including the first EOS (all tokens when there is none)."""
    is_eos = answers == eos_token_id
    positions = torch.arange(answers.shape[1], device=answers.device)
    first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1), answers.shape[1])
    return (positions.unsqueeze(0) <= first_eos.unsqueeze(1)).to(torch.float32)
