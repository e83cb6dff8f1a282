"""Tests of utils/runtime/ds_utils.py: optimizer parameter groups, dtype resolution, the DeepSpeed configs and the
user's config overlay; and of DeepSpeed's one-time op builds at start-up (none for one process, a stale build
lock reported instead of waited on)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from deepspeed.accelerator import get_accelerator
from processes import REPO, subprocess_env
from transformers import AutoModelForCausalLM

from utils.model.lora import convert_linear_layer_to_lora
from utils.runtime.ds_utils import (choose_dtype, create_optimizer, get_eval_ds_config,
                                    get_optimizer_grouped_parameters, get_train_ds_config, merge_user_ds_config,
                                    resolve_dtype, training_dtype)
from utils.runtime.errors import ConfigError
from utils.runtime.provenance import native_bf16_flags, read_cpuinfo


def opt_with_lora(small_config):
    """OPT has biases and LayerNorm weights; LoRA on the q/v projections; the embeddings frozen."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(small_config("opt"))
    convert_linear_layer_to_lora(model, "q_proj,v_proj", lora_dim=4)
    model.get_input_embeddings().weight.requires_grad = False
    return model


def group_of(groups):
    """{id(param): [indices of the groups holding it]}"""
    where = {}
    for index, group in enumerate(groups):
        for param in group["params"]:
            where.setdefault(id(param), []).append(index)
    return where


@pytest.mark.parametrize("kind", ["opt", "llama"])
def test_grouped_parameters(small_config, kind):
    if kind == "opt":
        model = opt_with_lora(small_config)
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(small_config("llama"))
        convert_linear_layer_to_lora(model, "layers.", lora_dim=4)
    groups = get_optimizer_grouped_parameters(model, weight_decay=0.1, lora_learning_rate=5e-4)
    assert len(groups) == 3
    decay, no_decay, lora = groups
    assert (decay["weight_decay"], no_decay["weight_decay"], lora["weight_decay"]) == (0.1, 0.0, 0.1)
    assert lora["lr"] == 5e-4 and "lr" not in decay and "lr" not in no_decay

    where = group_of(groups)
    assert all(len(indices) == 1 for indices in where.values())  # no parameter in two groups
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert set(where) == trainable  # the union is exactly the trainable parameters (frozen ones left out)
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    assert frozen  # LoRA base weights (and OPT's embeddings) are frozen, so the check above means something
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if "lora_" in name:
            expected = 2
        elif name.endswith(".bias") or "norm" in name:
            expected = 1
        else:
            expected = 0
        assert where[id(param)] == [expected], name
    names = [name for name, _ in model.named_parameters()]
    assert any(n.endswith(".bias") for n in names) == (kind == "opt")  # OPT exercises biases, both norms


def test_groups_without_lora_and_lora_lr(small_config):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(small_config("llama"))
    groups = get_optimizer_grouped_parameters(model, weight_decay=0.0)
    assert len(groups) == 2  # no empty LoRA group
    model = opt_with_lora(small_config)
    groups = get_optimizer_grouped_parameters(model, weight_decay=0.0)
    assert len(groups) == 3 and "lr" not in groups[2]  # the LoRA factors follow the main learning rate
    optimizer = create_optimizer(get_optimizer_grouped_parameters(model, 0.0, 7e-3), 1e-3, offload=False)
    assert [group["lr"] for group in optimizer.param_groups] == [1e-3, 1e-3, 7e-3]
    assert isinstance(optimizer, torch.optim.AdamW)  # CPU: torch's AdamW, nothing to compile


# --------------------------------------------------------------------------- dtype


# /proc/cpuinfo of an AVX2-only AMD EPYC (trimmed) and of a Sapphire Rapids Xeon with AMX.
AVX2_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni
bugs\t\t: sysret_ss_attrs
"""
AMX_CPUINFO = AVX2_CPUINFO.replace("AuthenticAMD", "GenuineIntel").replace(
    "sha_ni", "avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8")


def test_auto_dtype_is_bf16_only_on_a_cpu_with_native_bf16():
    assert native_bf16_flags(AVX2_CPUINFO) == []
    assert native_bf16_flags(AMX_CPUINFO) == ["amx_bf16", "avx512_bf16"]
    assert native_bf16_flags(AVX2_CPUINFO.replace("sha_ni", "avx512_bf16")) == ["avx512_bf16"]  # e.g. AMD Zen 4
    assert native_bf16_flags("") == []  # no /proc/cpuinfo: not Linux
    dtype, why = choose_dtype("auto", "cpu", cpuinfo=AVX2_CPUINFO)
    assert (dtype, why) == ("fp32", "auto: this CPU has no native bf16: no amx_bf16/avx512_bf16 flag")
    dtype, why = choose_dtype("auto", "cpu", cpuinfo=AMX_CPUINFO)
    assert dtype == "bf16" and "amx_bf16, avx512_bf16" in why
    assert choose_dtype("auto", "cpu", cpuinfo="")[0] == "fp32"


def test_an_explicit_dtype_is_kept_and_slow_bf16_is_named():
    assert choose_dtype("fp32", "cpu", cpuinfo=AMX_CPUINFO) == ("fp32", "as asked")
    assert choose_dtype("bf16", "cpu", cpuinfo=AMX_CPUINFO) == ("bf16", "as asked")
    dtype, why = choose_dtype("bf16", "cpu", cpuinfo=AVX2_CPUINFO)
    assert dtype == "bf16" and "no native bf16" in why and "slower than fp32" in why


def test_auto_dtype_on_a_gpu():
    assert choose_dtype("auto", "cuda", device_bf16=True)[0] == "bf16"
    assert choose_dtype("auto", "cuda", device_bf16=False)[0] == "fp16"
    assert choose_dtype("fp16", "cuda", device_bf16=True) == ("fp16", "as asked")


def test_resolve_dtype_on_this_accelerator():
    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        pytest.skip("checks the CPU rules")
    native = bool(native_bf16_flags(read_cpuinfo()))
    assert resolve_dtype("auto") == ("bf16" if native else "fp32")
    assert training_dtype("auto")[1].startswith("auto: this CPU has ")
    assert resolve_dtype("fp32") == "fp32"
    assert resolve_dtype("bf16") == "bf16"
    # fp16 training needs loss scaling, a GPU path: refused on a CPU even where oneDNN has fp16 kernels.
    with pytest.raises(ConfigError, match="--dtype fp16"):
        resolve_dtype("fp16")


def test_resolve_dtype_refuses_what_the_accelerator_lacks(monkeypatch):
    accelerator = get_accelerator()
    monkeypatch.setattr(accelerator, "is_fp16_supported", lambda: False)
    monkeypatch.setattr(accelerator, "is_bf16_supported", lambda: False)
    with pytest.raises(ConfigError, match="--dtype fp16"):
        resolve_dtype("fp16")
    with pytest.raises(ConfigError, match="--dtype bf16"):
        resolve_dtype("bf16")
    assert resolve_dtype("fp32") == "fp32"


# --------------------------------------------------------------------------- configs


@pytest.mark.parametrize("micro, accumulation, world", [(1, 1, 1), (4, 2, 1), (3, 5, 2), (2, 1, 8)])
def test_train_config_batch_arithmetic(micro, accumulation, world):
    config = get_train_ds_config(micro_batch_size=micro, gradient_accumulation_steps=accumulation,
                                 world_size=world, dtype="fp32", stage=2)
    assert config["train_micro_batch_size_per_gpu"] == micro
    assert config["gradient_accumulation_steps"] == accumulation
    assert config["train_batch_size"] == micro * accumulation * world
    eval_config = get_eval_ds_config(micro_batch_size=micro, world_size=world, dtype="fp32")
    assert eval_config["train_batch_size"] == micro * world


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_train_config_precision(dtype):
    config = get_train_ds_config(micro_batch_size=1, gradient_accumulation_steps=1, world_size=1, dtype=dtype,
                                 stage=0)
    assert config.get("fp16", {}).get("enabled", False) == (dtype == "fp16")
    assert config.get("bf16", {}).get("enabled", False) == (dtype == "bf16")


def test_train_config_offload_and_stage3():
    config = get_train_ds_config(micro_batch_size=1, gradient_accumulation_steps=1, world_size=1, dtype="fp32",
                                 stage=3, offload=True, inference_tp_size=2)
    zero = config["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "cpu"
    assert config["hybrid_engine"]["inference_tp_size"] == 2
    stage2 = get_train_ds_config(micro_batch_size=1, gradient_accumulation_steps=1, world_size=1, dtype="fp32",
                                 stage=2)["zero_optimization"]
    assert stage2["offload_optimizer"]["device"] == "none" and "offload_param" not in stage2


@pytest.mark.parametrize("kwargs, flag", [(dict(stage=0, offload=True), "--offload"),
                                          (dict(stage=2, inference_tp_size=2), "--inference_tp_size"),
                                          (dict(stage=0, inference_tp_size=4), "--inference_tp_size"),
                                          (dict(stage=4), "--zero_stage")])
def test_train_config_refuses_impossible_combinations(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        get_train_ds_config(micro_batch_size=1, gradient_accumulation_steps=1, world_size=1, dtype="fp32",
                            **kwargs)


# --------------------------------------------------------------------------- user config overlay


def base_config():
    return get_train_ds_config(micro_batch_size=2, gradient_accumulation_steps=1, world_size=1, dtype="fp32",
                               stage=2)


def test_merge_user_config_overlays_nested_keys(tmp_path):
    user = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 12345},
            "gradient_clipping": 0.5, "flops_profiler": {"enabled": True}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(user))
    config = base_config()
    original = json.loads(json.dumps(config))
    merged = merge_user_ds_config(config, str(path))
    assert merged["zero_optimization"]["stage"] == 3
    assert merged["zero_optimization"]["reduce_bucket_size"] == 12345
    assert merged["zero_optimization"]["overlap_comm"] == original["zero_optimization"]["overlap_comm"]
    assert merged["zero_optimization"]["offload_optimizer"] == original["zero_optimization"]["offload_optimizer"]
    assert merged["gradient_clipping"] == 0.5
    assert merged["flops_profiler"] == {"enabled": True}
    assert merged["train_batch_size"] == original["train_batch_size"]
    assert config == original  # the flags' config is not modified in place
    assert merge_user_ds_config(config, None) == original
    assert merge_user_ds_config(config, "") == original


def test_a_user_config_with_a_byte_order_mark_reads(tmp_path):
    path = tmp_path / "ds.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"gradient_clipping": 0.5}).encode())
    assert merge_user_ds_config(base_config(), str(path))["gradient_clipping"] == 0.5


@pytest.mark.parametrize("content", [None, "{not json", "", "[1, 2]", "3"])
def test_merge_user_config_bad_file(tmp_path, content):
    path = tmp_path / "ds.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match="--deepspeed_config"):
        merge_user_ds_config(base_config(), str(path))


USER_CONFIG_ERRORS = [
    # (the file's content, the flags' dtype, what the one error line says after "--deepspeed_config <file>: ")
    ({"gradient_clipping": "high"}, "fp32", 'gradient_clipping must be a number, as the flags\' config has it (1.0), '
                                            'not "high"'),
    ({"zero_optimization": {"overlap_comm": "yes"}}, "fp32", "zero_optimization.overlap_comm must be a boolean"),
    ({"zero_optimization": {"offload_optimizer": None}}, "fp32", "zero_optimization.offload_optimizer must be an "
                                                                 "object"),
    ({"bf16": {"enabled": 7}}, "bf16", "bf16.enabled must be a boolean, as the flags' config has it (true), not 7"),
    ({"bf16": {"enabled": 7}}, "fp32", "bf16.enabled: Input should be a valid boolean"),  # DeepSpeed's pydantic
    ({"fp16": {"enabled": True}}, "bf16", "bf16.enabled and fp16.enabled are both true, but --dtype chose bf16"),
    ({"bfloat16": {"enabled": True}}, "fp32", "bf16.enabled is true, but --dtype chose fp32"),
    ({"bf16": {"enabled": False}}, "bf16", "bf16.enabled is false, but --dtype chose bf16"),
    ({"communication_data_type": "int3"}, "fp32", "communication_data_type: Invalid communication_data_type"),
    ({"zero_optimization": {"stage": 7}}, "fp32", "zero_optimization.stage: Input should be 0, 1, 2, 3"),
    ({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}}, "fp32",
     "zero_optimization.offload_optimizer.device: Input should be 'none', 'cpu' or 'nvme', got 'gpu'"),
    ({"fp16": {"loss_scale": "x"}}, "fp32", "fp16.loss_scale: Value error, fp16.loss_scale must be a number"),
    # a section the flags do not set, named by the key without which DeepSpeed reads the file (its TypeError)
    ({"gradient_clipping": 0.5, "flops_profiler": {"enabled": "maybe"}}, "fp32", "flops_profiler: "),
]


@pytest.mark.parametrize("user, dtype, message", USER_CONFIG_ERRORS, ids=[json.dumps(row[0]) + " " + row[1]
                                                                          for row in USER_CONFIG_ERRORS])
def test_a_user_config_deepspeed_would_fail_on_is_one_error_naming_the_file_and_key(tmp_path, user, dtype, message):
    """Each of these was a DeepSpeed traceback: at deepspeed.initialize (pydantic, an assert, a ValueError) or,
    for a value DeepSpeed reads without a complaint, after the first training step (gradient_clipping's
    TypeError)."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(user))
    config = get_train_ds_config(micro_batch_size=2, gradient_accumulation_steps=1, world_size=1, dtype=dtype,
                                 stage=2)
    with pytest.raises(ConfigError) as raised:
        merge_user_ds_config(config, str(path))
    assert str(raised.value).startswith(f"--deepspeed_config {path}: {message}"), raised.value


def test_a_user_config_in_deepspeed_s_own_terms_reads(tmp_path):
    """What DeepSpeed-Chat's and DeepSpeed's examples set passes every check: integers where the flags have
    floats, sections and keys the flags do not set, the precision --dtype chose tuned."""
    user = {"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 30000000, "offload_param": {
        "device": "cpu", "pin_memory": True}}, "bf16": {"enabled": True}, "gradient_clipping": 1,
        "communication_data_type": "fp32", "activation_checkpointing": {"partition_activations": False},
        "flops_profiler": {"enabled": False}, "wall_clock_breakdown": True}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(user))
    config = get_train_ds_config(micro_batch_size=2, gradient_accumulation_steps=1, world_size=4, dtype="bf16",
                                 stage=2)
    merged = merge_user_ds_config(config, str(path))
    assert merged["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert merged["train_batch_size"] == 8  # the flags' four processes, not the one DeepSpeed sees here
    assert merged["gradient_clipping"] == 1 and merged["wall_clock_breakdown"] is True


# --------------------------------------------------------------------------- DeepSpeed's one-time op builds


def run_python(code, env, timeout=120):
    return subprocess.run([sys.executable, "-c", code], env={**subprocess_env(), **env}, capture_output=True,
                          text=True, timeout=timeout)


def test_a_world_of_one_builds_no_deepspeed_op(tmp_path):
    """DeepSpeed would compile its shared-memory all-reduce op (a minute, once per machine) for one process."""
    result = run_python("from utils.runtime.dist import init_distributed; print(init_distributed()[:2])",
                        {"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert result.returncode == 0 and "(0, 1)" in result.stdout, result.stderr[-2000:]
    assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.o"))


def test_a_stale_op_build_lock_is_one_error_naming_it_within_seconds(tmp_path):
    """torch waits forever on the lock a killed build left; a step of a two-process run now says so at once."""
    import time

    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    lock_path = "from torch.utils.cpp_extension import _get_build_directory as d; " \
                "print(d('deepspeed_shm_comm', verbose=False) + '/lock')"
    lock = Path(run_python(lock_path, env).stdout.strip())
    lock.write_text("")  # left by a build killed half-way: nobody holds it open
    start = time.time()
    result = subprocess.run([sys.executable, str(REPO / "training/step1_supervised_finetuning/main.py"),
                             "--output_dir", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True,
                            timeout=120, env={**subprocess_env(), **env, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                                              "MASTER_ADDR": "127.0.0.1"})
    assert time.time() - start < 60
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"{lock} is left by a build of DeepSpeed's deepspeed_shm_comm op" in errors[0]
    assert "remove that file" in errors[0]

    # A build in progress (the lock held open by its process) is waited for, as before.
    holder = subprocess.Popen([sys.executable, "-c", f"import time; f = open({str(lock)!r}); time.sleep(600)"])
    try:
        time.sleep(1)
        check = run_python("from utils.runtime.dist import check_op_build_lock; "
                           "check_op_build_lock('deepspeed_shm_comm'); print('waits')", env)
        assert check.returncode == 0 and "waits" in check.stdout, check.stderr[-2000:]
    finally:
        holder.kill()
        holder.wait()


SHARED_MEMORY_RANK = """
import os, sys
from pathlib import Path
import torch
import deepspeed.comm as dist
from utils.runtime.dist import init_distributed

rank, world_size, _, _ = init_distributed()
torch.distributed.barrier()  # both ranks past start-up
name = "deepspeed_allreduce_buffer_{}_127.0.0.1_{}_".format(os.getuid(), os.environ["MASTER_PORT"])
left = sorted(path.name for path in Path("/dev/shm").glob(name + "*"))
total = torch.full((4096,), float(rank + 1))
dist.inference_all_reduce(total)  # DeepSpeed's shared-memory all-reduce, through the buffers whose names are gone
print("RESULT", rank, world_size, total.unique().tolist(), left, flush=True)
"""


def test_two_processes_leave_no_shared_memory_buffer_behind():
    """DeepSpeed's CPU all-reduce buffers (69 MB a rank in /dev/shm) lose their names once both ranks have mapped
    them (`unlink_shared_memory_buffer`): no name is left while both ranks still run (so a SIGKILL leaks nothing)
    or after, and DeepSpeed's all-reduce for inference still adds up."""
    env = {**subprocess_env(), "WORLD_SIZE": "2", "LOCAL_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    ranks = [subprocess.Popen([sys.executable, "-c", SHARED_MEMORY_RANK], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}) for rank in (0, 1)]
    try:
        outputs = [rank.communicate(timeout=300) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    for rank, (stdout, stderr) in enumerate(outputs):
        assert ranks[rank].returncode == 0, stderr[-2000:]
        result = next(line for line in stdout.splitlines() if line.startswith("RESULT")).split(maxsplit=4)
        assert result[1:4] == [str(rank), "2", "[3.0]"]  # 1 + 2 everywhere
        assert result[4] == "[]"  # while both ranks still run: no name left for a kill to leak
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_127.0.0.1_{env['MASTER_PORT']}_*"))
