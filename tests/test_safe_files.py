"""Safe files: no pickle is ever loaded, a model folder's own code never runs unless asked, and what the steps
save is safetensors.

- a scan of the source (utils/, training/, inference/, train.py, chat.py): every `torch.load` passes
  `weights_only=True`, nothing imports a pickle module, `np.load` never allows pickles;
- every CLI's `--trust_remote_code` is off by default and on only when given, the source never hard-codes
  `trust_remote_code=True`, and chat.py and rw_eval.py pass the flag through to every transformers loader;
- the folders steps 1, 2 and 3 save (a real one-step run of each main, in this process) hold safetensors and no
  `.bin` / `.pt` / `.pkl` pickle.
"""
import ast
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FILES = sorted([*ROOT.glob("utils/**/*.py"), *ROOT.glob("training/**/*.py"), *ROOT.glob("inference/**/*.py"),
                       ROOT / "train.py", ROOT / "chat.py"])
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve"}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def keyword(call, name):
    """The constant value of keyword argument `name` of a call; `absent` when not passed, `dynamic` when it is
    not a constant."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value.value if isinstance(kw.value, ast.Constant) else "dynamic"
    return "absent"


def dotted(node):
    """`torch.load` for the expression torch.load, `np.load` for np.load... ('' for anything else)."""
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return node.id if isinstance(node, ast.Name) else ""


def unsafe_loads(path):
    """(line, what) of each unsafe load in one source file."""
    problems = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            problems += [(node.lineno, f"import {a.name}") for a in node.names
                         if a.name.split(".")[0] in PICKLE_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in PICKLE_MODULES:
                problems.append((node.lineno, f"from {node.module} import ..."))
            if node.module == "torch" and any(a.name == "load" for a in node.names):
                problems.append((node.lineno, "from torch import load"))
        elif isinstance(node, ast.Call):
            name = dotted(node.func)
            if name == "torch.load" and keyword(node, "weights_only") is not True:
                problems.append((node.lineno, "torch.load without weights_only=True"))
            if name in ("np.load", "numpy.load") and keyword(node, "allow_pickle") not in (False, "absent"):
                problems.append((node.lineno, "np.load that may allow pickles"))
            if name.endswith("read_pickle"):
                problems.append((node.lineno, name))
    return problems


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scan itself, on a file with every fault it must catch and the safe forms it must pass."""
    sample = tmp_path / "sample.py"
    sample.write_text("import pickle\nimport torch, numpy as np\nfrom torch import load\n"
                      "torch.load('a')\ntorch.load('a', weights_only=False)\ntorch.load('a', weights_only=True)\n"
                      "np.load('a', allow_pickle=True)\nnp.load('a', allow_pickle=False)\nnp.load('a')\n")
    assert [line for line, _ in unsafe_loads(sample)] == [1, 3, 4, 5, 7]


def test_no_source_file_loads_a_pickle():
    assert len(SOURCE_FILES) > 20
    problems = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in SOURCE_FILES
                for line, what in unsafe_loads(path)]
    assert problems == []


def test_the_source_never_hard_codes_trust_remote_code():
    found = []
    for path in SOURCE_FILES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                if keyword(node, "trust_remote_code") is True:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                if any(isinstance(a, ast.Constant) and a.value == "--trust_remote_code" for a in node.args):
                    assert keyword(node, "action") == "store_true", f"{path.relative_to(ROOT)}:{node.lineno}"
                    assert keyword(node, "default") in ("absent", False), f"{path.relative_to(ROOT)}:{node.lineno}"
    assert found == []


def cli_parsers():
    from inference import chatbot
    from training.step1_supervised_finetuning import main as step1
    from training.step1_supervised_finetuning import prompt_eval
    from training.step2_reward_model_finetuning import main as step2
    from training.step2_reward_model_finetuning import rw_eval
    from training.step3_rlhf_finetuning import main as step3

    step3_models = ["--actor_model_name_or_path", "a", "--critic_model_name_or_path", "c", "--output_dir", "o"]
    return {"step1": (step1.parse_args, ["--output_dir", "o"]), "step2": (step2.parse_args, ["--output_dir", "o"]),
            "step3": (step3.parse_args, step3_models), "chat": (chatbot.parse_args, ["--path", "tiny"]),
            "prompt_eval": (prompt_eval.parse_args, ["--model_name_or_path_baseline", "a",
                                                     "--model_name_or_path_finetune", "b"]),
            "rw_eval": (rw_eval.parse_args, ["--model_name_or_path", "a"])}


@pytest.mark.parametrize("cli", ["step1", "step2", "step3", "chat", "prompt_eval", "rw_eval"])
def test_every_parser_defaults_trust_remote_code_to_false(cli):
    parse_args, argv = cli_parsers()[cli]
    assert parse_args(argv).trust_remote_code is False
    assert parse_args([*argv, "--trust_remote_code"]).trust_remote_code is True


@pytest.fixture
def loader_calls(monkeypatch):
    """The trust_remote_code value of every transformers from_pretrained / AutoConfig call, recorded."""
    import transformers

    calls = []
    for cls_name in ("AutoConfig", "AutoTokenizer", "AutoModel", "AutoModelForCausalLM"):
        cls = getattr(transformers, cls_name)
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, _name=cls_name, **kwargs):
            calls.append((_name, kwargs.get("trust_remote_code", False)))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    return calls


@pytest.mark.parametrize("trust", [False, True])
def test_chat_and_rw_eval_pass_trust_remote_code_only_when_given(trust, loader_calls, step3_model_dirs, one_thread,
                                                                  capsys):
    from inference import chatbot
    from training.step2_reward_model_finetuning import rw_eval

    flag = ["--trust_remote_code"] if trust else []
    chatbot.main(["--path", str(step3_model_dirs[0]), "--prompt", "What is 1 + 2?", "--max_new_tokens", "2",
                  "--greedy", *flag])
    rw_eval.main(["--model_name_or_path", str(step3_model_dirs[1]), "--num_examples", "1", *flag])
    capsys.readouterr()
    loaders = {name for name, _ in loader_calls}
    assert {"AutoTokenizer", "AutoModelForCausalLM", "AutoModel"} <= loaders
    assert loader_calls and all(value is trust for _, value in loader_calls), loader_calls


# --------------------------------------------------------------------------- what the steps save


def pickles_and_safetensors(folder):
    files = [p for p in Path(folder).rglob("*") if p.is_file()]
    return ([str(p.relative_to(folder)) for p in files if p.name.endswith(PICKLE_SUFFIXES)],
            [str(p.relative_to(folder)) for p in files if p.suffix == ".safetensors"])


@pytest.fixture
def small_data(tmp_path):
    """A local data folder of 64 built-in-like rows (train and eval), quick to tokenize."""
    rows = [{"prompt": f" Human: What is {a} + {b}? Assistant:", "chosen": f" {a + b}", "rejected": f" {a + b + 1}"}
            for a in range(8) for b in range(8)]
    folder = tmp_path / "data"
    folder.mkdir()
    for split in ("train", "eval"):
        (folder / f"{split}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def run_main(main, argv):
    """A step's main in this process (a world of one); the environment it sets for that world is put back."""
    environment = dict(os.environ)
    try:
        main(argv)
    finally:
        os.environ.clear()
        os.environ.update(environment)


@pytest.mark.usefixtures("distributed", "one_thread")
def test_the_steps_save_safetensors_and_no_pickle(tmp_path, small_data, step3_model_dirs, capsys):
    from training.step1_supervised_finetuning import main as step1
    from training.step2_reward_model_finetuning import main as step2
    from training.step3_rlhf_finetuning import main as step3

    common = ["--data_path", str(small_data), "--data_output_path", str(tmp_path / "cache"), "--max_steps", "1"]
    batches = ["--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "16", "--max_seq_len", "32"]
    run_main(step1.main, [*common, *batches, "--output_dir", str(tmp_path / "actor")])
    run_main(step2.main, [*common, *batches, "--output_dir", str(tmp_path / "reward")])
    actor_dir, critic_dir = step3_model_dirs
    run_main(step3.main, [*common, "--actor_model_name_or_path", str(actor_dir), "--critic_model_name_or_path",
                          str(critic_dir), "--per_device_generation_batch_size", "2",
                          "--per_device_training_batch_size", "2", "--max_prompt_seq_len", "32",
                          "--max_answer_seq_len", "4", "--enable_ema", "--output_dir", str(tmp_path / "step3")])
    capsys.readouterr()
    expected = {"actor": {"model.safetensors"}, "reward": {"model.safetensors", "value_head.safetensors"},
                "step3": {"actor/model.safetensors", "critic/model.safetensors", "critic/value_head.safetensors",
                          "actor_ema/model.safetensors"}}
    for name, safetensors in expected.items():
        pickles, found = pickles_and_safetensors(tmp_path / name)
        assert pickles == [], name
        assert set(found) == safetensors, name
