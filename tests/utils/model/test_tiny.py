"""Tests of utils/model/tiny.py and utils/runtime/paths.py: the built-in tiny model is a normal Hugging Face folder, its
tokenizer round-trips the built-in task, and `build_once` builds once and atomically."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from utils.data import builtin_task as task
from utils.data.raw_datasets import builtin_data_dir
from utils.model.model_utils import count_parameters
from utils.model.tiny import CONFIG_FILE, SPECIAL_TOKENS
from utils.runtime.paths import build_once


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def builtin_texts():
    """The built-in task's held-out prompts and every text of its eval split (neither is in the corpus the
    tokenizer was trained on)."""
    data_dir = builtin_data_dir()
    texts = [record["prompt"] for record in task.heldout_prompts(data_dir)]
    with open(data_dir / "eval.json", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            texts += [record["prompt"], record["chosen"], record["rejected"], record["prompt"] + record["chosen"]]
    return sorted(set(texts))


def test_tiny_folder_loads_as_a_plain_hf_model(tiny_model_dir, tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = json.loads(CONFIG_FILE.read_text())
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        assert getattr(tiny_model.config, key) == expected[key]
    assert tiny_model.config.model_type == "llama"
    assert len(tokenizer) == tiny_model.get_input_embeddings().num_embeddings == expected["vocab_size"]
    assert (tiny_model.config.pad_token_id, tiny_model.config.bos_token_id, tiny_model.config.eos_token_id) == (
        tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    ids = tokenizer(" Human: What is 7 + 12? Assistant:", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = tiny_model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], expected["vocab_size"]) and torch.isfinite(logits).all()


def test_tiny_tokenizer_round_trips_the_builtin_task(tiny_model_dir, builtin_texts):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert len(builtin_texts) > 100
    encoded = tokenizer(builtin_texts, add_special_tokens=False)["input_ids"]
    assert not [ids for ids in encoded if tokenizer.unk_token_id in ids]
    decoded = tokenizer.batch_decode(encoded)
    assert [(text, back) for text, back in zip(builtin_texts, decoded) if text != back] == []


def test_tiny_tokenizer_splits_numbers_into_digits(tiny_model_dir, builtin_texts):
    """Each digit is a token of its own (as in Llama 3 and Qwen), so " 12" and " 19" share their "1" and a sum
    of numbers never seen together is still made of known digits."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokens = {token for text in builtin_texts for token in tokenizer.tokenize(text)}
    with_digits = {token for token in tokens if any(c.isdigit() for c in token)}
    assert with_digits == set("0123456789")
    assert tokenizer.tokenize(" 38") == ["\u0120", "3", "8"]


def test_tiny_tokenizer_leaves_most_random_strings_in_single_letters(tiny_model_dir):
    """The vocabulary is kept small so that merges learnt from the prompts' English words rarely cut the random
    strings to reverse or uppercase (docs/quickstart-results.md: 19% of the held-out strings hold a merge at 340 tokens, 47% at 512)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    records = [r for r in task.heldout_prompts(builtin_data_dir()) if r["skill"] in ("reverse", "upper")]
    assert len(records) >= 100

    def merged(record):
        word = record["prompt"].split('"')[1]
        tokens = tokenizer.tokenize(word) + tokenizer.tokenize(" " + record["answer"])
        return any(len(token.lstrip("\u0120")) > 1 for token in tokens)

    assert sum(map(merged, records)) / len(records) < 0.3


def test_tiny_special_tokens_are_distinct(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    special = {name: getattr(tokenizer, name) for name in SPECIAL_TOKENS}
    assert special == SPECIAL_TOKENS
    ids = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id]
    assert None not in ids and len(set(ids)) == 4


def test_tiny_parameter_count(tiny_model):
    c = json.loads(CONFIG_FILE.read_text())
    hidden, inner, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    head_dim = hidden // c["num_attention_heads"]
    attention = hidden * hidden * 2 + 2 * hidden * c["num_key_value_heads"] * head_dim  # q, o and k, v
    per_layer = attention + 3 * hidden * inner + 2 * hidden  # gate/up/down projections, two RMSNorms
    expected = c["vocab_size"] * hidden + layers * per_layer + hidden  # tied embeddings, final norm
    assert count_parameters(tiny_model) == expected
    assert 0.8e6 < expected < 1.5e6  # the README: a 1.1M-parameter Llama


# --------------------------------------------------------------------------- build_once


def test_build_once_builds_once(tmp_path):
    calls = []

    def build(out):
        calls.append(out)
        (out / "weights.txt").write_text("built")

    target = tmp_path / "cache" / "thing"
    assert build_once(target, build) == target
    assert build_once(target, build) == target
    assert len(calls) == 1 and calls[0] != target  # built under a temporary name, then renamed
    assert (target / "weights.txt").read_text() == "built"
    assert [p.name for p in target.parent.iterdir() if p.is_dir()] == ["thing"]


def test_build_once_failure_leaves_no_folder(tmp_path):
    def broken(out):
        (out / "half.txt").write_text("half")
        raise RuntimeError("builder crashed")

    target = tmp_path / "thing"
    with pytest.raises(RuntimeError, match="builder crashed"):
        build_once(target, broken)
    assert not target.exists()
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]
    build_once(target, lambda out: (out / "ok.txt").write_text("ok"))  # a later run builds it
    assert (target / "ok.txt").read_text() == "ok"
