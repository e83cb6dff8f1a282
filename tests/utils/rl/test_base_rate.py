"""An answer's base rate (utils/rl/base_rate.py): its mean reward on reference prompts other than its own, so that
a constant answer earns nothing in expectation; the reference prompts drawn once, distinct and by the seed."""
import pytest
import torch

from utils.rl.base_rate import AnswerBaseRate, reference_prompts
from utils.rl.reward_fns import builtin_reward_fn
from utils.runtime.errors import ChatRLHFError

# A gcd-like task: the right answer of each question; "1" is right for three of the five.
RIGHT = {"q1": "1", "q2": "1", "q3": "1", "q4": "2", "q5": "3"}


def exact(prompts, answers):
    return [float(RIGHT[prompt] == answer) for prompt, answer in zip(prompts, answers)]


def test_each_answer_gets_its_mean_reward_on_the_other_reference_prompts():
    base_rate = AnswerBaseRate(exact, "exact", list(RIGHT))
    rates = base_rate(["q1", "q4", "q9", "q5"], ["1", "1", "2", "7"])
    # "1" to q1: right on q2, q3 of the other four -> 2/4; "1" to q4: right on q1-q3 of q1, q2, q3, q5 -> 3/4;
    # "2" to q9 (not a reference): right on q4 of all five -> 1/5; "7" is right nowhere
    torch.testing.assert_close(rates, torch.tensor([0.5, 0.75, 0.2, 0.0]))
    assert rates.dtype == torch.float32


def test_a_constant_answer_earns_nothing_in_expectation_and_the_skill_does():
    base_rate = AnswerBaseRate(exact, "exact", list(RIGHT))
    questions = list(RIGHT)
    constant = ["1"] * len(questions)
    right = [RIGHT[question] for question in questions]
    for answers in (constant, ["2"] * 5, ["9"] * 5):  # every constant: exactly 0 over the reference questions
        corrected = torch.tensor(exact(questions, answers)) - base_rate(questions, answers)
        assert corrected.mean().item() == pytest.approx(0.0, abs=1e-6)
    # a guess that varies without reading the question: right once (0.2), base rates 0.5, 0.25, 0.25, 0.75, 0.25
    guesses = ["1", "2", "3", "1", "2"]
    corrected = torch.tensor(exact(questions, guesses)) - base_rate(questions, guesses)
    assert corrected.mean().item() == pytest.approx(0.2 - 0.4)
    skilled = torch.tensor(exact(questions, right)) - base_rate(questions, right)
    assert skilled.mean().item() > 0.5
    # the uncorrected reward pays the constant answer 3/5 of the skill's reward
    assert sum(exact(questions, constant)) / sum(exact(questions, right)) == pytest.approx(0.6)


def test_it_wraps_any_reward_function_and_its_checks():
    prompts = [" Human: What is 7 + 12? Assistant:", ' Human: Reverse the word "cat". Assistant:',
               " Human: What is 3 + 4? Assistant:"]
    base_rate = AnswerBaseRate(builtin_reward_fn, "builtin", prompts)
    # " 19" to the first: on the reversal 0, on 3 + 4 the right format only (0.25)
    torch.testing.assert_close(base_rate(prompts[:1], [" 19"]), torch.tensor([0.125]))

    def broken(prompts, answers):
        return [1.0]

    with pytest.raises(ChatRLHFError, match="--reward_fn mine"):
        AnswerBaseRate(broken, "mine", prompts)(prompts[:1], [" 19"])
    with pytest.raises(ValueError, match="at least 2 reference prompts"):
        AnswerBaseRate(exact, "exact", ["q1"])


def test_reference_prompts_are_distinct_drawn_by_the_seed_and_at_most_the_datas():
    samples = [{"prompt": f"q{i % 7}"} for i in range(30)] + [{"prompt": None}]
    drawn = reference_prompts(samples, 5, seed=3)
    assert len(drawn) == len(set(drawn)) == 5 and set(drawn) <= {f"q{i}" for i in range(7)}
    assert reference_prompts(samples, 5, seed=3) == drawn
    assert any(reference_prompts(samples, 5, seed=s) != drawn for s in range(4, 10))
    assert sorted(reference_prompts(samples, 50, seed=3)) == sorted(f"q{i}" for i in range(7))
