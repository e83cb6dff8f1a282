"""Tests of utils/data/packing.py (`--packing` in steps 1 and 2): rows packed within --max_seq_len, positions and
labels per sample, and, on the real tiny model with real batches whose lengths vary, the same SFT loss and
gradients, and the same reward-model scores, loss and gradients, as the padded batches give."""
import json
import os
import random

import pytest
import torch

from utils.data.data_utils import (IGNORE_INDEX, DataCollatorReward, DataCollatorSFT, create_prompt_dataset,
                                   make_dataloader)
from utils.data.packing import (DataCollatorPackedReward, DataCollatorPackedSFT, batch_counts,
                                check_keeps_samples_apart, pack_lengths, pack_rows)
from utils.runtime.errors import ConfigError

MAX_SEQ_LEN = 256


@pytest.mark.parametrize("seed", range(5))
def test_pack_lengths_places_every_sample_once_within_capacity(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(2, 100) for _ in range(rng.randint(1, 40))]
    rows = pack_lengths(lengths, 128)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 128 for row in rows)
    assert len(rows) <= len(lengths)
    # first-fit decreasing is never worse than 11/9 of the optimum + 1 rows (and the optimum needs the sum)
    assert len(rows) <= 11 / 9 * -(-sum(lengths) // 128) + 1


def test_pack_lengths_gives_an_overlong_sample_its_own_row():
    assert pack_lengths([5, 300, 5], 128) == [[1], [0, 2]]


def test_pack_rows_restarts_positions_per_sample_and_pads_each_token_apart():
    input_ids, position_ids, starts = pack_rows([[1, 2, 3], [4, 5], [6, 7, 8, 9]], 5, pad_token_id=0)
    assert input_ids.tolist() == [[6, 7, 8, 9, 0], [1, 2, 3, 4, 5]]
    assert position_ids.tolist() == [[0, 1, 2, 3, 0], [0, 1, 2, 0, 1]]
    assert starts == [(1, 0), (1, 3), (0, 0)]


def sft_samples(tokenizer, count, seed=0):
    """SFT samples as step 1 makes them: the same sequence labelled -100 on a prompt of random length."""
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        ids = [rng.randrange(4, len(tokenizer)) for _ in range(rng.randint(3, 60))]
        prompt = rng.randint(1, len(ids) - 1)
        samples.append({"input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:]})
    return samples


def test_packed_sft_labels_stay_within_their_sample(tiny_tokenizer):
    samples = sft_samples(tiny_tokenizer, 12)
    batch = DataCollatorPackedSFT(tiny_tokenizer.pad_token_id, 100)(samples)
    assert set(batch) == {"input_ids", "position_ids", "labels"}
    assert batch["input_ids"].shape[0] < len(samples) and batch["input_ids"].shape[1] <= 100
    # every sample found whole where its positions run 0..n-1, with its own labels; the shifted target of a
    # sample's last token (the next sample's first, or padding) is -100
    found = []
    for row_ids, row_positions, row_labels in zip(batch["input_ids"], batch["position_ids"], batch["labels"]):
        starts = [t for t in range(len(row_positions)) if row_positions[t] == 0]
        for start, end in zip(starts, starts[1:] + [len(row_positions)]):
            assert row_positions[start:end].tolist() == list(range(end - start))
            assert row_labels[start] == IGNORE_INDEX
            found.append((row_ids[start:end].tolist(), row_labels[start + 1:end].tolist()))
    for sample in samples:
        assert (sample["input_ids"], sample["labels"][1:]) in found
    padded = DataCollatorSFT(tiny_tokenizer.pad_token_id)(samples)
    assert (batch["labels"] != IGNORE_INDEX).sum() == (padded["labels"][:, 1:] != IGNORE_INDEX).sum()
    assert batch_counts(batch) == batch_counts(padded) == (12, sum(len(s["input_ids"]) for s in samples))


def test_packed_reward_batch_points_at_each_sequence_end(tiny_tokenizer):
    pairs = [{"chosen_ids": s["input_ids"], "rejected_ids": s["input_ids"][:-1] + [3], "prompt_len": 1}
             for s in sft_samples(tiny_tokenizer, 6)]
    batch = DataCollatorPackedReward(tiny_tokenizer.pad_token_id, 128)(pairs)
    sequences = [p["chosen_ids"] for p in pairs] + [p["rejected_ids"] for p in pairs]
    assert batch["sequence_ends"].shape == (12, 2)
    for sequence, (row, end) in zip(sequences, batch["sequence_ends"].tolist()):
        start = end - len(sequence) + 1
        assert batch["input_ids"][row, start:end + 1].tolist() == sequence
        assert batch["position_ids"][row, start:end + 1].tolist() == list(range(len(sequence)))
    assert batch_counts(batch) == batch_counts(DataCollatorReward(tiny_tokenizer.pad_token_id)(pairs))


# --------------------------------------------------------------------------- the real tiny model, real batches


@pytest.fixture(scope="module")
def varied_data(tmp_path_factory):
    """The built-in task's rows behind a dialogue history of 0 to 8 earlier turns, so prompt + answer runs from
    ~20 to ~200 tokens as real dialogue does."""
    from utils.data.raw_datasets import builtin_data_dir

    out = tmp_path_factory.mktemp("varied")
    rng = random.Random(0)
    for split in ("train", "eval"):
        rows = []
        with open(builtin_data_dir() / f"{split}.json") as f:
            for line in list(f)[:96]:
                row = json.loads(line)
                turns = [(rng.randint(1, 99), rng.randint(1, 99)) for _ in range(rng.choice([0, 0, 1, 2, 4, 8]))]
                history = "".join(f" Human: What is {a} + {b}? Assistant: {a + b}." for a, b in turns)
                rows.append(dict(row, prompt=history + row["prompt"]))
        (out / f"{split}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out


def first_batches(dataset, collator, batch_size=16, count=2):
    loader = make_dataloader(dataset, collator, batch_size, shuffle=True, seed=1234)
    return [batch for _, batch in zip(range(count), loader)]


def gradients(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def assert_same_gradients(padded, packed):
    """Equal up to fp32 rounding in another order (measured: max |difference| ~5e-6 of the largest gradient);
    samples that saw each other, or a label across a boundary, move gradients by a good fraction of it."""
    assert (padded - packed).abs().max() < 1e-4 * padded.abs().max()


def test_packed_sft_loss_and_gradients_equal_the_padded_ones(tiny_model_dir, tiny_tokenizer, varied_data, tmp_path):
    from transformers import AutoModelForCausalLM

    dataset, _ = create_prompt_dataset([str(varied_data)], "1,1,1", str(tmp_path), 1, 1234, tiny_tokenizer,
                                       MAX_SEQ_LEN)
    padded = first_batches(dataset, DataCollatorSFT(tiny_tokenizer.pad_token_id))
    packed = first_batches(dataset, DataCollatorPackedSFT(tiny_tokenizer.pad_token_id, MAX_SEQ_LEN))
    lengths = [int(n) for batch in padded for n in batch["attention_mask"].sum(1)]
    assert min(lengths) < 50 and max(lengths) > 150  # lengths vary as dialogue does
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    check_keeps_samples_apart(model)
    for padded_batch, packed_batch in zip(padded, packed):
        assert packed_batch["input_ids"].numel() < padded_batch["input_ids"].numel() * 0.75
        losses, grads = [], []
        for batch in (padded_batch, packed_batch):
            model.zero_grad()
            loss = model(**batch, use_cache=False).loss
            loss.backward()
            losses.append(loss.item())
            grads.append(gradients(model))
        assert losses[0] == pytest.approx(losses[1], abs=1e-5)
        assert_same_gradients(*grads)


def test_packed_reward_scores_loss_and_gradients_equal_the_padded_ones(tiny_model_dir, tiny_tokenizer, varied_data,
                                                                       tmp_path):
    from utils.model.reward_model import RewardModel

    dataset, _ = create_prompt_dataset([str(varied_data)], "1,1,1", str(tmp_path), 2, 1234, tiny_tokenizer,
                                       MAX_SEQ_LEN)
    padded = first_batches(dataset, DataCollatorReward(tiny_tokenizer.pad_token_id), batch_size=8)
    packed = first_batches(dataset, DataCollatorPackedReward(tiny_tokenizer.pad_token_id, MAX_SEQ_LEN),
                           batch_size=8)
    torch.manual_seed(0)
    model = RewardModel.from_pretrained(str(tiny_model_dir), tiny_tokenizer)
    torch.nn.init.normal_(model.v_head.weight, std=0.5)  # scores well apart from zero
    for padded_batch, packed_batch in zip(padded, packed):
        assert packed_batch["input_ids"].numel() < padded_batch["input_ids"].numel() * 0.75
        outputs, grads = [], []
        for batch in (padded_batch, packed_batch):
            model.zero_grad()
            out = model(**batch)
            out["loss"].backward()
            outputs.append(out)
            grads.append(gradients(model))
        for key in ("chosen_end_scores", "rejected_end_scores"):
            assert outputs[0][key].abs().max() > 1e-2
            assert torch.allclose(outputs[0][key], outputs[1][key], atol=1e-5)
        assert outputs[0]["loss"].item() == pytest.approx(outputs[1]["loss"].item(), abs=1e-6)
        assert_same_gradients(*grads)


def test_a_model_that_lets_packed_samples_see_each_other_is_refused(small_config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    check_keeps_samples_apart(AutoModelForCausalLM.from_config(small_config("llama")))
    with pytest.raises(ConfigError, match="--packing: OPTForCausalLM does not keep packed samples apart"):
        check_keeps_samples_apart(AutoModelForCausalLM.from_config(small_config("opt")))


# --------------------------------------------------------------------------- the step mains, packed and padded


@pytest.mark.parametrize("step", [1, 2])
def test_step_main_with_packing_measures_what_the_padded_run_measures(step, varied_data, tmp_path, one_thread,
                                                                      distributed):
    """Steps 1 and 2 run as their mains run (in this process), 2 optimizer steps on the varied data, packed and
    padded: the eval figures before and after training (step 1's perplexity, step 2's mean scores and accuracy)
    agree, so packing reaches the model, the loss and the evaluation the same way in both steps."""
    from training.step1_supervised_finetuning import main as step1
    from training.step2_reward_model_finetuning import main as step2

    figures = {}
    for packing in (False, True):
        out = tmp_path / f"out_{packing}"
        argv = ["--data_path", str(varied_data), "--data_split", "1,1,1", "--data_output_path",
                str(tmp_path / "cache"), "--output_dir", str(out), "--max_steps", "2", "--dtype", "fp32",
                "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_seq_len",
                str(MAX_SEQ_LEN)] + (["--packing"] if packing else [])
        environment = dict(os.environ)  # a step's start-up sets RANK, MASTER_PORT...: later subprocesses must not
        try:                             # inherit them
            (step1 if step == 1 else step2).main(argv)
        finally:
            os.environ.clear()
            os.environ.update(environment)
        figures[packing] = json.loads((out / "metrics.json").read_text())
    keys = [k for k in figures[False] if k.endswith(("_before", "_after"))]
    assert len(keys) >= 2
    assert figures[False]["optimizer_steps"] == figures[True]["optimizer_steps"] == 2
    for key in keys:
        assert figures[True][key] == pytest.approx(figures[False][key], rel=1e-4, abs=1e-5), key
    before, after = ("perplexity_before", "perplexity_after") if step == 1 else ("score_diff_before",
                                                                                 "score_diff_after")
    assert figures[False][before] != figures[False][after]  # training moved what is compared
