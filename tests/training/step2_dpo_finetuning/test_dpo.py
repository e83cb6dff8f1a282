"""Tests of DPO (training/step2_dpo_finetuning/main.py) with real DeepSpeed engines and the small step-1 folder
of the session fixture `step3_model_dirs` (its config carries dropout 0.1, which DPO must switch off): the
reference is frozen, in eval mode, never gets gradients and is ZeRO-3 when the policy is; a pair whose two answers
are the same gives no gradient; precomputed reference log-probs are the per-batch ones and the reference is freed
after; a run from the CLI learns the preference and saves a model that reproduces its own evaluation."""
import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from deepspeed.runtime.engine import DeepSpeedEngine

from tests.files import saved_pair_logps
from training.step2_dpo_finetuning import main as dpo
from utils.data.data_utils import DataCollatorPreference, SampleCounter, create_prompt_dataset, pair_sample
from utils.trainer.engine import train_ds_config_from_args, train_engine_from_args

REPO = Path(__file__).resolve().parents[3]
STEP_DIR = REPO / "training" / "step2_dpo_finetuning"
TRIPLES = [(" Human: What is 7 + 12? Assistant:", " 19", " 21"),
           (" Human: Reverse the word \"abcd\". Assistant:", " dcba", " I don't know."),
           (" Human: Say \"cat\" in uppercase. Assistant:", " CAT", " CA")]

pytestmark = pytest.mark.usefixtures("one_thread", "distributed")


@pytest.fixture(autouse=True)
def free_engines():
    yield
    gc.collect()


def make_args(actor_dir, *extra):
    args = dpo.parse_args(["--model_name_or_path", str(actor_dir), "--output_dir", "unused", "--dtype", "fp32",
                           "--per_device_train_batch_size", "3", "--learning_rate", "1e-2", "--num_warmup_steps",
                           "0", "--lr_scheduler_type", "constant", *extra])
    args.dtype = "fp32"
    return args


def pair_batch(tokenizer, triples=TRIPLES):
    counter = SampleCounter("pairs")
    return DataCollatorPreference(tokenizer.pad_token_id)([pair_sample(tokenizer, *t, 64, counter) for t in triples])


def policy_engine(actor_dir, tokenizer, args):
    from transformers import AutoModelForCausalLM

    from utils.model.model_utils import create_hf_model

    ds_config = train_ds_config_from_args(args, 1)
    model = create_hf_model(AutoModelForCausalLM, str(actor_dir), tokenizer, ds_config, args.dropout)
    return train_engine_from_args(model, ds_config, args, 10)


def weights(module):
    """Every parameter's values on this rank (its ZeRO-3 partition, which in a world of one is all of it)."""
    return {name: getattr(param, "ds_tensor", param).detach().clone() for name, param in module.named_parameters()}


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_reference_is_frozen_in_eval_mode_and_never_gets_gradients(step3_model_dirs, tiny_tokenizer, zero_stage):
    actor_dir, _ = step3_model_dirs
    args = make_args(actor_dir, "--zero_stage", str(zero_stage))
    reference = dpo.load_reference(str(actor_dir), tiny_tokenizer, args, 1)
    policy = policy_engine(actor_dir, tiny_tokenizer, args)
    assert reference.zero_optimization_stage() == zero_stage  # ZeRO-3 beside a ZeRO-3 policy, ZeRO-0 otherwise
    assert not any(m.training for m in reference.module.modules())  # (DeepSpeed's own `training` flag is unused)
    assert reference.module.config.attention_dropout == 0.0  # the folder's 0.1 switched off
    before_ref, before_policy = weights(reference.module), weights(policy.module)
    batch = pair_batch(tiny_tokenizer)
    ref_logps = dpo.reference_logps(reference, batch)
    assert not ref_logps.requires_grad
    for _ in range(2):
        loss, stats = dpo.preference_batch_loss(policy, reference, batch, args)
        assert loss.requires_grad and not any(value.requires_grad for value in stats.values())
        policy.backward(loss)
        policy.step()
    for name, param in reference.module.named_parameters():
        assert not param.requires_grad and param.grad is None, name
    assert all(torch.equal(value, before_ref[name]) for name, value in weights(reference.module).items())
    assert not reference.module.training
    assert any(not torch.equal(value, before_policy[name]) for name, value in weights(policy.module).items())
    assert torch.equal(dpo.reference_logps(reference, batch), ref_logps)


def test_a_pair_of_one_answer_with_itself_gives_no_gradient(step3_model_dirs, tiny_tokenizer):
    """Chosen = rejected row for row: the policy's gradient is zero (up to float32 rounding), against gradients
    of ~1e-2 from the same answers in real pairs."""
    actor_dir, _ = step3_model_dirs
    args = make_args(actor_dir)
    reference = dpo.load_reference(str(actor_dir), tiny_tokenizer, args, 1)
    policy = policy_engine(actor_dir, tiny_tokenizer, args)

    def largest_gradient(triples):
        policy.module.zero_grad(set_to_none=True)
        loss, _ = dpo.preference_batch_loss(policy, reference, pair_batch(tiny_tokenizer, triples), args)
        policy.backward(loss)  # at ZeRO-0 the gradients stay in param.grad until the optimizer step
        return max(param.grad.abs().max().item() for param in policy.module.parameters() if param.grad is not None)

    same = [(prompt, chosen, chosen + "!") for prompt, chosen, _ in TRIPLES]
    same_batch = pair_batch(tiny_tokenizer, same)
    pairs = same_batch["input_ids"].shape[0] // 2
    for key in ("input_ids", "attention_mask", "answer_mask"):  # rejected rows := chosen rows
        same_batch[key][pairs:] = same_batch[key][:pairs]
    policy.module.zero_grad(set_to_none=True)
    loss, stats = dpo.preference_batch_loss(policy, reference, same_batch, args)
    policy.backward(loss)
    assert stats["margins"].item() == 0.0
    flat = max(param.grad.abs().max().item() for param in policy.module.parameters() if param.grad is not None)
    assert flat < 1e-7
    assert largest_gradient(TRIPLES) > 1e-3


def test_precomputed_reference_logps_are_the_per_batch_ones_and_the_reference_is_freed(step3_model_dirs,
                                                                                      tiny_tokenizer, tmp_path):
    actor_dir, _ = step3_model_dirs
    args = make_args(actor_dir, "--per_device_eval_batch_size", "5")
    train, evaluation = create_prompt_dataset(["builtin"], "1000,8,1000", str(tmp_path / "cache"), 2, 1234,
                                              tiny_tokenizer, 64)
    collator = DataCollatorPreference(tiny_tokenizer.pad_token_id)
    gc.collect()
    engines_before = sum(isinstance(obj, DeepSpeedEngine) for obj in gc.get_objects())
    train_ref, eval_ref = dpo.precompute_reference_logps([train, evaluation], str(actor_dir), tiny_tokenizer,
                                                         collator, args, 1, torch.device("cpu"))
    gc.collect()
    assert sum(isinstance(obj, DeepSpeedEngine) for obj in gc.get_objects()) == engines_before  # freed
    assert len(train_ref) == len(train) and len(eval_ref) == len(evaluation)
    assert (train_ref.counts, train_ref.split, eval_ref.split) == (train.counts, "train", "eval")  # rows still counted
    reference = dpo.load_reference(str(actor_dir), tiny_tokenizer, args, 1)
    for dataset, scored in ((train, train_ref), (evaluation, eval_ref)):
        indices = [0, len(dataset) - 1, len(dataset) // 2]  # other batches, other padding, than the precompute's
        batch = collator([dataset[i] for i in indices])
        expected = dpo.reference_logps(reference, batch)
        precomputed = collator([scored[i] for i in indices])["ref_logps"]
        torch.testing.assert_close(precomputed, expected, atol=1e-4, rtol=0)
        assert all(scored[i]["chosen_ids"] == dataset[i]["chosen_ids"] for i in indices)


def test_a_run_learns_the_preference_and_saves_a_model_that_reproduces_its_evaluation(step3_model_dirs,
                                                                                      tiny_tokenizer, tmp_path):
    """30 steps of 8 pairs from the small step-1 folder, through the CLI in a fresh process; the policy starts as
    the reference (rewards 0 before training although the folder's config asks for dropout 0.1)."""
    actor_dir, _ = step3_model_dirs
    out = tmp_path / "dpo"
    command = [sys.executable, str(STEP_DIR / "main.py"), "--model_name_or_path", str(actor_dir), "--output_dir",
               str(out), "--data_split", "1000,100,1000", "--data_output_path", str(tmp_path / "cache"),
               "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_seq_len", "64",
               "--learning_rate", "3e-3", "--beta", "0.5", "--max_steps", "30", "--print_interval", "10",
               "--eval_iters", "2", "--enable_tensorboard", "--tensorboard_path", str(tmp_path / "tb"), "--dtype",
               "fp32"]
    from processes import subprocess_env

    result = subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "throughput: latency" in result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 30
    assert metrics["chosen_rewards_before"] == 0.0 and metrics["margins_before"] == 0.0
    assert metrics["loss_before"] == pytest.approx(0.6931, abs=1e-4)  # log 2
    assert metrics["margins_after"] > 0.5 and metrics["accuracy_after"] > 0.6  # measured: 0.82 and 0.69
    assert metrics["loss_after"] < metrics["loss_before"] - 0.05  # measured: 0.693 -> 0.598
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.bin"))
    events = list((tmp_path / "tb" / "step2_dpo").glob("events.*"))
    assert events
    tags = tensorboard_tags(events[0])
    for name in ("loss", "accuracy", "chosen_rewards", "rejected_rewards", "margins", "chosen_logps",
                 "rejected_logps"):
        assert f"train/{name}" in tags and f"eval/{name}" in tags
    # The saved folder gives the policy log-probs the run reported for its first two eval batches.
    chosen, rejected = saved_pair_logps(out, tmp_path / "cache", tiny_tokenizer)
    assert chosen == pytest.approx(metrics["chosen_logps_after"], abs=1e-3)
    assert rejected == pytest.approx(metrics["rejected_logps_after"], abs=1e-3)


def tensorboard_tags(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(path))
    accumulator.Reload()
    return set(accumulator.Tags()["scalars"])
