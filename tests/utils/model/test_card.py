"""utils/model/card.py: the README.md model card of every saved folder: Hugging Face front matter that parses
(base_model through the folders' own saved settings, tags by algorithm from the registries, hub data sets only),
how it was trained, and the evaluation train.py adds; a real step-3 run saves one in each folder, which still
loads."""
import json
import os

import pytest

from utils.model.card import add_evaluation, hub_datasets, model_card, stage_of
from utils.model.save import MODEL_CARD, TRAINING_SETTINGS
from utils.runtime.provenance import code_commit, cpu_name


def front_matter(text):
    from huggingface_hub import ModelCard

    return ModelCard(text).data


@pytest.mark.parametrize("settings, role, tags", [
    ({"step": 1}, None, ["sft"]),
    ({"step": 2}, None, ["rlhf", "reward-model"]),
    ({"step": "dpo", "loss_type": "sigmoid"}, None, ["rlhf", "dpo"]),
    ({"step": "dpo", "loss_type": "ipo"}, None, ["rlhf", "dpo", "ipo"]),
    ({"step": "dpo", "loss_type": "orpo"}, None, ["rlhf", "orpo"]),  # reference-free: no "dpo"
    ({"step": "kto"}, None, ["rlhf", "kto"]),
    ({"step": 3, "advantage_estimator": "gae", "policy_loss": "ppo"}, "actor", ["rlhf", "ppo"]),
    ({"step": 3, "advantage_estimator": "gae", "policy_loss": "ppo"}, "critic", ["rlhf", "ppo", "critic"]),
    ({"step": 3, "advantage_estimator": "grpo", "policy_loss": "gspo"}, "actor_ema", ["rlhf", "grpo", "gspo", "ema"]),
    ({"step": 3, "advantage_estimator": "rloo", "policy_loss": "ppo"}, "actor", ["rlhf", "rloo"]),
])
def test_the_tags_name_the_algorithm_from_its_registries(settings, role, tags):
    assert stage_of(settings, role)[1] == tags


def test_the_front_matter_parses_and_names_the_base_model_through_the_saved_folders(tmp_path):
    """A DPO folder trained from a step-1 folder trained from smollm2-135m: base_model is the hub name of the model
    at the root of the chain, read from the step-1 folder's own saved settings."""
    step1 = tmp_path / "actor-models" / "smollm2-135m"
    step1.mkdir(parents=True)
    (step1 / TRAINING_SETTINGS).write_text(json.dumps({"step": 1, "model_name_or_path": "smollm2-135m"}))
    settings = {"step": "dpo", "model_name_or_path": str(step1), "loss_type": "sigmoid", "dtype": "bf16",
                "data_path": ["builtin", "Dahoas/rm-static", str(tmp_path)], "data_split": "2,4,4", "zero_stage": 2,
                "lora_dim": 16, "max_steps": 40, "seed": 7}
    metrics = {"accuracy_before": 0.5, "accuracy_after": 0.75, "optimizer_steps": 40, "steps_asked": 40,
               "train_rows_read": 100, "train_rows_kept": 96, "eval_rows_read": 10, "eval_rows_kept": 10}
    card = model_card(settings, metrics)
    data = front_matter(card)
    assert data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert data.tags == ["chatrlhf", "rlhf", "dpo"] and data.library_name == "transformers"
    assert data.datasets == ["Dahoas/rm-static"]  # not the built-in data, not a local folder
    assert data.pipeline_tag == "text-generation"
    assert f"| started from | `{step1}` <- `smollm2-135m`" in card
    assert "train 96 of 100 rows, eval 10 of 10 rows kept" in card
    assert "| steps | 40 optimizer steps |" in card and "| dtype | bf16 |" in card
    assert "| accuracy | 0.5 -> 0.75 |" in card
    assert "--loss_type sigmoid" in card and "--lora_dim 16" in card
    assert f"| chatrlhf commit | {code_commit()} |" in card and cpu_name() in card


def test_a_reward_model_card_has_no_text_generation_tag_and_hub_data_sets_only_by_name(tmp_path):
    data = front_matter(model_card({"step": 2, "model_name_or_path": "tiny", "data_path": ["builtin"]}))
    assert data.pipeline_tag is None and data.base_model == "tiny" and data.datasets is None
    assert hub_datasets(["owner/name", "reasoning_gym:gcd", "builtin", str(tmp_path), "a/b/c"]) == ["owner/name"]


def test_add_evaluation_puts_the_table_last_and_replaces_an_earlier_one(tmp_path):
    assert add_evaluation(tmp_path, "| a |") is False and not (tmp_path / MODEL_CARD).exists()
    (tmp_path / MODEL_CARD).write_text(model_card({"step": 1, "model_name_or_path": "tiny"}))
    assert add_evaluation(tmp_path, "| first |")
    assert add_evaluation(tmp_path, "| second |")
    text = (tmp_path / MODEL_CARD).read_text()
    assert text.count("## Evaluation") == 1 and "| first |" not in text
    assert text.endswith("## Evaluation\n\n| second |\n")
    assert front_matter(text).tags == ["chatrlhf", "sft"]


@pytest.mark.usefixtures("distributed", "one_thread")
def test_a_step3_run_saves_a_card_in_each_folder_and_each_folder_still_loads(tmp_path, step3_model_dirs, capsys):
    """One real PPO step with EMA: actor/, critic/ and actor_ema/ each get a card naming their role, with the
    step's counts; the folders load as before (transformers ignores README.md); the run's history is written."""
    from transformers import AutoModelForCausalLM

    from tests.files import write_jsonl
    from training.step3_rlhf_finetuning import main as step3
    from utils.model.reward_model import load_reward_model
    from utils.trainer.monitor import read_history

    rows = [{"prompt": f" Human: What is {a} + {b}? Assistant:", "chosen": f" {a + b}", "rejected": f" {a + b + 1}"}
            for a in range(6) for b in range(6)]
    for split in ("train", "eval"):
        write_jsonl(tmp_path / "data" / f"{split}.jsonl", rows)
    actor_dir, critic_dir = step3_model_dirs
    environment = dict(os.environ)
    try:
        step3.main(["--data_path", str(tmp_path / "data"), "--data_output_path", str(tmp_path / "cache"),
                    "--actor_model_name_or_path", str(actor_dir), "--critic_model_name_or_path", str(critic_dir),
                    "--per_device_generation_batch_size", "2", "--per_device_training_batch_size", "2",
                    "--max_prompt_seq_len", "32", "--max_answer_seq_len", "4", "--max_steps", "1", "--enable_ema",
                    "--output_dir", str(tmp_path / "step3")])
    finally:
        os.environ.clear()
        os.environ.update(environment)
    capsys.readouterr()
    out = tmp_path / "step3"
    metrics = json.loads((out / "metrics.json").read_text())
    for role, tags in (("actor", ["ppo"]), ("critic", ["ppo", "critic"]), ("actor_ema", ["ppo", "ema"])):
        text = (out / role / MODEL_CARD).read_text()
        data = front_matter(text)
        assert data.tags == ["chatrlhf", "rlhf", *tags], role
        started = str(critic_dir if role == "critic" else actor_dir)
        assert data.base_model == started, role  # folders saved without settings: the chain ends there
        assert "| steps | 1 prompt batches," in text, role
        assert f"train {metrics['train_rows_kept']} of {metrics['train_rows_read']} rows" in text, role
    AutoModelForCausalLM.from_pretrained(out / "actor")
    AutoModelForCausalLM.from_pretrained(out / "actor_ema")
    load_reward_model(str(out / "critic"))
    assert [step for step, _ in read_history(out)["ppo"]["score"]] == [1]
