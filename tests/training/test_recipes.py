"""Tests of training/recipes.py: every recipe's flags are flags its step (and the closing evaluation) accepts."""
import pytest

from training.recipes import DATA_RECIPES, RECIPES, data_kind, recipe_flags

REQUIRED = {1: ["--output_dir", "out"], 2: ["--output_dir", "out"], "dpo": ["--output_dir", "out"],
            "kto": ["--output_dir", "out"], "orpo": ["--output_dir", "out", "--loss_type", "orpo"],
            3: ["--actor_model_name_or_path", "a", "--critic_model_name_or_path", "c", "--output_dir", "out"],
            "eval": ["--model_name_or_path_baseline", "a", "--model_name_or_path_finetune", "b"]}


def step_parser(step):
    from training.step1_supervised_finetuning import main as step1
    from training.step1_supervised_finetuning import prompt_eval
    from training.step2_reward_model_finetuning import main as step2
    from training.step2_dpo_finetuning import main as dpo
    from training.step2_kto_finetuning import main as kto
    from training.step3_rlhf_finetuning import main as step3

    return {1: step1, 2: step2, "dpo": dpo, "kto": kto, "orpo": dpo, 3: step3, "eval": prompt_eval}[step].parse_args


@pytest.mark.parametrize("model", sorted(RECIPES))
@pytest.mark.parametrize("step", [1, 2, "dpo", "kto", "orpo", 3, "eval"])
def test_every_recipe_parses(model, step):
    step_parser(step)(REQUIRED[step] + recipe_flags(model, step))


@pytest.mark.parametrize("model", sorted(RECIPES))
def test_every_critic_free_recipe_parses_after_step_3s(model):
    """train.py's critic-free stage passes step 3's recipe, then the "grpo" entry, with a reward function."""
    step_parser(3)(["--actor_model_name_or_path", "a", "--output_dir", "out", "--advantage_estimator", "grpo",
                    "--reward_fn", "builtin", *recipe_flags(model, 3), *recipe_flags(model, "grpo")])


@pytest.mark.parametrize("model", sorted(RECIPES))
def test_every_dpo_on_sampled_pairs_recipe_parses_after_dpos(model):
    """train.py's DPO stage with --pair-judge passes the "dpo" entry, then the "dpo_pairs" one."""
    step_parser("dpo")(REQUIRED["dpo"] + recipe_flags(model, "dpo") + recipe_flags(model, "dpo_pairs"))


def test_only_the_smollm2_evaluation_is_capped():
    assert recipe_flags("tiny", "eval") == [] and recipe_flags("facebook/opt-1.3b", "eval") == []
    assert "--num_prompts" in recipe_flags("smollm2-135m", "eval")


@pytest.mark.parametrize("model, kind", sorted(DATA_RECIPES))
@pytest.mark.parametrize("step", [1, 2, "dpo", 3, "eval"])
def test_every_data_recipe_parses_after_its_models(model, kind, step):
    data = {"reasoning_gym": ["reasoning_gym:chain_sum"], "user": ["/data/dialogues"]}[kind]
    flags = recipe_flags(model, step, data)
    assert flags[:len(recipe_flags(model, step))] == recipe_flags(model, step)  # the model's first, so these win
    step_parser(step)(REQUIRED[step] + flags)


def test_the_data_recipe_is_the_one_of_the_runs_data():
    rg = ["reasoning_gym:chain_sum?max_digits=1", "reasoning_gym:gcd"]
    assert data_kind(rg) == "reasoning_gym"
    assert data_kind(None) is data_kind([]) is data_kind(["builtin"]) is None
    assert data_kind(rg + ["builtin"]) == data_kind(["/data/hh"]) == data_kind(["Dahoas/rm-static"]) == "user"
    assert len(recipe_flags("smollm2-135m", 1, rg)) > len(recipe_flags("smollm2-135m", 1, ["builtin"]))
    # the user's own data and reasoning-gym tasks: every length from the data, whatever the model (the tiny
    # recipe's 64 tokens would drop every graph_color prompt)
    for model in ("tiny", "smollm2-135m"):
        for data in (["/data/hh"], rg):
            args = step_parser(1)(REQUIRED[1] + recipe_flags(model, 1, data))
            assert args.max_seq_len == "auto"
            args = step_parser(3)(REQUIRED[3] + recipe_flags(model, 3, data))
            assert args.max_prompt_seq_len == args.max_answer_seq_len == "auto"
    # train.py's critic-free stage on reasoning-gym data: lengths from the data, the verifier's held-out curve.
    flags = recipe_flags("smollm2-135m", 3, rg) + recipe_flags("smollm2-135m", "grpo", rg)
    args = step_parser(3)(["--actor_model_name_or_path", "a", "--output_dir", "out", "--advantage_estimator", "grpo",
                           "--reward_fn", "reasoning_gym", "--data_path", *rg, *flags])
    assert args.max_answer_seq_len == args.max_prompt_seq_len == "auto" and args.eval_interval > 0
    # on the user's data, the same RL where a reward function scores it
    user = recipe_flags("smollm2-135m", "grpo_reward_fn", ["/data/questions.jsonl"])
    assert user == recipe_flags("smollm2-135m", "grpo", rg)[len(recipe_flags("smollm2-135m", "grpo")):]
    assert recipe_flags("smollm2-135m", "train_reward_fn", ["/data/q.jsonl"]) == ["--time-budget", "27"]
