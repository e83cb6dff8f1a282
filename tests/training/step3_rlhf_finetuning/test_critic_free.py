"""Step 3 without a critic, on real DeepSpeed engines in this process (a world of one): GRPO, RLOO and REINFORCE++
experience on answers scored by the built-in task's checker (made-up answers, so every score and advantage is
known), no critic and no reward model created when none is asked for, groups of equal scores dropped before
the forward passes and a round refilled from more prompt batches (dynamic sampling), the KL and the NLL of well-scored answers as loss terms, the reward model and a
reward function combined by weight, and the held-out evaluation."""
import argparse
import copy
import dataclasses
import gc
import json
import math
import random

import pytest
import torch

from inference.evaluation import builtin_prompts
from training.step3_rlhf_finetuning.arguments import parse_args
from utils.data.data_utils import DataCollatorRLHF, SampleCounter, prompt_sample, tokenize_answer
from utils.rl.advantages import grpo_advantages, reinforce_pp_advantages, rloo_advantages
from utils.rl.base_rate import AnswerBaseRate
from utils.rl.kl import FixedKLController
from utils.rl.reward_fns import builtin_reward_fn, load_reward_fn
from utils.rl.rewards import compute_rewards
from utils.runtime.ds_utils import resolve_dtype
from utils.runtime.errors import ChatRLHFError
from utils.trainer.ppo_trainer import PPOTrainer
from utils.trainer.rlhf_engine import DeepSpeedRLHFEngine

GROUP = 4
PROMPTS = [" Human: What is 7 + 12? Assistant:", ' Human: Say "cat" in uppercase. Assistant:']
# Checker scores: 1 exact, 0.5 near miss (off by one), 0.25 right format only; the second group all exact.
ANSWERS = [" 19", " 18", " 5", " 19", " CAT", " CAT", " CAT", " CAT"]
SCORES = [1.0, 0.5, 0.25, 1.0, 1.0, 1.0, 1.0, 1.0]


def make_args(actor_dir, critic_dir=None, *extra):
    critic = ["--critic_model_name_or_path", str(critic_dir)] if critic_dir else []
    args = parse_args(["--actor_model_name_or_path", str(actor_dir), *critic, "--output_dir", "unused",
                       "--dtype", "fp32", "--advantage_estimator", "grpo", "--reward_fn", "builtin",
                       "--num_samples_per_prompt", str(GROUP), "--per_device_generation_batch_size", "2",
                       "--per_device_training_batch_size", "4", "--max_prompt_seq_len", "32",
                       "--max_answer_seq_len", "8", "--num_warmup_steps", "0", "--lr_scheduler_type", "constant",
                       *extra])
    args.dtype = resolve_dtype(args.dtype)
    return args


def build_engine(actor_dir, critic_dir, tokenizer, *extra):
    args = make_args(actor_dir, critic_dir, *extra)
    return DeepSpeedRLHFEngine(str(actor_dir), str(critic_dir) if critic_dir else None, tokenizer, args,
                               actor_steps=10, critic_steps=10, world_size=1)


def make_trainer(engine, function=builtin_reward_fn, base_rate=None, **overrides):
    """A trainer with the reward function `function` (and its `base_rate`) and `overrides` of the engine's
    arguments."""
    args = copy.copy(engine.args)
    for key, value in overrides.items():
        setattr(args, key, value)
    return PPOTrainer(engine, args, function, base_rate)


@pytest.fixture(scope="module")
def engine(distributed, step3_model_dirs, tiny_tokenizer):
    """Critic-free, reward function only: no critic, no reward model."""
    engine = build_engine(step3_model_dirs[0], None, tiny_tokenizer)
    yield engine
    del engine
    gc.collect()


@pytest.fixture(autouse=True)
def actor_put_back(engine):
    """Each test starts from the step-1 weights (the actor equal to the reference), whatever the last trained."""
    saved = params(engine.actor.module)
    yield
    with torch.no_grad():
        for name, param in engine.actor.module.named_parameters():
            param.copy_(saved[name])


def prompt_batch(tokenizer):
    """The two task prompts as step 3's data set and collator give them (ids left-padded, and the texts)."""
    samples = [prompt_sample(tokenizer, prompt, 32, SampleCounter("prompts")) for prompt in PROMPTS]
    batch = DataCollatorRLHF(tokenizer.pad_token_id)(samples)
    assert batch["prompt_text"] == PROMPTS
    return batch["prompt"], batch["prompt_att_mask"], batch["prompt_text"]


def fake_answers(trainer, tokenizer, answers=ANSWERS):
    """Make `trainer` answer the (repeated) prompts with these texts instead of sampling."""
    ids = [tokenize_answer(tokenizer, answer) for answer in answers]
    width = max(len(row) for row in ids)
    padded = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in ids])

    def generate(prompts, prompt_mask):
        assert prompts.shape[0] == len(answers)
        return torch.cat([prompts, padded], 1)

    trainer.generate_sequence = generate


def params(module):
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def changed(before, module):
    return {name for name, p in module.named_parameters() if not torch.equal(before[name], p.detach())}


def test_critic_free_estimators_create_no_critic_and_no_reward_model_without_one(engine, step3_model_dirs,
                                                                              tiny_tokenizer):
    assert engine.critic is None and engine.reward is None
    assert engine.actor is not None and engine.ref is not None
    with_reward_model = build_engine(*step3_model_dirs, tiny_tokenizer)
    assert with_reward_model.critic is None and with_reward_model.reward is not None
    del with_reward_model
    gc.collect()


def test_without_a_kl_term_no_reference_is_made_and_the_experience_is_the_same(engine, step3_model_dirs,
                                                                             tiny_tokenizer):
    """--kl_coef 0 without --use_kl_loss: no reference model (OpenRLHF's and verl's rule), no KL logged, and the
    experience and the update the same as with a reference whose KL weighs nothing."""
    no_kl = build_engine(step3_model_dirs[0], None, tiny_tokenizer, "--kl_coef", "0")
    assert no_kl.ref is None
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    experiences = []
    for source in (no_kl, engine):
        trainer = make_trainer(source, kl_coef=0.0)
        fake_answers(trainer, tiny_tokenizer)
        experiences.append(trainer.generate_experience(prompts, prompt_mask, texts))
    without, with_ref = experiences
    assert "kl" not in without.stats and "kl" in with_ref.stats
    for field in ("logprobs", "advantages"):
        torch.testing.assert_close(getattr(without, field), getattr(with_ref, field))
    assert without.stats["reward"] == pytest.approx(with_ref.stats["reward"])
    stats = make_trainer(no_kl, kl_coef=0.0).train_round([without], None, random.Random(0), train_actor=True)
    assert stats["trained_rows"] == len(ANSWERS) and "kl" not in stats and math.isfinite(stats["actor_loss"])
    del no_kl
    gc.collect()


def test_grpo_experience_on_the_checkers_scores(engine, tiny_tokenizer):
    trainer = make_trainer(engine, use_kl_loss=True)  # no KL in the reward: the sequence reward is the score
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    fake_answers(trainer, tiny_tokenizer)
    exp = trainer.generate_experience(prompts, prompt_mask, texts)
    rows = len(ANSWERS)
    assert exp.seq.shape[0] == rows and exp.values is None and exp.returns is None
    # Each prompt repeated GROUP times in a row.
    assert all(torch.equal(exp.seq[i, :exp.prompt_len], prompts[i // GROUP]) for i in range(rows))
    assert exp.stats["score"] == pytest.approx(sum(SCORES) / rows)
    assert exp.stats["reward"] == pytest.approx(sum(SCORES) / rows)
    assert exp.stats["zero_variance_groups"] == 1  # the CAT group
    # [1, 0.5, 0.25, 1]: mean 0.6875, advantages (r - mean) / std; the equal group gets 0 everywhere.
    expected = grpo_advantages(torch.tensor(SCORES).view(-1, GROUP)).reshape(-1)
    assert expected[:GROUP].abs().min() > 0.1
    torch.testing.assert_close(exp.advantages, expected.unsqueeze(1) * exp.action_mask, atol=1e-6, rtol=0)
    # The answers' tokens and EOS: " 19" is 3 tokens, " 5" 2, " CAT" 3.
    assert exp.action_mask.sum(1).tolist() == [4.0, 4.0, 3.0, 4.0, 4.0, 4.0, 4.0, 4.0]


def test_dr_grpo_and_rloo_advantages(engine, tiny_tokenizer):
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    groups = torch.tensor(SCORES).view(-1, GROUP)
    for overrides, expected in (({"no_std_normalization": True}, grpo_advantages(groups, False)),
                                ({"advantage_estimator": "rloo"}, rloo_advantages(groups))):
        trainer = make_trainer(engine, use_kl_loss=True, **overrides)
        fake_answers(trainer, tiny_tokenizer)
        exp = trainer.generate_experience(prompts, prompt_mask, texts)
        torch.testing.assert_close(exp.advantages[:, 0], expected.reshape(-1), atol=1e-6, rtol=0)


def test_group_reward_includes_the_kl_penalty_unless_the_kl_is_a_loss(engine, tiny_tokenizer):
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    trainer = make_trainer(engine, kl_coef=0.5)
    trainer.kl_controller = FixedKLController(0.5)
    fake_answers(trainer, tiny_tokenizer)
    with torch.no_grad():  # move the actor off the reference so the KL is not 0
        generator = torch.Generator().manual_seed(4)
        for param in engine.actor.module.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    exp = trainer.generate_experience(prompts, prompt_mask, texts)
    _, kl = compute_rewards(exp.logprobs, exp.ref_logprobs, torch.zeros(len(ANSWERS)), exp.action_mask, 0.0)
    assert kl.sum(1).abs().max() > 1e-3
    sequence_rewards = torch.tensor(SCORES) - 0.5 * kl.sum(1)
    expected = grpo_advantages(sequence_rewards.view(-1, GROUP)).reshape(-1)
    torch.testing.assert_close(exp.advantages[:, 0], expected, atol=1e-5, rtol=0)
    assert exp.stats["reward"] == pytest.approx(exp.stats["score"] - 0.5 * exp.stats["kl"], abs=1e-5)
    no_kl_reward = make_trainer(engine, kl_coef=0.5, use_kl_loss=True)
    fake_answers(no_kl_reward, tiny_tokenizer)
    assert no_kl_reward.generate_experience(prompts, prompt_mask, texts).stats["reward"] == pytest.approx(
        exp.stats["score"])


def test_reinforce_pp_whitens_the_returns_over_the_batch(engine, tiny_tokenizer):
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    trainer = make_trainer(engine, advantage_estimator="reinforce_pp", kl_coef=0.2)
    trainer.kl_controller = FixedKLController(0.2)
    fake_answers(trainer, tiny_tokenizer)
    exp = trainer.generate_experience(prompts, prompt_mask, texts)
    rewards, _ = compute_rewards(exp.logprobs, exp.ref_logprobs, torch.tensor(SCORES), exp.action_mask, 0.2)
    expected = reinforce_pp_advantages(rewards, exp.action_mask)
    torch.testing.assert_close(exp.advantages, expected, atol=1e-6, rtol=0)
    real = exp.advantages[exp.action_mask > 0]
    assert abs(real.mean().item()) < 1e-5 and real.std().item() == pytest.approx(1.0, abs=1e-4)


def test_filter_zero_variance_drops_equal_groups_before_the_forward_passes(engine, tiny_tokenizer):
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    trainer = make_trainer(engine, filter_zero_variance=True, use_kl_loss=True)
    fake_answers(trainer, tiny_tokenizer)
    forward_rows = []
    answer_logprobs = trainer.answer_logprobs
    trainer.answer_logprobs = lambda model, seq, *rest, **kw: (forward_rows.append(seq.shape[0]),
                                                               answer_logprobs(model, seq, *rest, **kw))[1]
    exp = trainer.generate_experience(prompts, prompt_mask, texts)
    assert exp.stats["zero_variance_groups"] == 1 and exp.rows == GROUP  # the CAT group (all exact) is gone
    assert forward_rows == [GROUP, GROUP]  # the actor's and the reference's pass ran on the kept rows only
    kept = trainer.tokenizer.batch_decode(exp.seq[:, exp.prompt_len:], skip_special_tokens=True)
    assert [answer.strip() for answer in kept] == ["19", "18", "5", "19"]
    assert exp.stats["score"] == pytest.approx(sum(SCORES) / len(SCORES))  # the score: every answer sampled
    full = make_trainer(engine, use_kl_loss=True)
    fake_answers(full, tiny_tokenizer)
    whole = full.generate_experience(prompts, prompt_mask, texts)
    torch.testing.assert_close(exp.advantages, whole.advantages[:GROUP])
    torch.testing.assert_close(exp.logprobs, whole.logprobs[:GROUP])
    before = params(engine.actor.module)
    stats = trainer.train_round([exp], None, random.Random(0), train_actor=True)
    assert stats["trained_rows"] == GROUP and stats["drawn_batches"] == 1
    assert "actor_loss" in stats and "kl_loss" in stats
    assert changed(before, engine.actor.module)


def test_a_round_with_every_group_dropped_trains_nothing(engine, tiny_tokenizer):
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    trainer = make_trainer(engine, filter_zero_variance=True)
    fake_answers(trainer, tiny_tokenizer, [" 19"] * GROUP + [" CAT"] * GROUP)
    exp = trainer.generate_experience(prompts, prompt_mask, texts)
    assert exp.rows == 0 and exp.stats["zero_variance_groups"] == 2 and exp.stats["kl"] == 0.0
    before = params(engine.actor.module)
    stats = trainer.train_round([exp], None, random.Random(0), train_actor=True)
    assert stats["trained_rows"] == 0 and "actor_loss" not in stats
    assert not changed(before, engine.actor.module)


def test_dynamic_sampling_draws_batches_until_a_round_is_full(engine, tiny_tokenizer):
    """--max_generation_batches: a round goes on until its kept groups fill --generation_batches batches (2
    prompts x 4 answers = 8 rows), at most that many batches; the surplus is cut and the rows of batches with
    different prompt and answer widths make one experience whose log-probs are the originals'."""
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    trainer = make_trainer(engine, filter_zero_variance=True, max_generation_batches=3)
    batches = []
    for answers in (ANSWERS, [" 19"] * GROUP + [" CAT", " cat", " CAT", " Cat"], ANSWERS):
        fake_answers(trainer, tiny_tokenizer, answers)
        batches.append(trainer.generate_experience(prompts, prompt_mask, texts))
    # The second batch: longer prompts (one more column of left padding) and its answers 3 columns wider.
    second = batches[1]
    batches[1] = dataclasses.replace(
        second, seq=torch.nn.functional.pad(second.seq, (1, 3), value=tiny_tokenizer.pad_token_id),
        attention_mask=torch.nn.functional.pad(second.attention_mask, (1, 3)), prompt_len=second.prompt_len + 1,
        **{name: torch.nn.functional.pad(getattr(second, name), (0, 3))
           for name in ("action_mask", "logprobs", "ref_logprobs", "advantages")})
    assert [exp.rows for exp in batches] == [GROUP, GROUP, GROUP]
    assert not trainer.round_ready(batches[:1]) and trainer.round_ready(batches[:2])
    empty = batches[1].select(slice(0, 0))
    assert trainer.round_ready([empty] * 3) and not trainer.round_ready([empty] * 2)  # 3: the most it may draw
    minibatches = trainer.round_minibatches(batches)
    assert [mb.rows for mb in minibatches] == [4, 4]  # 8 of the 12 rows kept: the round's rows
    merged = minibatches[0]
    for mb, exp in zip(minibatches, batches):
        mask = mb.action_mask > 0
        assert mask.sum() == (exp.action_mask > 0).sum()
        logprobs = trainer.answer_logprobs(engine.actor, mb.seq, mb.attention_mask, mb.prompt_len)
        torch.testing.assert_close(logprobs[mask], exp.logprobs[exp.action_mask > 0], atol=1e-5, rtol=0)
        torch.testing.assert_close(mb.advantages[mask], exp.advantages[exp.action_mask > 0])
    assert merged.prompt_len == batches[1].prompt_len
    short = trainer.round_minibatches([batches[0], batches[1].select(slice(0, 0))])
    assert [mb.rows for mb in short] == [4]
    stats = trainer.train_round(batches, None, random.Random(0), train_actor=True)
    assert stats["trained_rows"] == 8 and stats["drawn_batches"] == 3
    trainer.args.per_device_training_batch_size = 3
    assert [mb.rows for mb in trainer.round_minibatches(batches)] == [3, 3, 2]  # the last one short


def test_reward_model_and_reward_function_combined_by_weight(distributed, step3_model_dirs, tiny_tokenizer):
    engine = build_engine(*step3_model_dirs, tiny_tokenizer, "--reward_model_weight", "0.5", "--reward_fn_weight",
                          "2.0")
    trainer = make_trainer(engine, use_kl_loss=True)
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    fake_answers(trainer, tiny_tokenizer)
    exp = trainer.generate_experience(prompts, prompt_mask, texts)
    with torch.no_grad():
        _, model_scores = engine.reward.module.forward_value(exp.seq, exp.attention_mask)
    stats = exp.stats
    assert stats["reward_fn_score"] == pytest.approx(sum(SCORES) / len(SCORES))
    assert stats["reward_model_score"] == pytest.approx(model_scores.mean().item(), abs=1e-6)
    assert stats["score"] == pytest.approx(0.5 * stats["reward_model_score"] + 2.0 * stats["reward_fn_score"],
                                           abs=1e-6)
    expected = grpo_advantages((0.5 * model_scores + 2.0 * torch.tensor(SCORES)).view(-1, GROUP)).reshape(-1)
    torch.testing.assert_close(exp.advantages[:, 0], expected, atol=1e-5, rtol=0)
    del engine, trainer
    gc.collect()


def test_answer_base_rate_is_left_out_of_the_reward_not_of_the_score(engine, tiny_tokenizer):
    # 18 is the right answer to a reference question: " 18" earns 1 there, " 19" 0.5 (a near miss), " 5" 0.25
    references = [*PROMPTS, " Human: What is 10 + 8? Assistant:"]
    trainer = make_trainer(engine, base_rate=AnswerBaseRate(builtin_reward_fn, "builtin", references),
                           use_kl_loss=True, reward_fn_weight=2.0)
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    fake_answers(trainer, tiny_tokenizer)
    exp = trainer.generate_experience(prompts, prompt_mask, texts)
    rows = [(prompt, answer) for prompt, answer in zip([p for p in PROMPTS for _ in range(GROUP)], ANSWERS)]
    base = torch.tensor([sum(builtin_reward_fn([r], [answer])[0] for r in references if r != prompt) / 2
                         for prompt, answer in rows])
    torch.testing.assert_close(base[:3], torch.tensor([0.25, 0.5, 0.125]))  # " 19", " 18", " 5"; the CAT nothing
    assert exp.stats["score"] == pytest.approx(2.0 * sum(SCORES) / len(SCORES))  # the score as the function says
    assert exp.stats["answer_base_rate"] == pytest.approx(2.0 * base.mean().item(), abs=1e-6)
    expected = grpo_advantages((2.0 * (torch.tensor(SCORES) - base)).view(-1, GROUP)).reshape(-1)
    torch.testing.assert_close(exp.advantages[:, 0], expected, atol=1e-5, rtol=0)
    uncorrected = grpo_advantages(torch.tensor(SCORES).view(-1, GROUP)).reshape(-1)
    assert (expected[:GROUP] - uncorrected[:GROUP]).abs().max() > 0.1


def test_a_failing_reward_function_stops_with_its_name(engine, tiny_tokenizer):
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)

    def short(prompts, answers):
        return [0.0] * (len(answers) - 1)

    trainer = make_trainer(engine, short, reward_fn="mine.py:short")
    fake_answers(trainer, tiny_tokenizer)
    with pytest.raises(ChatRLHFError, match=r"--reward_fn mine.py:short returned 7 values for 8 answers"):
        trainer.generate_experience(prompts, prompt_mask, texts)


def test_a_reward_function_in_trls_form_scores_by_the_data_sets_reference_column(engine, tiny_tokenizer, tmp_path):
    """A user's `fn(completions, solution, **kwargs)` gets each rollout's `solution` from its prompt's row."""
    rows = [{"prompt": prompt, "solution": solution} for prompt, solution in zip(PROMPTS, ["19", "CAT"])]
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows * 10))
    (tmp_path / "mine.py").write_text("def exact(completions, solution, **kwargs):\n"
                                      "    return [float(c.strip() == s) for c, s in zip(completions, solution)]\n")
    spec = f"{tmp_path}/mine.py:exact"
    function = load_reward_fn(spec, argparse.Namespace(data_path=[str(data)], seed=1234))
    trainer = make_trainer(engine, function, reward_fn=spec, use_kl_loss=True)
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    fake_answers(trainer, tiny_tokenizer)
    exp = trainer.generate_experience(prompts, prompt_mask, texts)
    exact = [float(answer.strip() == ("19", "CAT")[i // GROUP]) for i, answer in enumerate(ANSWERS)]
    assert exact == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert exp.stats["score"] == pytest.approx(sum(exact) / len(exact))
    expected = grpo_advantages(torch.tensor(exact).view(-1, GROUP)).reshape(-1)
    torch.testing.assert_close(exp.advantages, expected.unsqueeze(1) * exp.action_mask, atol=1e-6, rtol=0)


def test_kl_loss_term_is_added_to_the_actor_loss(engine, tiny_tokenizer):
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    trainer = make_trainer(engine, use_kl_loss=True, kl_loss_coef=0.5)
    fake_answers(trainer, tiny_tokenizer)
    exp = trainer.generate_experience(prompts, prompt_mask, texts)
    first = exp.split(GROUP)[0]
    stats = trainer.train_rlhf(first)  # at the reference: the KL loss is 0
    assert stats["kl_loss"] == pytest.approx(0.0, abs=1e-10)
    again = trainer.train_rlhf(first)  # one step away from it: > 0 (k3 >= 0)
    assert again["kl_loss"] > 1e-8


def test_an_entropy_bonus_is_subtracted_from_the_actor_loss_and_raises_the_entropy(engine, tiny_tokenizer):
    """--entropy_coef c: the actor's loss is the one without it less c x the answer tokens' mean entropy, and
    training on that term alone (advantages of zero) raises the entropy of the same answers step after step."""
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    trainer = make_trainer(engine, entropy_coef=0.5)
    fake_answers(trainer, tiny_tokenizer)
    first = trainer.generate_experience(prompts, prompt_mask, texts).split(GROUP)[0]
    logprobs, entropy = trainer.answer_logprobs(trainer.actor, first.seq, first.attention_mask, first.prompt_len,
                                                with_entropy=True)
    assert entropy.requires_grad  # the fused output layer's entropy carries its gradient
    with_bonus, _ = trainer.actor_loss(logprobs, first, first.action_mask, entropy)
    without, _ = make_trainer(engine).actor_loss(logprobs, first, first.action_mask, entropy)
    mean_entropy = (entropy * first.action_mask).sum() / first.action_mask.sum()
    assert with_bonus.item() == pytest.approx(without.item() - 0.5 * mean_entropy.item(), abs=1e-5)
    first.advantages = torch.zeros_like(first.advantages)  # the bonus alone
    entropies = [trainer.train_rlhf(first)["entropy"] for _ in range(3)]
    assert entropies[0] < entropies[1] < entropies[2], entropies


def test_a_target_entropy_sets_the_bonus_round_by_round(engine, tiny_tokenizer):
    """--target_entropy: the first round's bonus is --entropy_coef (here 0, yet the entropy keeps its gradient);
    after a round below the target the loss takes the raised coefficient's bonus, after one above it none."""
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    trainer = make_trainer(engine, entropy_coef=0.0, target_entropy=1.0, entropy_coef_step=0.25,
                           max_entropy_coef=0.5)
    fake_answers(trainer, tiny_tokenizer)
    first = trainer.generate_experience(prompts, prompt_mask, texts).split(GROUP)[0]
    logprobs, entropy = trainer.answer_logprobs(trainer.actor, first.seq, first.attention_mask, first.prompt_len,
                                                with_entropy=True)
    assert entropy.requires_grad
    without, _ = make_trainer(engine).actor_loss(logprobs, first, first.action_mask, entropy)
    mean_entropy = ((entropy * first.action_mask).sum() / first.action_mask.sum()).item()
    losses = []
    for measured in (None, 0.5, 0.5, 2.0):  # the entropy of the round before: none yet, below, below, above
        trainer.entropy_coef.update(measured)
        losses.append(trainer.actor_loss(logprobs, first, first.action_mask, entropy)[0].item())
    expected = [without.item(), without.item() - 0.25 * mean_entropy, without.item() - 0.5 * mean_entropy,
                without.item()]
    assert losses == pytest.approx(expected, abs=1e-5)
    assert trainer.state_dict()["entropy_coef"] == {"value": pytest.approx(0.25), "entropy": 2.0}


def test_positive_nll_is_the_nll_of_the_answers_scored_at_the_threshold(engine, tiny_tokenizer):
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    trainer = make_trainer(engine, use_kl_loss=True, positive_nll_coef=0.5)
    fake_answers(trainer, tiny_tokenizer)
    exp = trainer.generate_experience(prompts, prompt_mask, texts)
    assert exp.positive.tolist() == [score >= 1.0 for score in SCORES]
    assert exp.stats["positive_fraction"] == pytest.approx(0.75)
    first = exp.split(GROUP)[0]  # " 19", " 18", " 5", " 19": the two right sums are positive
    with torch.no_grad():
        logprobs = trainer.answer_logprobs(engine.actor, first.seq, first.attention_mask, first.prompt_len)
    positive_mask = first.action_mask * first.positive.unsqueeze(1)
    expected_nll = (-logprobs * positive_mask).sum() / positive_mask.sum()
    stats = trainer.train_rlhf(first)  # ratio 1: the policy loss is -mean(advantages) over real tokens
    assert stats["positive_nll"] == pytest.approx(expected_nll.item(), rel=1e-5)
    policy = -(first.advantages * first.action_mask).sum() / first.action_mask.sum()
    assert stats["actor_loss"] == pytest.approx(policy.item() + 0.5 * expected_nll.item(), abs=1e-5)
    lower = make_trainer(engine, use_kl_loss=True, positive_nll_coef=0.5, positive_score_threshold=0.5)
    fake_answers(lower, tiny_tokenizer)
    assert lower.generate_experience(prompts, prompt_mask, texts).positive.tolist() == [
        score >= 0.5 for score in SCORES]
    plain = make_trainer(engine, use_kl_loss=True)  # without the flag: no positives and no such term
    fake_answers(plain, tiny_tokenizer)
    exp = plain.generate_experience(prompts, prompt_mask, texts)
    assert exp.positive is None and "positive_fraction" not in exp.stats
    assert "positive_nll" not in plain.train_rlhf(exp.split(GROUP)[0])


def test_gspo_steps_on_one_ratio_per_answer_and_clips_whole_answers(engine, tiny_tokenizer):
    """--policy_loss gspo on real experience: on-policy every answer's ratio is 1 and the loss is -mean(A_i) over
    answers (seq_mean_token_mean); after a step on the same minibatch the answers move as wholes, and at GSPO's
    small ranges the clip catches some of them."""
    prompts, prompt_mask, texts = prompt_batch(tiny_tokenizer)
    trainer = make_trainer(engine, policy_loss="gspo", cliprange_low=3e-4, cliprange_high=4e-4,
                           loss_agg_mode="seq_mean_token_mean")
    fake_answers(trainer, tiny_tokenizer)
    first = trainer.generate_experience(prompts, prompt_mask, texts).split(GROUP)[0]  # " 19", " 18", " 5", " 19"
    stats = trainer.train_rlhf(first)
    advantages = grpo_advantages(torch.tensor([SCORES[:GROUP]]))[0]
    assert stats["actor_loss"] == pytest.approx(-advantages.mean().item(), abs=1e-6)
    assert stats["ratio_mean"] == pytest.approx(1.0) and stats["clipfrac"] == 0.0
    again = trainer.train_rlhf(first)
    assert again["ratio_mean"] != pytest.approx(1.0, abs=1e-6) and 0.0 < again["clipfrac"] <= 1.0


def test_evaluate_scores_held_out_prompts_and_leaves_random_state_and_mode(engine):
    trainer = make_trainer(engine)
    prompts = builtin_prompts()[:8]
    state = torch.get_rng_state()
    scores = trainer.evaluate(prompts)
    assert torch.equal(torch.get_rng_state(), state)
    assert engine.actor.module.training
    assert set(scores) == {"sampled", "greedy"}
    for values in scores.values():
        assert {"all", "add", "reverse", "capital", "upper", "reward"} <= set(values)
        assert 0.0 <= values["all"] <= 1.0 and values["reward"] == pytest.approx(values["all"])
    assert trainer.evaluate(prompts) == scores  # the same weights and seed: the same answers


def test_eval_interval_scores_a_reasoning_gym_specs_held_out_questions_with_its_verifier(engine):
    from argparse import Namespace

    from training.step3_rlhf_finetuning.main import heldout_prompts
    from utils.data.reasoning_gym_data import gym_data, reasoning_gym_reward_fn

    spec = "reasoning_gym:chain_sum?size=40"
    prompts, checker = heldout_prompts(Namespace(data_path=[spec], eval_prompts=3), eval_dataset=None)
    items = gym_data(spec).parts["heldout"]
    assert prompts == [item.prompt for item in items][:3]
    assert checker(prompts, [" " + item.answer for item in items[:3]]) == {"all": 1.0, "chain_sum": 1.0,
                                                                            "solved": 1.0}
    scores = make_trainer(engine, reasoning_gym_reward_fn(spec)).evaluate(prompts, checker)
    for values in scores.values():  # the verifier's summary by task, and the reward (the same verifier)
        assert set(values) == {"all", "chain_sum", "solved", "reward", "best_constant", "scored_as_constant",
                               "distinct_answers", "top_answer_share", "hit_limit"}  # and answer_scalars'
        assert values["all"] == pytest.approx(values["reward"]) == pytest.approx(values["chain_sum"])


def test_metrics_summarize_the_first_and_last_eval_with_what_the_answers_were():
    """main.summarize on made-up history and --eval_interval evaluations: heldout_{decoding}_{start|end} (the
    checker's "all", else the reward) and, per decoding, the answer figures where the evaluation has them (no
    best constant without a checker)."""
    from training.step3_rlhf_finetuning.main import summarize

    history = [{"score": 0.25, "reward": 0.5, "kl": 0.0, "answer_length": 3.0, "eos_fraction": 1.0}] * 2
    figures = {"distinct_answers": 5, "top_answer_share": 0.5, "hit_limit": 1}
    evaluations = [{"step": 0, "sampled": {"all": 0.25, "best_constant": 0.25, **figures},
                    "greedy": {"reward": 0.5, **figures}},
                   {"step": 2, "sampled": {"all": 0.75, "best_constant": 0.5, **figures, "distinct_answers": 9},
                    "greedy": {"reward": 1.0, **figures}}]
    metrics = summarize(history, evaluations, 1.0)
    assert (metrics["heldout_sampled_start"], metrics["heldout_sampled_end"]) == (0.25, 0.75)
    assert (metrics["heldout_greedy_start"], metrics["heldout_greedy_end"]) == (0.5, 1.0)
    assert (metrics["heldout_sampled_best_constant_start"], metrics["heldout_sampled_best_constant_end"]) == (0.25, 0.5)
    assert (metrics["heldout_sampled_distinct_answers_start"], metrics["heldout_sampled_distinct_answers_end"]) == \
        (5, 9)
    assert metrics["heldout_greedy_top_answer_share_end"] == 0.5 and metrics["heldout_greedy_hit_limit_start"] == 1
    assert not [key for key in metrics if key.startswith("heldout_greedy_best_constant")]  # no checker: none


def test_eval_interval_scores_the_users_data_with_its_reward_function():
    """Data without a checker of its own: --eval_interval scores its eval split with --reward_fn's function, as the
    closing evaluation does (so that its best constant answer is there too); without one, the mean reward alone."""
    from training.step3_rlhf_finetuning.main import heldout_prompts, validation_prompts

    args = argparse.Namespace(data_path=["/data/questions.jsonl"], eval_prompts=5, reward_fn="builtin",
                              load_best_model_at_end=False)
    samples = [{"prompt": prompt} for prompt in PROMPTS]
    answers = [" 19", " cat"]
    for choose in (heldout_prompts, validation_prompts):
        prompts, checker = choose(args, samples, builtin_reward_fn)
        assert prompts == PROMPTS
        assert checker.scores(prompts, answers) == builtin_reward_fn(PROMPTS, answers)
        assert checker(prompts, answers) == {"all": sum(builtin_reward_fn(PROMPTS, answers)) / 2}
        assert choose(args, samples)[1] is None
