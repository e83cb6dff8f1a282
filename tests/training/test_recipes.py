"""Tests of training/recipes.py: every recipe's flags are flags its step (and the closing evaluation) accepts."""
import pytest

from training.recipes import RECIPES, recipe_flags

REQUIRED = {1: ["--output_dir", "out"], 2: ["--output_dir", "out"], "dpo": ["--output_dir", "out"],
            3: ["--actor_model_name_or_path", "a", "--critic_model_name_or_path", "c", "--output_dir", "out"],
            "eval": ["--model_name_or_path_baseline", "a", "--model_name_or_path_finetune", "b"]}


def step_parser(step):
    from training.step1_supervised_finetuning import main as step1
    from training.step1_supervised_finetuning import prompt_eval
    from training.step2_reward_model_finetuning import main as step2
    from training.step2_dpo_finetuning import main as dpo
    from training.step3_rlhf_finetuning import main as step3

    return {1: step1, 2: step2, "dpo": dpo, 3: step3, "eval": prompt_eval}[step].parse_args


@pytest.mark.parametrize("model", sorted(RECIPES))
@pytest.mark.parametrize("step", [1, 2, "dpo", 3, "eval"])
def test_every_recipe_parses(model, step):
    step_parser(step)(REQUIRED[step] + recipe_flags(model, step))


@pytest.mark.parametrize("model", sorted(RECIPES))
def test_every_critic_free_recipe_parses_after_step_3s(model):
    """train.py's critic-free stage passes step 3's recipe, then the "grpo" entry, with a reward function."""
    step_parser(3)(["--actor_model_name_or_path", "a", "--output_dir", "out", "--advantage_estimator", "grpo",
                    "--reward_fn", "builtin", *recipe_flags(model, 3), *recipe_flags(model, "grpo")])


def test_only_the_smollm2_evaluation_is_capped():
    assert recipe_flags("tiny", "eval") == [] and recipe_flags("facebook/opt-1.3b", "eval") == []
    assert "--num_prompts" in recipe_flags("smollm2-135m", "eval")
