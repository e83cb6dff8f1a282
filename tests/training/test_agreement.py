"""Agreement: steps 1 and 2 give the same per-step losses on one process and on two, at ZeRO-2 and at ZeRO-3.

Each run is the real step `main.py` through its `run.sh` (the `deepspeed` launcher, gloo, one thread per process)
on the built-in tiny model, 5 optimizer steps of 16 samples (pairs in step 2), with the per-step training loss
read from the run's TensorBoard scalars (`train/loss`, written at every step with --print_interval 1; it is the
loss of the step's last micro-batch averaged over the ranks). The runs compared hold micro-batch x gradient
accumulation x world size at 16:

- one process, micro-batch 16 vs two processes, micro-batch 8 (ZeRO-2 both): the same 16 samples make each step
  (epoch 0 of RandomSampler(seed) and of DistributedSampler(seed) both take torch.randperm(n) of a generator
  seeded with the seed; rank r of two takes every other index of it), and the logged loss is the mean over the
  same 16 samples.
- two processes at ZeRO-2 vs at ZeRO-3 (micro-batch 8): the same data, the parameters partitioned differently.
- gradient accumulation, one process: micro-batch 8 x 2 accumulation steps vs micro-batch 16 x 1. With
  accumulation the logged loss is the last micro-batch's alone, so these two are compared on what the run
  measures after its 5 steps (metrics.json: step 1's eval loss, step 2's mean eval scores of chosen and rejected).
  AdamW is nearly blind to a gradient's scale, so this catches micro-batches left out of a step or a step taken
  per micro-batch, not a wrong 1/accumulation factor.

The step-1 loss is a mean over answer tokens per micro-batch, so two micro-batches of 8 equal one of 16 only
when every sample has the same number of answer tokens: the data is the built-in task's rows whose chosen
answer is 3 tokens + EOS (a Bradley-Terry loss is a mean over pairs, so step 2 needs no such care).

What remains is fp32 arithmetic in another order: gloo's all-reduce sums the two ranks' gradients where one
process sums over its batch, ZeRO-2 and ZeRO-3 reduce in buckets of different shapes, and batches padded to
different lengths run matmuls of different shapes. Measured on a 2-core CPU (max |difference| over the 5
per-step losses, losses ~6.2 -> 5.5 in step 1 and ~0.65-0.76 in step 2):

    step 1: 1 vs 2 processes 4.8e-7 (one fp32 ulp at 6), ZeRO-2 vs ZeRO-3 0;  accumulation, eval loss 0
    step 2: 1 vs 2 processes 1.2e-7, ZeRO-2 vs ZeRO-3 6.0e-8;  accumulation, eval scores 8.7e-6

and on the tiny model of task version 2 with the 512-token tokenizer (another tokenizer and initialisation, same
code), step 2: 1 vs 2 processes 9.9e-6, ZeRO-2 vs ZeRO-3 4.1e-6, accumulation 2.1e-4. The first step's loss is
bit-identical in every run and the difference grows step after step (1e-7, 1e-6, 6e-6, 1e-5): AdamW compounds
the rounding, by an amount that depends on the model. The tolerances are therefore set against the size of a
fault rather than of one configuration's rounding: LOSS_TOLERANCE 1e-4 and EVAL_TOLERANCE 1e-3, ten times the
largest rounding measured and a hundred (ten) times below a fault. A fault that feeds a step other samples (a
rank reading the wrong part, a micro-batch left out) moves its loss by 1e-2 to 5e-2 here (the accumulated runs'
logged losses, of 8 other samples, differ from the others' by that much), and one that changes the update
(gradients not averaged over the ranks, a lost ZeRO-3 update) moves every later loss. The saved weights are not
compared: AdamW turns a rounding-level difference in a near-zero gradient into a step of up to the learning rate
(measured up to 2e-4 here), so weights say less than the losses and eval figures computed from them.
"""
import json
import math
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = {1: ("step1_supervised_finetuning", "step1_sft"), 2: ("step2_reward_model_finetuning", "step2_reward")}
NUM_STEPS = 5
ANSWER_TOKENS = 4  # answer + EOS
LOSS_TOLERANCE = 1e-4
EVAL_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, tiny_tokenizer):
    """train.json / eval.json: built-in task rows whose chosen answer is ANSWER_TOKENS tokens with EOS."""
    from utils.data.data_utils import tokenize_answer
    from utils.data.raw_datasets import builtin_data_dir

    out = tmp_path_factory.mktemp("agreement_data")
    for split, count in (("train", 600), ("eval", 60)):
        rows = []
        with open(builtin_data_dir() / f"{split}.json") as f:
            for line in f:
                row = json.loads(line)
                if len(tokenize_answer(tiny_tokenizer, row["chosen"])) == ANSWER_TOKENS:
                    rows.append(row)
                if len(rows) == count:
                    break
        assert len(rows) == count
        (out / f"{split}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out


def run_step(step, tmp_path, name, deployment, zero_stage, micro_batch, accumulation, data_dir):
    """Run step 1 or 2 for NUM_STEPS optimizer steps; (its per-step training losses, its output folder)."""
    folder, run_name = STEPS[step]
    out, tensorboard = tmp_path / name, tmp_path / f"{name}_tb"
    script = ROOT / "training" / folder / "training_scripts" / deployment / "run.sh"
    flags = ["--data_path", str(data_dir), "--data_split", "1,1,1", "--data_output_path", str(tmp_path / "cache"),
             "--max_steps", str(NUM_STEPS), "--per_device_train_batch_size", str(micro_batch),
             "--gradient_accumulation_steps", str(accumulation), "--per_device_eval_batch_size", "16",
             "--max_seq_len", "64", "--learning_rate", "1e-3", "--num_warmup_steps", "0", "--print_interval", "1",
             "--dtype", "fp32", "--enable_tensorboard", "--tensorboard_path", str(tensorboard)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result = subprocess.run(["bash", str(script), "--output_dir", str(out), "--zero_stage", str(zero_stage),
                             "--model_name_or_path", "tiny", *flags], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    processes = 2 if deployment == "single_node" else 1
    assert f"ZeRO-{zero_stage}, {processes} process(es)" in result.stdout
    return tensorboard_losses(tensorboard / run_name), out


def tensorboard_losses(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    scalars = events.Scalars("train/loss")
    assert [event.step for event in scalars] == list(range(1, NUM_STEPS + 1))
    return [event.value for event in scalars]


def max_difference(a, b):
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def eval_figures(out):
    """What the run measured after its steps: step 1's eval loss, step 2's eval scores."""
    metrics = json.loads((out / "metrics.json").read_text())
    keys = [key for key in ("perplexity_after", "chosen_score_after", "rejected_score_after") if key in metrics]
    assert keys
    return [math.log(metrics[key]) if key == "perplexity_after" else metrics[key] for key in keys]


@pytest.mark.e2e
@pytest.mark.parametrize("step", [1, 2])
def test_one_process_two_processes_zero_stages_and_accumulation_agree(step, tmp_path, data_dir):
    runs = {name: run_step(step, tmp_path, name, deployment, zero_stage, micro_batch, accumulation, data_dir)
            for name, deployment, zero_stage, micro_batch, accumulation in (
                ("one", "single_gpu", 2, 16, 1), ("two", "single_node", 2, 8, 1),
                ("two_zero3", "single_node", 3, 8, 1), ("one_accumulated", "single_gpu", 2, 8, 2))}
    losses = {name: run[0] for name, run in runs.items()}
    figures = {name: eval_figures(run[1]) for name, run in runs.items()}
    measured = {"loss 1p-2p": max_difference(losses["one"], losses["two"]),
                "loss zero2-zero3": max_difference(losses["two"], losses["two_zero3"]),
                "eval accumulation": max_difference(figures["one"], figures["one_accumulated"])}
    print(f"step {step}: losses {losses}\nstep {step}: " + ", ".join(f"{k} {v:.3g}" for k, v in measured.items()))
    assert max(losses["one"]) - min(losses["one"]) > 1e-2  # the losses move: agreeing on a constant proves nothing
    assert measured["loss 1p-2p"] < LOSS_TOLERANCE
    assert measured["loss zero2-zero3"] < LOSS_TOLERANCE
    assert measured["eval accumulation"] < EVAL_TOLERANCE
