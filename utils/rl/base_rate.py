"""An answer's base rate: the reward it earns on questions it was not asked.

A reward function that checks an answer against the question's right answer also pays an answer that ignores the
question, whenever it happens to be right: "1" to every gcd question of small numbers is right about one time in
two. Group-relative advantages push a policy toward such an answer: where it is right it beats the group's other
answers, where it is wrong it only ties with them (every wrong answer scores 0). The policy then learns to say the
most common answer to every question, a constant answer, and its score rises without the skill.

`--answer_base_rate K` subtracts from each answer's reward its mean reward on K reference prompts, training
prompts drawn once at the start (the answer's own prompt left out): what the answer earns without reading the
question. A constant answer then earns nothing in expectation, a wrong common answer costs more than a wrong rare
one, and an answer is rewarded for what it earns beyond a guess. The reward function is called once a round, on
every (reference prompt, answer) pair together.
"""
from __future__ import annotations

import random

import torch

from utils.rl.reward_fns import call_reward_fn


def reference_prompts(samples, count: int, seed: int) -> list[str]:
    """`count` distinct prompt texts of `samples` (dicts with a "prompt"), drawn with `seed`: fewer if the data
    has fewer."""
    texts = list(dict.fromkeys(sample["prompt"] for sample in samples if sample.get("prompt")))
    return random.Random(seed).sample(texts, min(count, len(texts)))


class AnswerBaseRate:
    """Each answer's mean reward on the reference prompts other than its own (see the module docstring)."""

    def __init__(self, reward_fn, name: str, prompts: list[str]):
        if len(prompts) < 2:
            raise ValueError(f"an answer's base rate needs at least 2 reference prompts, not {len(prompts)}")
        self.reward_fn, self.name, self.prompts = reward_fn, name, list(prompts)

    def __call__(self, prompts: list[str], answers: list[str]) -> torch.Tensor:
        """(B,) float32: answer i's mean reward on the reference prompts that are not prompts[i]."""
        pairs = [(reference, answer) for answer in answers for reference in self.prompts]
        scores = call_reward_fn(self.reward_fn, self.name, [p for p, _ in pairs], [a for _, a in pairs])
        scores = scores.view(len(answers), len(self.prompts))
        others = torch.tensor([[reference != prompt for reference in self.prompts] for prompt in prompts],
                              dtype=scores.dtype)
        return (scores * others).sum(1) / others.sum(1)
