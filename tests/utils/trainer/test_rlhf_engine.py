"""Tests of step 3's RLHF engine with real DeepSpeed engines in this process (a world of one): the four models at
ZeRO stages 0, 2 and 3, with and without the hybrid engine (native generate, greedy output equal to plain
Hugging Face, and so is inference/sampling.py's at a near-zero temperature; the hybrid engine's ZeRO-3 actor whole and
without hooks while it generates), LoRA, the EMA copy (exact lerp update, kept after a ZeRO-3 gather ends) and an
offloaded reference.

The step-1 and step-2 folders come from the session fixture `step3_model_dirs` (tests/conftest.py); their configs
carry dropout 0.1, which the engine must switch off."""
import gc

import deepspeed
import pytest
import torch
from deepspeed.runtime.hybrid_engine import DeepSpeedHybridEngine
from torch import nn
from transformers import AutoModelForCausalLM

from inference.llama_decoding import llama_decoder
from inference.sampling import sample
from training.step3_rlhf_finetuning.arguments import parse_args
from utils.data.data_utils import DataCollatorRLHF
from utils.model.lora import LinearLayerLoRA
from utils.runtime.ds_utils import resolve_dtype
from utils.trainer.frozen import moving_average
from utils.trainer.ppo_trainer import PPOTrainer
from utils.trainer.rlhf_engine import DeepSpeedRLHFEngine, gathered_for_generation


def make_args(model_dirs, *extra):
    actor_dir, critic_dir = model_dirs
    args = parse_args(["--actor_model_name_or_path", str(actor_dir), "--critic_model_name_or_path", str(critic_dir),
                       "--output_dir", "unused", "--dtype", "fp32", "--per_device_generation_batch_size", "4",
                       "--per_device_training_batch_size", "4", "--max_prompt_seq_len", "16",
                       "--max_answer_seq_len", "8", "--num_warmup_steps", "0", "--lr_scheduler_type", "constant",
                       *extra])
    args.dtype = resolve_dtype(args.dtype)
    return args


def build_engine(model_dirs, tokenizer, *extra):
    args = make_args(model_dirs, *extra)
    return DeepSpeedRLHFEngine(str(model_dirs[0]), str(model_dirs[1]), tokenizer, args, actor_steps=10, critic_steps=10,
                               world_size=1)


@pytest.fixture(autouse=True)
def free_engines():
    yield
    gc.collect()


def prompt_batch(tokenizer):
    """Three prompts of different lengths, left-padded as step 3's collator pads them."""
    texts = ["Human: add 2 and 3\nAssistant:", "Human: hi\nAssistant:", "Human: sort the list 4 1 3\nAssistant:"]
    samples = [{"prompt_ids": tokenizer(text)["input_ids"]} for text in texts]
    batch = DataCollatorRLHF(tokenizer.pad_token_id)(samples)
    assert len({len(s["prompt_ids"]) for s in samples}) == 3  # really left-padded
    return batch["prompt"], batch["prompt_att_mask"]


def greedy(model, prompts, mask, tokenizer):
    with torch.no_grad():
        return model.generate(input_ids=prompts, attention_mask=mask, max_new_tokens=8, do_sample=False,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


def assert_dropout_off(engine):
    for name in ("actor", "ref", "critic", "reward"):
        module = getattr(engine, name).module
        assert module.config.attention_dropout == 0.0, name  # the folders say 0.1
        assert all(m.p == 0.0 for m in module.modules() if isinstance(m, nn.Dropout)), name


def partitioned(module):
    """Parameters ZeRO-3 really partitioned (empty on this rank)."""
    return [p for p in module.parameters() if hasattr(p, "ds_id") and p.numel() == 0 and p.ds_numel > 0]


@pytest.mark.parametrize("stage, hybrid", [(0, False), (0, True), (2, False), (2, True), (3, False), (3, True)])
def test_engine_at_each_zero_stage_generates_as_plain_hf(distributed, step3_model_dirs, tiny_tokenizer, stage,
                                                          hybrid):
    extra = ["--actor_zero_stage", str(stage), "--critic_zero_stage", str(stage)]
    engine = build_engine(step3_model_dirs, tiny_tokenizer, *extra, *(["--enable_hybrid_engine"] if hybrid else []))
    frozen_stage = 3 if stage == 3 else 0
    assert engine.actor.zero_optimization_stage() == engine.critic.zero_optimization_stage() == stage
    assert engine.ref.zero_optimization_stage() == engine.reward.zero_optimization_stage() == frozen_stage
    assert engine.actor_ema is None
    assert engine.actor.optimizer is not None and engine.critic.optimizer is not None
    for name in ("actor", "ref", "critic", "reward"):
        assert bool(partitioned(getattr(engine, name).module)) == (stage == 3), name
    assert isinstance(engine.actor, DeepSpeedHybridEngine) == hybrid
    if hybrid:
        # No inference containers, on any device (use_native_generate): the model keeps its own generate.
        assert engine.actor._inference_containers == []
        assert "generate" not in vars(engine.actor.module)
        assert engine.actor.module.generate.__func__ is type(engine.actor.module).generate
    assert_dropout_off(engine)

    prompts, mask = prompt_batch(tiny_tokenizer)
    engine.actor.eval()
    ours = greedy(engine.actor.module, prompts, mask, tiny_tokenizer)
    plain = AutoModelForCausalLM.from_pretrained(step3_model_dirs[0]).eval()
    expected = greedy(plain, prompts, mask, tiny_tokenizer)
    assert ours.shape[1] > prompts.shape[1]
    assert torch.equal(ours, expected)
    # The native rollout sampler on the engine's module (ZeRO-3: partitioned parameters gathered by its hooks),
    # near-greedy at a tiny temperature, returns the same sequences.
    native = sample(engine.actor.module, prompts, mask, 8, temperature=1e-4, eos_token_id=tiny_tokenizer.eos_token_id,
                    pad_token_id=tiny_tokenizer.pad_token_id)
    assert torch.equal(native, expected)
    # The hybrid engine at ZeRO-3 gathers the actor whole for a generation, with its ZeRO-3 hooks off, so the Llama
    # decoder runs on it and the model's own forward passes (Hugging Face generate) leave it whole; after, the hooks
    # are back and it is partitioned again. Elsewhere the context changes nothing.
    with torch.no_grad():
        logits_before = engine.actor(input_ids=prompts, attention_mask=mask).logits
    with gathered_for_generation(engine.actor):
        decodable = llama_decoder(engine.actor.module, 3, 24) is not None
        gathered = sample(engine.actor.module, prompts, mask, 8, temperature=1e-4,
                          eos_token_id=tiny_tokenizer.eos_token_id, pad_token_id=tiny_tokenizer.pad_token_id)
        hf_inside = greedy(engine.actor.module, prompts, mask, tiny_tokenizer)
        whole_after_forwards = not partitioned(engine.actor.module)
    assert decodable == whole_after_forwards == (stage != 3 or hybrid)
    assert torch.equal(gathered, expected) and torch.equal(hf_inside, expected)
    assert bool(partitioned(engine.actor.module)) == (stage == 3)
    # The hooks are back: a forward pass fetches the parameters as before the context, and a training step runs.
    engine.actor.train()
    logits_after = engine.actor(input_ids=prompts, attention_mask=mask).logits
    assert torch.equal(logits_after.detach(), logits_before)
    engine.actor.backward(logits_after.float().pow(2).mean())
    engine.actor.step()
    assert bool(partitioned(engine.actor.module)) == (stage == 3)


def snapshot(module):
    """{name: full tensor}, gathered under ZeRO-3."""
    out = {}
    for name, param in module.named_parameters():
        with deepspeed.zero.GatheredParameters([param], enabled=hasattr(param, "ds_id")):
            out[name] = param.detach().clone()
    return out


@pytest.mark.parametrize("extra", [
    ["--actor_lora_dim", "4", "--only_optimize_lora", "--enable_ema"],
    # ZeRO-3, hybrid engine, LoRA factors big enough (128 x 100) to be partitioned, EMA: everything at once.
    ["--actor_zero_stage", "3", "--enable_hybrid_engine", "--actor_lora_dim", "100", "--only_optimize_lora",
     "--enable_ema"],
    # A ZeRO-0 actor averaged into a ZeRO-3 (offloaded) EMA copy.
    ["--offload_reference_model", "--enable_ema"],
], ids=["lora-ema", "zero3-hybrid-lora-ema", "offloaded-ema"])
def test_ema_starts_as_the_actor_and_moves_toward_it_by_the_lerp_formula(distributed, step3_model_dirs,
                                                                         tiny_tokenizer, extra):
    engine = build_engine(step3_model_dirs, tiny_tokenizer, *extra)
    actor, ema = engine.actor.module, engine.actor_ema.module
    args = engine.args
    assert ema.training is False
    assert all(not p.requires_grad for p in ema.parameters())
    zero3_ema = args.actor_zero_stage == 3 or args.offload_reference_model
    assert engine.actor_ema.zero_optimization_stage() == (3 if zero3_ema else 0)
    assert bool(partitioned(ema)) == zero3_ema
    if args.actor_lora_dim:
        lora_layers = [m for m in actor.modules() if isinstance(m, LinearLayerLoRA)]
        assert lora_layers and len(lora_layers) == sum(isinstance(m, LinearLayerLoRA) for m in ema.modules())
        trainable = {n for n, p in actor.named_parameters() if p.requires_grad}
        assert trainable and all("lora_right_weight" in n or "lora_left_weight" in n for n in trainable)
        assert len(trainable) == 2 * len(lora_layers)
        if args.actor_zero_stage == 3:
            partitioned_ids = {id(p) for p in partitioned(actor)}
            assert any("lora_" in n for n, p in actor.named_parameters() if id(p) in partitioned_ids)
    assert engine.critic.module.v_head.weight.requires_grad

    actor_start, ema_start = snapshot(actor), snapshot(ema)
    assert list(actor_start) == list(ema_start)  # parameters pair up one to one, by name
    for name in actor_start:
        assert torch.equal(actor_start[name], ema_start[name]), name  # LoRA factors included

    # Move the actor away from the EMA (every parameter, as training would), then average.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in actor.parameters():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=0, enabled=hasattr(param, "ds_id")):
                param.add_(0.1 * torch.randn(param.shape, generator=generator))
    actor_now = snapshot(actor)
    assert not torch.equal(actor_now["model.embed_tokens.weight"], actor_start["model.embed_tokens.weight"])
    beta = 0.9
    moving_average(actor, ema, beta)
    ema_now = snapshot(ema)  # read back through a new gather: the update outlived the one in moving_average
    for name in ema_now:
        expected = torch.lerp(actor_now[name], ema_start[name], beta)  # beta * ema + (1 - beta) * actor
        assert torch.equal(ema_now[name], expected), name
        before = (ema_start[name] - actor_now[name]).abs().sum()
        after = (ema_now[name] - actor_now[name]).abs().sum()
        assert after < before, name
    # The actor itself is untouched by the average.
    for name, value in snapshot(actor).items():
        assert torch.equal(value, actor_now[name]), name


def test_the_ema_of_a_bf16_actor_is_fp32_and_keeps_updates_bf16_would_round_away(distributed, step3_model_dirs,
                                                                                tiny_tokenizer):
    engine = build_engine(step3_model_dirs, tiny_tokenizer, "--dtype", "bf16", "--enable_ema")
    actor, ema = engine.actor.module, engine.actor_ema.module
    assert {p.dtype for p in actor.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in ema.parameters()} == {torch.float32}
    ema_start = snapshot(ema)
    with torch.no_grad():
        for param in actor.parameters():
            param.add_(0.001)  # an EMA step of 0.008 x 0.001 = 8e-6: under half a bf16 unit in the last place
    actor_now = {name: value.float() for name, value in snapshot(actor).items()}
    moving_average(actor, ema, 0.992)
    ema_now = snapshot(ema)
    kept = rounded_away = total = 0
    for name in ema_now:
        expected = torch.lerp(actor_now[name], ema_start[name], 0.992)
        assert torch.allclose(ema_now[name], expected, atol=1e-7), name
        in_bf16 = torch.lerp(actor_now[name].bfloat16(), ema_start[name].bfloat16(), 0.992)
        differs = actor_now[name] != ema_start[name]  # not where the bf16 actor's own + 0.001 was rounded away
        kept += int((ema_now[name] != ema_start[name])[differs].sum())
        rounded_away += int((in_bf16 == ema_start[name].bfloat16())[differs].sum())
        total += int(differs.sum())
    assert total > 0.9 * sum(value.numel() for value in ema_now.values())
    assert kept == total and rounded_away > total / 2  # a bf16 EMA would have lost most of the update


def test_offloaded_reference_is_zero3_and_scores_as_a_plain_reference(distributed, step3_model_dirs,
                                                                      tiny_tokenizer):
    engine = build_engine(step3_model_dirs, tiny_tokenizer, "--offload_reference_model")
    assert engine.actor.zero_optimization_stage() == 0
    assert engine.ref.zero_optimization_stage() == 3
    assert engine.ref._config.zero_config.offload_param.device == "cpu"
    assert partitioned(engine.ref.module)
    assert engine.reward.zero_optimization_stage() == 0  # --offload_reward_model is a separate flag

    engine.args.offload_reference_model = False
    plain_ref = engine._init_frozen_causal_lm(str(step3_model_dirs[0]), "reference")
    assert plain_ref.zero_optimization_stage() == 0 and not partitioned(plain_ref.module)

    trainer = PPOTrainer(engine, engine.args)
    prompts, mask = prompt_batch(tiny_tokenizer)
    answers = torch.randint(4, len(tiny_tokenizer), (prompts.shape[0], 6), generator=torch.Generator().manual_seed(1))
    seq = torch.cat([prompts, answers], 1)
    attention_mask = torch.cat([mask, torch.ones_like(answers)], 1)
    with torch.no_grad():
        offloaded = trainer.answer_logprobs(engine.ref, seq, attention_mask, prompts.shape[1])
        plain = trainer.answer_logprobs(plain_ref, seq, attention_mask, prompts.shape[1])
    assert offloaded.shape == answers.shape
    torch.testing.assert_close(offloaded, plain, atol=1e-6, rtol=0)


def test_deepspeed_config_file_applies_to_the_actor_and_the_critic(distributed, step3_model_dirs, tiny_tokenizer,
                                                                   tmp_path):
    """--deepspeed_config is laid over both trained engines' configs, as steps 1 and 2 lay it over theirs."""
    config = tmp_path / "ds.json"
    config.write_text('{"gradient_clipping": 0.25, "train_micro_batch_size_per_gpu": 4}')
    engine = build_engine(step3_model_dirs, tiny_tokenizer, "--deepspeed_config", str(config))
    assert engine.actor.gradient_clipping() == 0.25
    assert engine.critic.gradient_clipping() == 0.25
    plain = build_engine(step3_model_dirs, tiny_tokenizer)
    assert plain.actor.gradient_clipping() == plain.critic.gradient_clipping() == 1.0
