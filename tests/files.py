"""Small file helpers the tests share."""
import contextlib
import json
import os
from pathlib import Path


def write_jsonl(path, rows):
    """`rows` (dicts) as JSON lines in `path` (its folder made if missing); returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def cache_hub_dataset(cache, repo_id, splits):
    """Put `splits` ({split: rows}) into the `datasets` cache folder `cache` as a download of the hub data set
    `repo_id` ("owner/name", lower case) leaves it, <cache>/<owner>___<name>/default/0.0.0/<hash>/<name>-<split>.arrow
    (written by datasets' own JSON builder), so that `datasets.load_dataset(repo_id)` reads it offline. Returns
    `cache`."""
    from datasets.packaged_modules.json.json import Json

    owner, name = repo_id.split("/")
    source = Path(cache).parent / f"{owner}-{name}-source"
    files = {split: str(write_jsonl(source / f"{split}.jsonl", rows)) for split, rows in splits.items()}
    Json(cache_dir=str(cache), dataset_name=name, config_id="default", hash="0123456789abcdef",
         data_files=files).download_and_prepare()
    os.rename(Path(cache) / name, Path(cache) / f"{owner}___{name}")
    return cache


@contextlib.contextmanager
def offline_hub(cache):
    """`datasets` in this process offline with its cache in `cache`, as HF_DATASETS_OFFLINE=1 and HF_DATASETS_CACHE
    set it in a fresh process (datasets reads them when imported); restored after."""
    import datasets

    saved = datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_CACHE = True, Path(cache)
    try:
        yield Path(cache)
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_CACHE = saved


def offline_env(cache):
    """The environment variables that put a fresh process's `datasets` offline with its cache in `cache`."""
    return {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache)}


def saved_pair_logps(folder, cache, tokenizer, count=32):
    """(chosen, rejected): the mean log-probs the model saved in `folder` gives the answers of the first `count`
    eval pairs of the built-in data (phase 2 of --data_split 1000,100,1000, 64 tokens, seed 1234; split indices
    cached in `cache`): what a preference stage reports as chosen_logps / rejected_logps on its first eval
    batches."""
    import torch
    from transformers import AutoModelForCausalLM

    from utils.data.data_utils import DataCollatorPreference, create_prompt_dataset
    from utils.rl.tokens import sequence_logprobs

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    _, evaluation = create_prompt_dataset(["builtin"], "1000,100,1000", str(cache), 2, 1234, tokenizer, 64)
    batch = DataCollatorPreference(tokenizer.pad_token_id)([evaluation[i] for i in range(count)])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logps = sequence_logprobs(logits, batch["input_ids"], batch["answer_mask"])
    return logps[:count].mean().item(), logps[count:].mean().item()
