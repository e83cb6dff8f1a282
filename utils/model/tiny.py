"""The built-in tiny model: a small Llama from `configs/tiny_llama.json` and a byte-level BPE tokenizer trained
on the built-in task's corpus, written once as a normal Hugging Face folder that every step loads like any other
model."""
import hashlib
import json
from pathlib import Path

import torch

from utils.data import builtin_task as task
from utils.data.raw_datasets import builtin_data_dir
from utils.runtime.paths import build_once, cache_dir

CONFIG_FILE = Path(__file__).parent / "configs" / "tiny_llama.json"
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
INIT_SEED = 0
TOKENIZER_VERSION = "bpe-digits-1"
"""Part of the tiny model folder's digest: bump it when train_tokenizer changes what it builds."""


def tiny_model_path():
    """The tiny model's folder, built on first use. Its name carries a digest of the config and of the corpus
    version, so a change to either builds a new folder instead of reusing a stale one."""
    data_dir = builtin_data_dir()
    config_text = CONFIG_FILE.read_text()
    digest = hashlib.sha256((config_text + str(task.TASK_VERSION) + TOKENIZER_VERSION).encode()).hexdigest()[:10]
    return build_once(cache_dir() / "models" / f"tiny-{digest}",
                      lambda out: build_tiny_model(out, json.loads(config_text), task.corpus_texts(data_dir)))


def build_tiny_model(out_dir, config_dict, texts):
    """Train the tokenizer on `texts`, build the randomly initialised model, and save both into `out_dir`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = train_tokenizer(texts, vocab_size=config_dict["vocab_size"])
    config = LlamaConfig(**config_dict, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(INIT_SEED)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def train_tokenizer(texts, vocab_size):
    """A byte-level BPE tokenizer (every string encodes, nothing is `<unk>`) with distinct pad, bos, eos and
    unk tokens, wrapped for transformers. Numbers are split into single digits before BPE, so no merge ever
    joins two digits: " 19" is " ", "1", "9", and an unseen sum is spelt with the same tokens as a seen one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=512, **SPECIAL_TOKENS)
