"""Shared fixtures: the built-in tiny model and its tokenizer, small model configs, a one-process world."""
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The built-in tiny model folder (built into the chatrlhf cache on first use, ~10 s, then reused)."""
    from utils.model.model_utils import resolve_model_path

    return Path(resolve_model_path("tiny"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    """The tiny model's tokenizer as the steps load it. Shared: tests must not modify it."""
    from utils.model.model_utils import load_tokenizer

    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="session")
def small_config():
    """`small_config(kind, vocab_size)`: a 2-layer, hidden-32 Llama or OPT config (tiny, so engines are fast)."""
    from transformers import LlamaConfig, OPTConfig

    def make(kind="llama", vocab_size=64):
        if kind == "llama":
            return LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                               tie_word_embeddings=True)
        if kind == "opt":
            return OPTConfig(vocab_size=vocab_size, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                             num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32)
        raise ValueError(kind)

    return make


@pytest.fixture(scope="session")
def distributed():
    """A torch.distributed world of one, started as the steps start it. The RANK/MASTER_PORT variables it sets
    are removed again afterwards (LOCAL_RANK stays: DeepSpeed's engine reads it), so subprocesses that later
    tests launch do not inherit this process's rendezvous port."""
    from utils.runtime.dist import init_distributed

    before = dict(os.environ)
    result = init_distributed()
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if key not in before:
            os.environ.pop(key, None)
    return result


@pytest.fixture(scope="session")
def step3_model_dirs(tmp_path_factory, tiny_tokenizer):
    """`(actor_dir, critic_dir)`: a step-1 folder (a 2-layer, hidden-128 Llama with the tiny tokenizer) and a
    step-2 folder (a reward model on that backbone, saved as step 2 saves it), built directly, once per session.
    Their configs carry dropout 0.1, so step 3 must switch it off itself. Hidden 128 makes the attention and MLP
    weights large enough (> 1e4 elements) to be really partitioned under ZeRO-3. Shared: tests must not write."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from utils.model.reward_model import RewardModel
    from utils.model.save import save_hf_model

    root = tmp_path_factory.mktemp("step3_models")
    actor_dir, critic_dir = root / "step1", root / "step2"
    tokenizer = tiny_tokenizer
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         tie_word_embeddings=True, attention_dropout=0.1, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(actor_dir)
    tokenizer.save_pretrained(actor_dir)
    torch.manual_seed(1)
    reward_model = RewardModel.from_pretrained(str(actor_dir), tokenizer)  # the backbone and a new value head
    save_hf_model(reward_model, tokenizer, critic_dir, 0)
    return actor_dir, critic_dir


@pytest.fixture(scope="module")
def one_thread():
    """The tiny model gains nothing from threads, and on a busy machine they cost a lot: one, then restore."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) of the built-in tiny model as inference loads it, once per session."""
    from inference.generation import load_causal_lm
    from utils.runtime.dist import quiet_transformers

    quiet_transformers()
    return load_causal_lm("tiny")
