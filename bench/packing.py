"""Step 1's training tokens/s with `--packing` (utils/data/packing.py) against dynamic padding (each batch padded to
its longest sample, step 1's default), on synthetic SFT data whose lengths vary as dialogue does.

Two engines are built as step 1 builds them, from the same weights, and trained in alternation on the same
batches, one packed and one padded: their per-step losses must agree (packing changes no sample's loss), so the
figure compares the same training at two speeds. The data is generated here, offline and seeded: lengths drawn
from a log-normal (median LENGTHS["median"] tokens, tens to hundreds, capped at --max_seq_len), a random share of
each sample a prompt (labels -100), token ids uniform over the tiny model's vocabulary.
"""
import math

import numpy as np
import torch

from bench.measure import paired_rates
from bench.models import model_path
from bench.step1 import batch_runner, build_engine, engine_train_step, step1_args
from utils.data.data_utils import DataCollatorSFT
from utils.data.packing import DataCollatorPackedSFT, check_keeps_samples_apart
from utils.model.model_utils import load_tokenizer

CASE = {"model": "tiny", "dtype": "auto", "batch_size": 16, "max_seq_len": 512, "num_batches": 6,
        "steps_per_run": 2}
LENGTHS = {"median": 90, "sigma": 0.75, "min": 16, "prompt_share": (0.3, 0.7)}
SEED = 0


def dialogue_samples(count, vocab_size, max_seq_len, seed=SEED):
    """`count` SFT samples (input_ids, labels -100 on the prompt) of log-normal lengths:
    n = clip(round(median * exp(sigma * z)), min, max_seq_len), z ~ N(0, 1), prompt = round(n * u),
    u ~ U(prompt_share)."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        length = int(np.clip(round(LENGTHS["median"] * math.exp(LENGTHS["sigma"] * rng.standard_normal())),
                             LENGTHS["min"], max_seq_len))
        prompt = max(1, round(length * rng.uniform(*LENGTHS["prompt_share"])))
        ids = rng.integers(4, vocab_size, length).tolist()
        samples.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return samples


def measure_packing(repeats, warmup, case=CASE):
    """Tokens/s of step 1 packed (`ours`) and padded (`baseline`), their ratio pair by pair, both runs' first and
    last losses and the largest difference of their per-step losses, and the positions each computes per batch."""
    path = model_path(case["model"])
    tokenizer = load_tokenizer(path)
    args = step1_args(path, case["dtype"], case["batch_size"], case["max_seq_len"])
    samples = dialogue_samples(case["batch_size"] * case["num_batches"], len(tokenizer), case["max_seq_len"])
    chunks = [samples[i:i + case["batch_size"]] for i in range(0, len(samples), case["batch_size"])]
    padded = [DataCollatorSFT(tokenizer.pad_token_id)(chunk) for chunk in chunks]
    packed = [DataCollatorPackedSFT(tokenizer.pad_token_id, case["max_seq_len"])(chunk) for chunk in chunks]
    engines, losses = {}, {"ours": [], "baseline": []}
    for side in ("ours", "baseline"):
        torch.manual_seed(args.seed)
        engines[side] = build_engine(args, tokenizer)
    check_keeps_samples_apart(engines["ours"].module)

    def stepper(side):
        return lambda batch: losses[side].append(engine_train_step(engines[side], batch).item())

    config = engines["ours"].module.config
    rates = paired_rates(batch_runner(stepper("ours"), packed, config, case["steps_per_run"]),
                         batch_runner(stepper("baseline"), padded, config, case["steps_per_run"]), repeats, warmup)
    lengths = [len(s["input_ids"]) for s in samples]
    rates.update(dtype=args.dtype, batch_size=case["batch_size"], max_seq_len=case["max_seq_len"],
                 steps_per_run=case["steps_per_run"], steps=len(losses["ours"]),
                 first_loss={side: values[0] for side, values in losses.items()},
                 last_loss={side: values[-1] for side, values in losses.items()},
                 max_loss_difference=max(abs(a - b) for a, b in zip(losses["ours"], losses["baseline"])),
                 lengths={"min": min(lengths), "median": float(np.median(lengths)), "max": max(lengths)},
                 positions_per_batch={"ours": float(np.mean([b["input_ids"].numel() for b in packed])),
                                      "baseline": float(np.mean([b["input_ids"].numel() for b in padded])),
                                      "real": float(np.mean(lengths)) * case["batch_size"]})
    return rates
