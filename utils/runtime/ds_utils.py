"""DeepSpeed set-up shared by the three steps: configs, precision, optimizers and their parameter groups."""
import json

import torch

from utils.runtime.dist import check_op_build_lock
from utils.runtime.errors import ConfigError, one_line
from utils.runtime.provenance import NATIVE_BF16_CPU_FLAGS, native_bf16_flags, read_cpuinfo

DTYPES = ("auto", "fp32", "bf16", "fp16")
LORA_PARAMETER_NAMES = ("lora_right_weight", "lora_left_weight")
GRADIENT_CLIPPING = 1.0  # max global gradient norm of every trained model (DeepSpeed-Chat's)


def choose_dtype(dtype, device="cpu", device_bf16=False, cpuinfo=None):
    """(dtype, why) for `--dtype` on `device` (device_bf16: whether that GPU runs bf16; cpuinfo: /proc/cpuinfo
    text, read when None). `auto` is bf16 where the hardware runs it natively: on CUDA bf16 if supported, else
    fp16; on a CPU bf16 with an amx_bf16 or avx512_bf16 flag, else fp32; fp32 on anything else. The one place that
    decides; an explicit dtype is kept, with a warning in `why` for bf16 on a CPU without native bf16."""
    if device == "cpu":
        flags = native_bf16_flags(read_cpuinfo() if cpuinfo is None else cpuinfo)
        native = f"this CPU has native bf16 ({', '.join(flags)})" if flags else (
            "this CPU has no native bf16: no " + "/".join(NATIVE_BF16_CPU_FLAGS) + " flag")
        if dtype == "auto":
            return ("bf16" if flags else "fp32"), f"auto: {native}"
        if dtype == "bf16" and not flags:
            return dtype, f"as asked; {native}, so bf16 runs many times slower than fp32 here"
        return dtype, "as asked"
    if dtype == "auto":
        if device == "cuda":
            return ("bf16", "auto: this GPU supports bf16") if device_bf16 else ("fp16", "auto: this GPU has no bf16")
        return "fp32", f"auto: fp32 on {device}"
    return dtype, "as asked"


def training_dtype(dtype):
    """(dtype, why): `choose_dtype` on this process's accelerator, refusing a dtype it cannot train in."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    device = accelerator.device_name()
    if dtype == "fp16" and (device == "cpu" or not accelerator.is_fp16_supported()):
        # fp16 training rests on dynamic loss scaling, a GPU path; CPUs train in bf16 or fp32.
        raise ConfigError(f"--dtype fp16 is not supported on this accelerator ({device}); use --dtype bf16 or fp32")
    if dtype == "bf16" and not accelerator.is_bf16_supported():
        raise ConfigError(f"--dtype bf16 is not supported on this accelerator ({device}); use --dtype fp16 or fp32")
    return choose_dtype(dtype, device, bool(accelerator.is_bf16_supported()))


def resolve_dtype(dtype):
    """`--dtype` as fp32/bf16/fp16 for this accelerator (`training_dtype` without the reason)."""
    return training_dtype(dtype)[0]


TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(dtype):
    """The torch dtype of a resolved `--dtype` (fp32, bf16 or fp16)."""
    return TORCH_DTYPES[dtype]


def get_train_ds_config(*, micro_batch_size, gradient_accumulation_steps, world_size, dtype, stage, offload=False,
                        enable_hybrid_engine=False, inference_tp_size=1, release_inference_cache=False,
                        pin_parameters=True, tp_gather_partition_size=8, max_out_tokens=512):
    """The DeepSpeed config of a trained model (DeepSpeed-Chat's `get_train_ds_config`, with batch sizes set)."""
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"--zero_stage must be 0, 1, 2 or 3, not {stage}")
    if offload and stage == 0:
        raise ConfigError("--offload needs ZeRO stage 1, 2 or 3 (it moves optimizer state to the CPU); "
                          "set --zero_stage")
    if inference_tp_size > 1 and stage != 3:
        raise ConfigError("--inference_tp_size > 1 needs ZeRO stage 3 for the actor (--actor_zero_stage 3)")
    offload_device = "cpu" if offload else "none"
    zero = {
        "stage": stage,
        "overlap_comm": True,
        "offload_optimizer": {"device": offload_device},
        "stage3_param_persistence_threshold": 1e4,
        "stage3_max_live_parameters": 3e7,
        "stage3_prefetch_bucket_size": 3e7,
        "memory_efficient_linear": False,
    }
    if stage == 3:
        zero["offload_param"] = {"device": offload_device}
    config = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "train_batch_size": micro_batch_size * gradient_accumulation_steps * world_size,
        "steps_per_print": 10 ** 9,
        "zero_optimization": zero,
        "gradient_clipping": GRADIENT_CLIPPING,
        "prescale_gradients": False,
        "wall_clock_breakdown": False,
        "hybrid_engine": {
            "enabled": enable_hybrid_engine,
            "max_out_tokens": max_out_tokens,
            "inference_tp_size": inference_tp_size,
            "release_inference_cache": release_inference_cache,
            "pin_parameters": pin_parameters,
            "tp_gather_partition_size": tp_gather_partition_size,
        },
    }
    config.update(_precision_config(dtype))
    return config


def get_eval_ds_config(*, micro_batch_size, world_size, dtype, stage=0, offload=False):
    """The DeepSpeed config of a frozen model (reference, reward): ZeRO for memory, no optimizer."""
    offload_device = "cpu" if offload else "none"
    zero = {"stage": stage, "stage3_param_persistence_threshold": 1e4, "memory_efficient_linear": False}
    if stage == 3:
        zero["offload_param"] = {"device": offload_device}
    config = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro_batch_size * world_size,
        "steps_per_print": 10 ** 9,
        "zero_optimization": zero,
        "prescale_gradients": False,
        "wall_clock_breakdown": False,
    }
    config.update(_precision_config(dtype))
    return config


def _precision_config(dtype):
    if dtype == "fp16":
        return {"fp16": {"enabled": True, "loss_scale_window": 100}}
    if dtype == "bf16":
        return {"bf16": {"enabled": True}}
    return {}


def get_optimizer_grouped_parameters(model, weight_decay, lora_learning_rate=None):
    """Three parameter groups, as DeepSpeed-Chat: weights with decay; biases and norm weights (any parameter of
    fewer than two dimensions) without; LoRA factors with decay at their own learning rate. Frozen parameters and
    empty groups are left out."""
    decay, no_decay, lora = [], [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if any(lora_name in name for lora_name in LORA_PARAMETER_NAMES):
            lora.append(param)
        elif param.ndim < 2:
            no_decay.append(param)
        else:
            decay.append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    lora_group = {"params": lora, "weight_decay": weight_decay}
    if lora_learning_rate is not None:
        lora_group["lr"] = lora_learning_rate
    groups.append(lora_group)
    return [group for group in groups if group["params"]]


def create_optimizer(param_groups, learning_rate, offload, betas=(0.9, 0.95)):
    """DeepSpeedCPUAdam when the optimizer state is offloaded, FusedAdam on CUDA, torch's AdamW otherwise (so a
    CPU run compiles nothing), in its fused form, 5x faster than the per-tensor loop on a CPU."""
    if offload:
        from deepspeed.ops.adam import DeepSpeedCPUAdam


        check_op_build_lock("cpu_adam")

        return DeepSpeedCPUAdam(param_groups, lr=learning_rate, betas=betas)
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cuda":
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam(param_groups, lr=learning_rate, betas=betas)
    return torch.optim.AdamW(param_groups, lr=learning_rate, betas=betas, fused=True)


def merge_user_ds_config(config, deepspeed_config_path, batch_flag="--per_device_train_batch_size"):
    """Overlay the user's `--deepspeed_config` JSON file, key by key, on the config the flags built (`batch_flag`:
    the step's micro-batch flag, named when the file's batch sizes disagree). The file is checked before any
    engine is built, each error one line naming the file and the key: no optimizer or scheduler section (they would
    be ignored), batch sizes equal to the flags', each value of a key the flags also set of the same JSON type,
    the precision --dtype chose, and the whole read by DeepSpeed's own config classes."""
    if not deepspeed_config_path:
        return config

    def not_a_number(constant):
        raise ValueError(f"{constant} is not a number (a value it cannot mean)")

    try:
        with open(deepspeed_config_path, encoding="utf-8-sig") as f:  # a BOM, as Windows editors write
            user = json.load(f, parse_constant=not_a_number)
    except (OSError, ValueError) as err:
        raise ConfigError(f"--deepspeed_config {deepspeed_config_path}: {err}") from None
    if not isinstance(user, dict):
        raise ConfigError(f"--deepspeed_config {deepspeed_config_path}: expected a JSON object, got "
                          f"{type(user).__name__}")
    for section in ("optimizer", "scheduler"):
        if section in user:  # deepspeed.initialize ignores them when given an optimizer and a schedule
            raise ConfigError(f"--deepspeed_config {deepspeed_config_path}: its '{section}' section would have no "
                              "effect (the optimizer and LR schedule are built from --learning_rate, --weight_decay, "
                              "--lr_scheduler_type and --num_warmup_steps); remove it")
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if key in user and user[key] != config[key]:
            raise ConfigError(f"--deepspeed_config {deepspeed_config_path}: {key} {user[key]} disagrees with the "
                              f"{config[key]} of the flags ({batch_flag} x "
                              "--gradient_accumulation_steps x processes); set batch sizes with the flags")
    _check_json_types(config, user, deepspeed_config_path)
    merged = _deep_merge(config, user)
    asked, chosen = _half_precisions(merged), _half_precisions(config)
    if asked != chosen:  # the models, their copies and the reports all follow --dtype
        enabled = (" and ".join(f"{precision}.enabled" for precision in asked)
                   + (" are both true" if len(asked) > 1 else " is true") if asked else f"{chosen[0]}.enabled is false")
        raise ConfigError(f"--deepspeed_config {deepspeed_config_path}: {enabled}, but --dtype chose "
                          f"{chosen[0] if chosen else 'fp32'}; DeepSpeed trains in one precision: choose it with "
                          "--dtype")
    _check_with_deepspeed(config, user, deepspeed_config_path)
    return merged


PRECISION_SECTIONS = {"fp16": "fp16", "bf16": "bf16", "bfloat16": "bf16"}
"""The sections of a DeepSpeed config that enable a half precision, and the precision (bfloat16: bf16's old
name)."""


def _half_precisions(config):
    """The half precisions `config` enables (its sections with `"enabled": true`), sorted."""
    return sorted({precision for section, precision in PRECISION_SECTIONS.items()
                   if isinstance(config.get(section), dict) and config[section].get("enabled") is True})


def json_type(value):
    """The JSON type of a value read from JSON, as the error names it (a bool is tested before a number: Python's
    True is an int)."""
    for types, name in ((bool, "a boolean"), ((int, float), "a number"), (str, "a string"), (dict, "an object"),
                        (list, "an array")):
        if isinstance(value, types):
            return name
    return "null"


def _check_json_types(flags_config, user, path, prefix=""):
    """Refuse a key of the user's file whose value is not of the JSON type the flags' config gives the same key
    (`gradient_clipping: "high"` against 1.0), section by section: DeepSpeed reads such a value without a
    complaint and fails on it mid-run (a TypeError after the first step)."""
    for key, value in user.items():
        if key not in flags_config:
            continue
        expected = json_type(flags_config[key])
        if json_type(value) != expected:
            raise ConfigError(f"--deepspeed_config {path}: {prefix}{key} must be {expected}, as the flags' config "
                              f"has it ({json.dumps(flags_config[key])}), not {json.dumps(value)}")
        if isinstance(value, dict):
            _check_json_types(flags_config[key], value, path, f"{prefix}{key}.")


def _check_with_deepspeed(flags_config, user, path):
    """Read the flags' config with each key of the user's file laid over it, one key at a time, through DeepSpeed's
    own config classes (DeepSpeedConfig: its pydantic models and checks, milliseconds, no process group), then
    with all of them; the first failure is a ConfigError naming the file and the key, not a traceback at
    deepspeed.initialize or after the first step. Where DeepSpeed cannot read the flags' config alone (a
    DeepSpeed that asks for more than its config, say), it judges nothing of the user's."""
    if _deepspeed_config_error(flags_config):
        return
    for key in user:
        error = _deepspeed_config_error(_deep_merge(flags_config, {key: user[key]}))
        if error:
            raise ConfigError(f"--deepspeed_config {path}: {key}{error}")
    error = _deepspeed_config_error(_deep_merge(flags_config, user))
    if error:
        raise ConfigError(f"--deepspeed_config {path}: its keys together ({', '.join(user)}){error}")


def _deepspeed_config_error(config):
    """What DeepSpeedConfig says is wrong with `config`, as `.field.path: message` (pydantic's) or `: message`
    (DeepSpeed's own asserts and ValueErrors); None if it reads it. The total batch is left for it to work out
    from the world it sees (it may see one process where the run has several)."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from pydantic import ValidationError

    config = {key: value for key, value in config.items() if key != "train_batch_size"}
    try:
        DeepSpeedConfig(json.loads(json.dumps(config)))  # a copy: DeepSpeed may fill in what it reads
    except ValidationError as err:
        first = err.errors()[0]
        return f"{''.join(f'.{part}' for part in first['loc'])}: {first['msg']}, got {first.get('input')!r}"
    # DeepSpeed's asserts, ValueErrors, TypeErrors...: each about the user's values, as the flags' config alone reads
    except Exception as err:  # noqa: BLE001
        return f": {one_line(err) or type(err).__name__}"
    return None


def _deep_merge(base, overlay):
    merged = dict(base)
    for key, value in overlay.items():
        merged[key] = _deep_merge(merged[key], value) if isinstance(value, dict) and isinstance(
            merged.get(key), dict) else value
    return merged
