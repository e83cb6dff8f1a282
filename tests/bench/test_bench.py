"""The bench's smoke mode end to end: `python -m bench --quick` runs every section on the tiny model and writes a
JSON with every figure present, finite and (where it is a rate, a ratio or a size) positive. No speed thresholds:
the figures of a smoke run on a shared machine mean nothing."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("machine", "peak_matmul_flops", "step1", "mfu", "rollout", "ppo", "memory")


def numbers(tree, path=""):
    """(path, value) of every number in a nested dict / list."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from numbers(value, f"{path}.{key}")
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from numbers(value, f"{path}[{index}]")
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield path, tree


def assert_positive(summary, what):
    assert set(summary) == {"min", "median", "max", "n"}, what
    assert 0 < summary["min"] <= summary["median"] <= summary["max"] < math.inf, (what, summary)


@pytest.mark.e2e  # about 2-3 minutes on 2 cores: the default run stays under its 20 minutes
def test_quick_bench_writes_every_section(tmp_path):
    output, report = tmp_path / "results.json", tmp_path / "docs" / "bench-quick.md"
    run = subprocess.run([sys.executable, "-m", "bench", "--quick", "--output", str(output), "--report", str(report)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads(output.read_text())
    assert set(SECTIONS) <= set(results)
    for path, value in numbers({key: results[key] for key in SECTIONS if key != "machine"}):
        assert math.isfinite(value), path

    for dtype in ("fp32", "bf16"):
        assert_positive(results["peak_matmul_flops"][dtype], dtype)
        assert 128 <= results["peak_matmul_size"][dtype] <= 2048
    step1 = results["step1"]["tiny"]
    # --quick runs in the dtype `--dtype auto` picks on this machine, and says why.
    assert step1["dtype"] == results["mfu"]["tiny"]["dtype"] == results["machine"]["dtype"]
    assert results["machine"]["dtype_why"].startswith("auto: ")
    for figure in (step1["ours"]["tokens"], step1["baseline"]["tokens"], step1["ours"]["flops"], step1["ratio"],
                   results["mfu"]["tiny"]["ours"], results["mfu"]["tiny"]["baseline"]):
        assert_positive(figure, "step 1 / MFU")
    rollout = results["rollout"]
    for figure in (rollout["ours"]["tokens"], rollout["baseline"]["tokens"], rollout["ratio"]):
        assert_positive(figure, "rollout")
    ppo = results["ppo"]
    assert_positive(ppo["samples_per_s"], "samples/s")
    for part in ("generation", "experience_actor", "experience_ref", "experience_critic", "experience_reward",
                 "training"):
        assert_positive(ppo["seconds"][part], part)
    assert abs(sum(share["median"] for share in ppo["share"].values()) - 1) < 0.05
    memory = results["memory"]
    assert {"step1 tiny zero0 x1", "step1 tiny zero0 x2"} <= set(memory)
    for label, figure in memory.items():
        assert 0 < figure["peak_rss_mb"] < math.inf and len(figure["per_rank_mb"]) == int(label[-1]), label
    assert "| step 1 train tokens/s" in run.stdout
    # The page under docs/: the command, the machine, the commit and the tables, and the plot of the ratios.
    page = report.read_text()
    assert f"python -m bench --quick --output {output} --report {report}" in page
    assert "commit " in page and results["machine"]["dtype"] in page and "| step 1 train tokens/s" in page
    assert "![paired ratios](bench-quick.png)" in page
    assert report.with_suffix(".png").read_bytes().startswith(b"\x89PNG")


def test_packing_section_trains_the_same_losses_packed_and_padded(one_thread, distributed):
    """bench/packing.py on a small case: two step-1 engines, one on packed and one on padded batches of the same
    synthetic samples, give the same per-step losses (over optimizer steps, so the updates agree too), and packing
    computes fewer positions. No speed threshold (the figure is the bench's)."""
    from bench.packing import CASE, measure_packing

    # fp32: the two layouts sum the same numbers in another order, which bf16 (auto on a CPU with native bf16)
    # rounds to differences of ~1e-3.
    result = measure_packing(repeats=2, warmup=1, case=dict(CASE, dtype="fp32", batch_size=8, max_seq_len=128,
                                                            num_batches=2, steps_per_run=1))
    assert result["steps"] == 3
    assert result["first_loss"]["ours"] != result["last_loss"]["ours"]  # the model trains: losses move
    assert result["max_loss_difference"] < 1e-4
    positions = result["positions_per_batch"]
    assert positions["real"] <= positions["ours"] < positions["baseline"]
    assert all(ratio > 0 for ratio in result["ratio"])


def test_groups_section_computes_the_same_logits_on_fewer_positions(one_thread):
    """bench/groups.py on a small case: the shared-prompt pass and the full pass give the same logits, and the
    shared one computes fewer positions. No speed threshold (the figure is the bench's)."""
    from bench.groups import CASE, measure_groups

    result = measure_groups("tiny", repeats=1, warmup=0, case=dict(CASE, group=4, prompt_len=20, answer_len=4))
    assert result["max_logit_difference"] < 1e-4
    assert result["positions"]["ours"] < result["positions"]["baseline"]
    assert len(result["ratio"]) == 1 and result["ratio"][0] > 0


def test_head_section_gives_the_full_logits_values_fused(one_thread, distributed):
    """bench/head.py on the tiny model: the fused output layer gives step 1's loss and step 3's log-probs and
    gradients of the full logits, and both sides are timed. No speed threshold (the figure is the bench's)."""
    from bench.head import SHAPES, measure_head_step1, measure_head_step3

    step1 = measure_head_step1("tiny", repeats=1, warmup=0, num_batches=1)
    assert step1["max_loss_difference"] < 1e-5
    step3 = measure_head_step3("tiny", "groups", repeats=1, warmup=0, dtype="fp32",
                               case=dict(SHAPES["groups"], group=2, prompt_len=10, answer_len=3))
    assert step3["max_difference"] < 1e-5
    for result in (step1, step3):
        assert len(result["ratio"]) == 1 and result["ratio"][0] > 0


@pytest.mark.e2e
def test_compile_section_measures_compiled_against_eager(tmp_path):
    output = tmp_path / "results.json"
    run = subprocess.run([sys.executable, "-m", "bench", "--sections", "compile", "--models", "tiny", "--repeats",
                          "1", "--output", str(output)], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(output.read_text())["compile"]["tiny"]
    assert result["compile_seconds"] > 0
    for side in ("ours", "baseline"):
        for figure in ("tokens", "flops", "mfu"):
            assert_positive(result[side][figure], f"{side} {figure}")
    assert_positive(result["ratio"], "ratio")
    assert "--compile vs eager" in run.stdout


def test_sampler_section_measures_both_sides_on_the_groups_shape(one_thread):
    """bench/sampler.py on one small batch: both sides generate answer tokens for 4 prompts x 8 rows."""
    from bench.sampler import measure_sampler, sampler_models

    assert sampler_models(["tiny"])[0] == "tiny"
    result = measure_sampler("tiny", "groups", 4, "fp32", repeats=1, warmup=0, batches=1)
    assert result["rows"] == 32 and result["max_new_tokens"] == 4
    for side in ("ours", "baseline"):
        assert len(result[side]["tokens"]) == 1 and 0 < result[side]["tokens"][0] < math.inf
    assert len(result["ratio"]) == 1 and result["ratio"][0] > 0


def test_sampler_section_measures_a_lora_actor(one_thread):
    """With lora_dim the model carries LoRA layers (step 3's actor): both sides still generate, and the row says so."""
    from bench.sampler import measure_sampler

    result = measure_sampler("tiny", "groups", 4, "fp32", repeats=1, warmup=0, batches=1, lora_dim=4)
    assert result["model"] == "tiny with LoRA (rank 4)"
    assert all(0 < result[side]["tokens"][0] < math.inf for side in ("ours", "baseline"))


def test_sampler_section_measures_a_zero3_actor_gathered_against_partitioned(one_thread, distributed):
    """With zero3 the model is partitioned by ZeRO-3: our sampler on it as it is (the baseline) and gathered whole
    (ours) both generate, and the row says which is which."""
    from bench.sampler import measure_sampler

    result = measure_sampler("tiny", "groups", 4, "fp32", repeats=1, warmup=0, batches=1, zero3=True)
    assert result["model"] == "tiny, ZeRO-3 gathered" and result["baseline_decoding"] == "ours, ZeRO-3 partitioned"
    assert all(0 < result[side]["tokens"][0] < math.inf for side in ("ours", "baseline"))


def test_grpo_section_times_rounds_with_and_without_the_samplers_logprobs(one_thread, distributed):
    """bench/rl_round.py on the tiny model: a GRPO round timed with the sampler's log-probs and with a forward
    pass's, both sides training on every row (no dynamic sampling). No speed threshold (the figure is the
    bench's)."""
    from bench.rl_round import DYNAMIC_SAMPLING, measure_grpo_round, recipe_flags_without_dynamic_sampling

    flags = recipe_flags_without_dynamic_sampling()
    assert not set(DYNAMIC_SAMPLING) & set(flags) and "--num_samples_per_prompt" in flags
    result = measure_grpo_round("tiny", repeats=1, warmup=0)
    assert (result["prompts"], result["group"], result["training_batch_size"], result["rounds"]) == (4, 8, 16, 2)
    assert len(result["ratio"]) == 1 and result["ratio"][0] > 0
    assert result["ours"]["rollouts"][0] > 0 and result["baseline"]["rollouts"][0] > 0
