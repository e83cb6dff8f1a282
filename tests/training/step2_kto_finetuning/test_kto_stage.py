"""Tests of KTO (training/step2_kto_finetuning/main.py) with real DeepSpeed engines and the small step-1 folder of the
session fixture `step3_model_dirs`: the reference is frozen and gets no gradient, and neither the reference's
log-probs nor the KL estimate carry one; a run from the CLI lowers the loss, learns which answers are desirable and
saves a model that reproduces its own evaluation."""
import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.step2_kto_finetuning import main as kto
from utils.data.data_utils import DataCollatorFeedback, SampleCounter, create_prompt_dataset, feedback_samples
from utils.trainer.engine import train_ds_config_from_args, train_engine_from_args

REPO = Path(__file__).resolve().parents[3]
STEP_DIR = REPO / "training" / "step2_kto_finetuning"
TRIPLES = [(" Human: What is 7 + 12? Assistant:", " 19", " 21"),
           (" Human: Reverse the word \"abcd\". Assistant:", " dcba", " I don't know."),
           (" Human: Say \"cat\" in uppercase. Assistant:", " CAT", None)]

pytestmark = pytest.mark.usefixtures("one_thread", "distributed")


@pytest.fixture(autouse=True)
def free_engines():
    yield
    gc.collect()


def make_args(actor_dir, *extra):
    args = kto.parse_args(["--model_name_or_path", str(actor_dir), "--output_dir", "unused", "--dtype", "fp32",
                           "--learning_rate", "1e-2", "--num_warmup_steps", "0", "--lr_scheduler_type", "constant",
                           *extra])
    args.dtype = "fp32"
    return args


def feedback_batch(tokenizer):
    counter = SampleCounter("feedback")
    samples = [sample for triple in TRIPLES for sample in feedback_samples(tokenizer, *triple, 64, counter)]
    return DataCollatorFeedback(tokenizer.pad_token_id)(samples)


def test_the_reference_and_the_kl_estimate_carry_no_gradient(step3_model_dirs, tiny_tokenizer):
    """At step 0 the policy is the reference: every r and z_0 are 0 and each answer's loss is lambda (1 -
    sigmoid(0)); after two steps the policy moved, the reference did not and never got a gradient."""
    from transformers import AutoModelForCausalLM

    from utils.model.model_utils import create_hf_model

    actor_dir, _ = step3_model_dirs
    args = make_args(actor_dir, "--desirable_weight", "1.5", "--beta", "0.5")
    reference = kto.load_reference(str(actor_dir), tiny_tokenizer, args, 1)
    ds_config = train_ds_config_from_args(args, 1)
    model = create_hf_model(AutoModelForCausalLM, str(actor_dir), tiny_tokenizer, ds_config, args.dropout)
    policy = train_engine_from_args(model, ds_config, args, 10)
    batch = feedback_batch(tiny_tokenizer)
    assert batch["desirable"].tolist() == [True, False, True, False, True]
    loss, stats = kto.feedback_batch_loss(policy, reference, batch, args)
    assert loss.item() == pytest.approx((3 * 1.5 * 0.5 + 2 * 0.5) / 5, abs=1e-6)
    assert stats["kl"].item() == 0.0 and stats["desirable_rewards"].item() == pytest.approx(0.0, abs=1e-6)
    assert loss.requires_grad and not any(value.requires_grad for value in stats.values())
    before = {name: param.detach().clone() for name, param in reference.module.named_parameters()}
    for _ in range(2):
        loss, stats = kto.feedback_batch_loss(policy, reference, batch, args)
        policy.backward(loss)
        policy.step()
    for name, param in reference.module.named_parameters():
        assert not param.requires_grad and param.grad is None and torch.equal(param, before[name]), name
    after, stats = kto.feedback_batch_loss(policy, reference, batch, args)
    assert after.item() < loss.item() and stats["desirable_rewards"] > stats["undesirable_rewards"]


def test_a_run_learns_which_answers_are_desirable_and_saves_a_model_that_reproduces_its_evaluation(
        step3_model_dirs, tiny_tokenizer, tmp_path):
    """60 steps of 16 answers (8 pairs unpacked) from the small step-1 folder, through the CLI in a fresh process;
    the policy starts as the reference (loss 1 - sigmoid(0) = 0.5 before training although the folder's config
    asks for dropout 0.1)."""
    actor_dir, _ = step3_model_dirs
    out = tmp_path / "kto"
    command = [sys.executable, str(STEP_DIR / "main.py"), "--model_name_or_path", str(actor_dir), "--output_dir",
               str(out), "--data_split", "1000,100,1000", "--data_output_path", str(tmp_path / "cache"),
               "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "32", "--max_seq_len", "64",
               "--learning_rate", "5e-3", "--beta", "1.0", "--max_steps", "60", "--print_interval", "10",
               "--eval_iters", "2", "--enable_tensorboard", "--tensorboard_path", str(tmp_path / "tb"), "--dtype",
               "fp32"]
    from processes import subprocess_env

    result = subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "lambda_D n_D / (lambda_U n_U) = 1 " in result.stdout  # the built-in pairs: one of each kind
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 60
    assert metrics["loss_before"] == pytest.approx(0.5, abs=1e-6) and metrics["desirable_rewards_before"] == 0.0
    # Measured on an AMD EPYC (fp32): 0.5 -> 0.432; desirable answers -32.2 -> -24.6 nats, rewards 7.6 against 5.5,
    # z_0 0 -> 6.4. (30 steps at 1e-2, as before, ended at 0.42 on an Intel Xeon and 0.46 on the EPYC: too close.)
    assert metrics["loss_after"] < metrics["loss_before"] - 0.03
    assert metrics["desirable_logps_after"] > metrics["desirable_logps_before"] + 0.5
    assert metrics["desirable_rewards_after"] > metrics["undesirable_rewards_after"] and metrics["kl_after"] > 0
    assert metrics["train_rows_kept"] == 2 * 2858  # the 2858 pairs of part 2 as labelled answers
    tags = tensorboard_tags(next((tmp_path / "tb" / "step2_kto").glob("events.*")))
    for name in ("loss", "kl", "desirable_rewards", "undesirable_rewards", "desirable_logps"):
        assert f"train/{name}" in tags and f"eval/{name}" in tags
    # The saved folder gives the policy log-probs the run reported for its first two eval batches (64 answers).
    from transformers import AutoModelForCausalLM

    from utils.rl.tokens import sequence_logprobs

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    _, evaluation = create_prompt_dataset(["builtin"], "1000,100,1000", str(tmp_path / "cache"), 2, 1234,
                                          tiny_tokenizer, 64, unpaired=True)
    batch = DataCollatorFeedback(tiny_tokenizer.pad_token_id)([evaluation[i] for i in range(64)])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logps = sequence_logprobs(logits, batch["input_ids"], batch["answer_mask"])
    means = [logps[32 * i:32 * (i + 1)][batch["desirable"][32 * i:32 * (i + 1)]].mean() for i in range(2)]
    assert (means[0] + means[1]).item() / 2 == pytest.approx(metrics["desirable_logps_after"], abs=1e-3)


def tensorboard_tags(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(path))
    accumulator.Reload()
    return set(accumulator.Tags()["scalars"])
