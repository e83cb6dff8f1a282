"""Tests of step 3's PPO trainer on real DeepSpeed engines in this process (a world of one): the action mask, the
experience (shapes, masks, empty answers kept, the score on the last real token), the first PPO ratio being
exactly 1, log-probs independent of left padding, reward shaping, the KL controller, and that the updates change
what they should and nothing else.

One ZeRO-0 engine (generation batch = training batch = 4, fp32) is shared by the module; a test that needs other
settings copies `engine.args` into its own trainer (the trainer reads its settings from its own args)."""
import copy
import gc
import random

import pytest
import torch
from torch import nn

from training.step3_rlhf_finetuning.arguments import parse_args
from utils.data.data_utils import DataCollatorRLHF, DataCollatorSFT
from utils.rl.experience import answer_action_mask
from utils.rl.kl import AdaptiveKLController, FixedKLController
from utils.rl.tokens import masked_mean, masked_var
from utils.runtime.ds_utils import resolve_dtype
from utils.trainer.ppo_trainer import PPOTrainer
from utils.trainer.rlhf_engine import DeepSpeedRLHFEngine

EOS = 2


def make_args(actor_dir, critic_dir, *extra):
    args = parse_args(["--actor_model_name_or_path", str(actor_dir), "--critic_model_name_or_path", str(critic_dir),
                       "--output_dir", "unused", "--dtype", "fp32", "--per_device_generation_batch_size", "4",
                       "--per_device_training_batch_size", "4", "--max_prompt_seq_len", "16",
                       "--max_answer_seq_len", "8", "--num_warmup_steps", "0", "--lr_scheduler_type", "constant",
                       "--ppo_epochs", "1", *extra])
    args.dtype = resolve_dtype(args.dtype)
    return args


def build_engine(actor_dir, critic_dir, tokenizer, *extra):
    args = make_args(actor_dir, critic_dir, *extra)
    return DeepSpeedRLHFEngine(str(actor_dir), str(critic_dir), tokenizer, args, actor_steps=10, critic_steps=10, world_size=1)


def make_trainer(engine, **overrides):
    args = copy.copy(engine.args)
    for key, value in overrides.items():
        setattr(args, key, value)
    return PPOTrainer(engine, args)


@pytest.fixture(scope="module")
def engine(distributed, step3_model_dirs, tiny_tokenizer):
    engine = build_engine(*step3_model_dirs, tiny_tokenizer)
    yield engine
    del engine
    gc.collect()


@pytest.fixture(scope="module")
def gpt2_engine(distributed, tmp_path_factory, tiny_tokenizer):
    """Actor and critic with learned absolute positions (GPT-2 does not derive positions from the mask, so left
    padding shifts them unless step 3 passes position ids)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from utils.model.reward_model import RewardModel
    from utils.model.save import save_hf_model

    root = tmp_path_factory.mktemp("gpt2")
    actor_dir, critic_dir = root / "step1", root / "step2"
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tiny_tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=64,
                        bos_token_id=tiny_tokenizer.bos_token_id, eos_token_id=tiny_tokenizer.eos_token_id,
                        pad_token_id=tiny_tokenizer.pad_token_id)
    GPT2LMHeadModel(config).save_pretrained(actor_dir)
    tiny_tokenizer.save_pretrained(actor_dir)
    save_hf_model(RewardModel.from_pretrained(str(actor_dir), tiny_tokenizer), tiny_tokenizer, critic_dir, 0)
    engine = build_engine(actor_dir, critic_dir, tiny_tokenizer)
    yield engine
    del engine
    gc.collect()


def prompt_batch(tokenizer, count=4):
    """`count` prompts of different lengths, left-padded as step 3's collator pads them."""
    texts = ["Human: add 2 and 3\nAssistant:", "Human: hi\nAssistant:", "Human: sort the list 4 1 3\nAssistant:",
             "Human: what is the capital of France?\nAssistant:"][:count]
    batch = DataCollatorRLHF(tokenizer.pad_token_id)([{"prompt_ids": tokenizer(t)["input_ids"]} for t in texts])
    assert (batch["prompt_att_mask"] == 0).any()  # really left-padded
    return batch["prompt"], batch["prompt_att_mask"]


def params(module):
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def changed(before, module):
    return {name for name, p in module.named_parameters() if not torch.equal(before[name], p.detach())}


# ---- the action mask ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("answer, expected", [
    ([5, 6, EOS, 0, 0], [1, 1, 1, 0, 0]),        # EOS kept inside the mask, padding after it out
    ([EOS, 0, 0, 0, 0], [1, 0, 0, 0, 0]),        # empty answer: EOS first still keeps one token
    ([5, 6, 7, 8, 9], [1, 1, 1, 1, 1]),          # no EOS (cut at the length limit): every token
    ([5, 6, 7, 8, EOS], [1, 1, 1, 1, 1]),        # EOS at the very end
    ([5, EOS, EOS, EOS, EOS], [1, 1, 0, 0, 0]),  # pad == eos: only the first EOS counts
    ([EOS, EOS, EOS, EOS, EOS], [1, 0, 0, 0, 0]),
])
def test_answer_action_mask_on_hand_made_rows(answer, expected):
    mask = answer_action_mask(torch.tensor([answer]), EOS)
    assert mask.dtype == torch.float32
    assert mask.tolist() == [expected]


def test_answer_action_mask_rows_are_independent():
    answers = torch.tensor([[5, EOS, 0], [EOS, 0, 0], [5, 6, 7]])
    assert answer_action_mask(answers, EOS).tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]


# ---- experience --------------------------------------------------------------------------------------------------


def test_experience_shapes_and_masks(engine, tiny_tokenizer):
    trainer = make_trainer(engine)
    prompts, prompt_mask = prompt_batch(tiny_tokenizer)
    torch.manual_seed(0)
    exp = trainer.generate_experience(prompts, prompt_mask)
    rows, prompt_len = prompts.shape
    seq = exp.seq
    answer_len = seq.shape[1] - prompt_len
    assert seq.shape[0] == rows and 1 <= answer_len <= engine.args.max_answer_seq_len
    assert exp.prompt_len == prompt_len
    assert torch.equal(seq[:, :prompt_len], prompts)
    answers = seq[:, prompt_len:]
    action_mask = exp.action_mask
    assert torch.equal(action_mask, answer_action_mask(answers, tiny_tokenizer.eos_token_id))
    assert torch.equal(exp.attention_mask, torch.cat([prompt_mask, action_mask.long()], 1))
    for key in ("logprobs", "ref_logprobs", "values", "advantages", "returns"):
        assert getattr(exp, key).shape == (rows, answer_len), key
        assert getattr(exp, key).dtype == torch.float32, key
        assert torch.isfinite(getattr(exp, key)).all(), key
    for key in ("values", "advantages", "returns"):
        assert (getattr(exp, key)[action_mask == 0] == 0).all(), key
    assert (exp.logprobs <= 0).all() and (exp.ref_logprobs <= 0).all()
    # Whitened advantages: mean 0 and unbiased variance 1 over the real tokens.
    assert abs(masked_mean(exp.advantages, action_mask).item()) < 1e-5
    assert masked_var(exp.advantages, action_mask).item() == pytest.approx(1.0, abs=1e-3)
    stats = exp.stats
    assert stats["answer_length"] == pytest.approx(action_mask.sum(1).mean().item())
    assert stats["generated_tokens"] == int(action_mask.sum().item())
    assert all(torch.isfinite(torch.tensor(float(v))) for v in stats.values())
    # Experience is made in eval mode; training mode is back afterwards. (DeepSpeedEngine.eval() switches its
    # module, not the wrapper's own flag: look at the modules.)
    assert engine.actor.module.training and engine.critic.module.training
    assert not engine.ref.module.training and not engine.reward.module.training


def fake_generation(trainer, prompts, answers):
    """Make `trainer` return these answers instead of sampling."""
    seq = torch.cat([prompts, answers], 1)
    trainer.generate_sequence = lambda prompts_, mask_: seq.clone()
    return seq


def test_empty_answers_are_kept_and_every_score_lands_on_the_last_real_token(engine, tiny_tokenizer):
    pad = tiny_tokenizer.pad_token_id
    penalty = 1.5
    trainer = make_trainer(engine, normalize_reward=False, missing_eos_penalty=penalty, reward_clip=None,
                           kl_coef=0.0)
    trainer.kl_controller = FixedKLController(0.0)  # rewards = the shaped score alone
    prompts, prompt_mask = prompt_batch(tiny_tokenizer, count=3)
    answers = torch.tensor([[EOS, pad, pad, pad, pad],   # empty answer
                            [40, 41, EOS, pad, pad],     # stops
                            [40, 41, 42, 43, 44]])       # cut at the length limit, never stops
    seq = fake_generation(trainer, prompts, answers)
    exp = trainer.generate_experience(prompts, prompt_mask)

    assert exp.seq.shape[0] == prompts.shape[0] == 3  # nothing dropped
    assert exp.action_mask.sum(1).tolist() == [1, 3, 5]
    stats = exp.stats
    assert stats["empty_fraction"] == pytest.approx(1 / 3)
    assert stats["eos_fraction"] == pytest.approx(2 / 3)
    assert stats["answer_length"] == pytest.approx(3.0)
    with torch.no_grad():
        _, end_scores = engine.reward.module.forward_value(seq, exp.attention_mask)
    assert stats["score"] == pytest.approx(end_scores.mean().item(), abs=1e-6)
    expected = end_scores - penalty * torch.tensor([0.0, 0.0, 1.0])
    # gamma = 1 and the last real token ends the episode, so there the return is the reward: the shaped score.
    last = [0, 2, 4]
    torch.testing.assert_close(exp.returns[torch.arange(3), last], expected, atol=1e-5, rtol=0)
    assert stats["reward"] == pytest.approx(expected.mean().item(), abs=1e-5)


def test_first_ppo_minibatch_has_ratio_exactly_one_with_dropout_off(engine, tiny_tokenizer):
    trainer = make_trainer(engine)
    args = trainer.args
    assert args.per_device_generation_batch_size == args.per_device_training_batch_size
    for name in ("actor", "ref", "critic", "reward"):
        module = getattr(engine, name).module
        assert module.config.attention_dropout == 0.0, name  # the step-1/2 folders say 0.1
        assert all(m.p == 0.0 for m in module.modules() if isinstance(m, nn.Dropout)), name
    prompts, prompt_mask = prompt_batch(tiny_tokenizer)
    torch.manual_seed(1)
    exp = trainer.generate_experience(prompts, prompt_mask)
    assert len(exp.split(args.per_device_training_batch_size)) == 1
    stats = trainer.train_round([exp], None, random.Random(0), train_actor=True)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["clipfrac"] == 0.0
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-12)
    # The same experience after one update: the policy has moved, so the check above could have failed.
    again = trainer.train_rlhf(exp.split(args.per_device_training_batch_size)[0])
    assert abs(again["ratio_mean"] - 1.0) > 1e-7 or again["approx_kl"] > 0


def test_rollout_logprobs_are_the_samplers_own_and_spare_the_actors_forward_pass(engine, tiny_tokenizer):
    """--rollout_logprobs: the old policy's log-probs come from the sampler (equal to a forward pass's to
    rounding in fp32), the actor runs no forward pass for them, and the rows --filter_zero_variance drops are
    dropped from them too."""
    prompts, prompt_mask = prompt_batch(tiny_tokenizer)
    runs = {}
    for flag in (False, True):
        trainer = make_trainer(engine, rollout_logprobs=flag)
        forwards = []
        scoring = trainer.answer_logprobs
        trainer.answer_logprobs = lambda model, *rest, **kw: forwards.append(model) or scoring(model, *rest, **kw)
        torch.manual_seed(5)
        runs[flag] = trainer.generate_experience(prompts, prompt_mask), forwards
    (recomputed, recompute_forwards), (sampled, sampled_forwards) = runs[False], runs[True]
    assert torch.equal(recomputed.seq, sampled.seq)  # the same rollouts
    mask = sampled.action_mask
    assert (recomputed.logprobs - sampled.logprobs).abs().mul(mask).max() < 1e-5
    assert engine.actor in recompute_forwards and engine.actor not in sampled_forwards
    assert engine.ref in sampled_forwards  # the reference still runs (a KL term)
    keep = torch.tensor([True, False, True, False])
    trainer = make_trainer(engine, rollout_logprobs=True)
    logprobs, _, _ = trainer.old_policy(sampled.seq, sampled.attention_mask, sampled.prompt_len, keep,
                                        sampled.logprobs)
    assert torch.equal(logprobs, sampled.logprobs[keep])


def test_ratio_is_exactly_one_under_zero3_hybrid_engine_lora_and_ema(distributed, step3_model_dirs,
                                                                     tiny_tokenizer):
    engine = build_engine(*step3_model_dirs, tiny_tokenizer, "--actor_zero_stage", "3", "--critic_zero_stage", "3",
                          "--enable_hybrid_engine", "--actor_lora_dim", "4", "--only_optimize_lora", "--enable_ema")
    trainer = make_trainer(engine)
    prompts, prompt_mask = prompt_batch(tiny_tokenizer)
    torch.manual_seed(2)
    exp = trainer.generate_experience(prompts, prompt_mask)
    stats = trainer.train_round([exp], None, random.Random(0), train_actor=True)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["clipfrac"] == 0.0 and stats["approx_kl"] == pytest.approx(0.0, abs=1e-12)
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    del engine, trainer
    gc.collect()


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_left_padding_does_not_change_a_rows_logprobs_or_values(which, request, tiny_tokenizer):
    engine = request.getfixturevalue("engine" if which == "llama" else "gpt2_engine")
    trainer = make_trainer(engine)
    short, long = [1, 30, 31], [1, 50, 51, 52, 53, 54]
    answers = torch.tensor([[60, 61, 62, EOS], [70, 71, 72, 73]])
    pad = tiny_tokenizer.pad_token_id
    batch_seq = torch.cat([torch.tensor([[pad] * 3 + short, long]), answers], 1)
    batch_mask = torch.cat([torch.tensor([[0] * 3 + [1] * 3, [1] * 6]), torch.ones(2, 4, dtype=torch.long)], 1)
    alone_seq = torch.tensor([short + answers[0].tolist()])
    alone_mask = torch.ones_like(alone_seq)
    engine.actor.eval()
    engine.critic.eval()
    with torch.no_grad():
        batched = trainer.answer_logprobs(engine.actor, batch_seq, batch_mask, 6)[0]
        alone = trainer.answer_logprobs(engine.actor, alone_seq, alone_mask, 3)[0]
        batched_values = trainer.answer_values(engine.critic.module, batch_seq, batch_mask, 6)[0]
        alone_values = trainer.answer_values(engine.critic.module, alone_seq, alone_mask, 3)[0]
        batched_score = engine.reward.module.forward_value(batch_seq, batch_mask)[1][0]
        alone_score = engine.reward.module.forward_value(alone_seq, alone_mask)[1][0]
    engine.actor.train()
    engine.critic.train()
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(batched_values, alone_values, atol=1e-5, rtol=0)
    torch.testing.assert_close(batched_score, alone_score, atol=1e-5, rtol=0)


# ---- reward shaping and the KL controller -----------------------------------------------------------------------


def answers_with_and_without_eos():
    return torch.tensor([[5, EOS, 0], [5, 6, 7], [EOS, 0, 0], [8, 9, 10]])  # rows 1 and 3 never stop


def test_shape_scores_subtracts_exactly_the_missing_eos_penalty(engine):
    raw = torch.tensor([0.5, -1.0, 2.0, 0.25])
    trainer = make_trainer(engine, normalize_reward=False, missing_eos_penalty=0.75)
    scores = trainer.shape_scores(raw, None, answers_with_and_without_eos())
    assert torch.equal(scores, raw - 0.75 * torch.tensor([0.0, 1.0, 0.0, 1.0]))
    trainer = make_trainer(engine, normalize_reward=False, missing_eos_penalty=0.0)
    assert torch.equal(trainer.shape_scores(raw, None, answers_with_and_without_eos()), raw)


def test_shape_scores_normalises_with_the_running_moments_of_all_scores_seen(engine):
    trainer = make_trainer(engine, normalize_reward=True, missing_eos_penalty=1.0)
    first = torch.tensor([1.0, 2.0, 3.0, 4.0])
    second = torch.tensor([10.0, -2.0, 0.5, 7.0])
    trainer.shape_scores(first, None, answers_with_and_without_eos())
    scores = trainer.shape_scores(second, None, answers_with_and_without_eos())
    seen = torch.cat([first, second]).double()
    mean, std = seen.mean().item(), seen.std(unbiased=False).item()
    assert trainer.reward_moments.count == 8
    assert trainer.reward_moments.mean == pytest.approx(mean)
    expected = (second - mean) / (std + 1e-8) - torch.tensor([0.0, 1.0, 0.0, 1.0])
    torch.testing.assert_close(scores, expected, atol=1e-6, rtol=0)
    # Not the batch's own statistics:
    batch_only = (second - second.mean()) / second.std(unbiased=False)
    assert not torch.allclose(scores + torch.tensor([0.0, 1.0, 0.0, 1.0]), batch_only, atol=1e-3)


def test_trainer_builds_the_kl_controller_its_flags_ask_for(engine):
    assert type(make_trainer(engine, kl_coef=0.2).kl_controller) is FixedKLController
    adaptive = make_trainer(engine, kl_coef=0.2, adaptive_kl_target=3.0, adaptive_kl_horizon=500.0).kl_controller
    assert type(adaptive) is AdaptiveKLController
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.2, 3.0, 500.0)


def test_experience_uses_the_kl_controllers_current_value(engine, tiny_tokenizer):
    trainer = make_trainer(engine, normalize_reward=False, missing_eos_penalty=0.0, reward_clip=None)
    prompts, prompt_mask = prompt_batch(tiny_tokenizer)
    answers = torch.randint(4, len(tiny_tokenizer), (prompts.shape[0], 5), generator=torch.Generator().manual_seed(3))
    fake_generation(trainer, prompts, answers)
    # Move the actor away from the reference so the KL is not zero.
    with torch.no_grad():
        generator = torch.Generator().manual_seed(4)
        for param in engine.actor.module.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    for coef in (0.0, 0.5):
        trainer.kl_controller = AdaptiveKLController(coef, target=1.0, horizon=100)
        stats = trainer.generate_experience(prompts, prompt_mask).stats
        assert abs(stats["kl"]) > 1e-3
        assert stats["reward"] == pytest.approx(stats["score"] - coef * stats["kl"], abs=1e-5)


# ---- updates -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("train_actor", [True, False])
def test_train_rlhf_changes_the_critic_and_the_actor_only_when_asked(engine, tiny_tokenizer, train_actor):
    trainer = make_trainer(engine)
    prompts, prompt_mask = prompt_batch(tiny_tokenizer)
    torch.manual_seed(5)
    exp = trainer.generate_experience(prompts, prompt_mask)
    actor_before, critic_before = params(engine.actor.module), params(engine.critic.module)
    ref_before, reward_before = params(engine.ref.module), params(engine.reward.module)
    stats = trainer.train_rlhf(exp.split(4)[0], train_actor=train_actor)
    assert ("actor_loss" in stats) == train_actor
    assert "critic_loss" in stats and all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    assert "v_head.weight" in changed(critic_before, engine.critic.module)
    assert len(changed(critic_before, engine.critic.module)) > 1
    if train_actor:
        assert len(changed(actor_before, engine.actor.module)) > 1
    else:
        assert not changed(actor_before, engine.actor.module)
    assert not changed(ref_before, engine.ref.module) and not changed(reward_before, engine.reward.module)


def test_unsupervised_step_changes_the_actor_only(engine, tiny_tokenizer):
    trainer = make_trainer(engine)
    texts = ["the cat sat on the mat", "two plus three is five and four plus one is five too"]
    samples = [{"input_ids": ids, "labels": ids} for ids in (tiny_tokenizer(t)["input_ids"] for t in texts)]
    batch = DataCollatorSFT(tiny_tokenizer.pad_token_id)(samples)
    actor_before, critic_before = params(engine.actor.module), params(engine.critic.module)
    loss = trainer.train_unsupervised(batch, unsup_coef=27.8)
    assert isinstance(loss, float) and 0 < loss < 20
    assert len(changed(actor_before, engine.actor.module)) > 1
    assert not changed(critic_before, engine.critic.module)


@pytest.mark.parametrize("train_actor", [True, False])
def test_ppo_round_with_the_unsupervised_loss_trains_the_actor_only_after_critic_warmup(engine, tiny_tokenizer,
                                                                                       train_actor):
    trainer = make_trainer(engine)
    texts = ["the cat sat on the mat", "two plus three is five"]
    samples = [{"input_ids": ids, "labels": ids} for ids in (tiny_tokenizer(t)["input_ids"] for t in texts)]
    unsup_batches = iter([DataCollatorSFT(tiny_tokenizer.pad_token_id)(samples)] * 4)
    prompts, prompt_mask = prompt_batch(tiny_tokenizer)
    torch.manual_seed(6)
    exp = trainer.generate_experience(prompts, prompt_mask)
    actor_before, critic_before = params(engine.actor.module), params(engine.critic.module)
    stats = trainer.train_round([exp], unsup_batches, random.Random(0), train_actor=train_actor)
    assert ("unsup_loss" in stats) == ("actor_loss" in stats) == train_actor
    assert changed(critic_before, engine.critic.module)
    assert bool(changed(actor_before, engine.actor.module)) == train_actor
