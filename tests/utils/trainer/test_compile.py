"""--compile (torch.compile of the training engine's model) changes nothing but float rounding: step 1 on the
built-in tiny model, run with and without it, prints the same per-step losses and saves the same weights.
TorchInductor compiles for minutes on a small CPU, so these are end-to-end tests."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
STEP1 = ROOT / "training" / "step1_supervised_finetuning" / "main.py"
# Batches of 8 padded to their longest row: the lengths vary, so the compiled model meets a new length (and is
# compiled again, with the length dynamic) as a real run does.
# fp32: compiled and eager kernels sum in other orders, which bf16 (auto on a CPU with native bf16) rounds to
# weight differences of a few percent of what 4 steps move them.
FLAGS = ["--max_steps", "4", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "32",
         "--max_seq_len", "64", "--print_interval", "1", "--learning_rate", "2e-3", "--dtype", "fp32"]


def run_step1(out, data, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result = subprocess.run([sys.executable, str(STEP1), "--output_dir", str(out), "--data_output_path", str(data),
                             *FLAGS, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = [float(loss) for loss in re.findall(r"step \d+/4: loss=([0-9.]+)", result.stdout)]
    assert len(losses) == 4, result.stdout[-3000:]
    return losses, out / "model.safetensors"


def assert_same_run(eager, compiled, initial_weights):
    """Equal losses, and equal weights up to float rounding as Adam amplifies it: an element whose gradient is
    ~0 moves by up to the learning rate either way on a rounding difference, so each tensor is compared by how far
    the two runs' weights are apart against how far training moved it."""
    from safetensors.torch import load_file

    (eager_losses, eager_weights), (compiled_losses, compiled_weights) = eager, compiled
    assert compiled_losses == pytest.approx(eager_losses, rel=2e-3)  # as printed: 4 significant digits
    eager_state, compiled_state = load_file(eager_weights), load_file(compiled_weights)
    initial = load_file(initial_weights)
    assert eager_state.keys() == compiled_state.keys()
    moved = 0
    for name, weight in eager_state.items():
        update = (weight - initial[name]).norm().item()
        moved += update > 0
        assert (compiled_state[name] - weight).norm().item() <= 1e-3 * update + 1e-6, name
    assert moved > 0  # training changed the weights: the comparison compares something


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [[], ["--lora_dim", "8", "--only_optimize_lora"], ["--zero_stage", "3"]],
                         ids=["full", "lora", "zero3"])
def test_compiled_step1_trains_as_the_eager_one(tmp_path, tiny_model_dir, extra):
    eager = run_step1(tmp_path / "eager", tmp_path / "data", *extra)
    compiled = run_step1(tmp_path / "compiled", tmp_path / "data", "--compile", *extra)
    assert_same_run(eager, compiled, tiny_model_dir / "model.safetensors")
