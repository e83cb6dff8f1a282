"""Step 1 evaluation: answers of a baseline and a fine-tuned model to the same prompts, side by side.

Without --prompts_file the prompts are the held-out ones of --data_path: the built-in task's by default, and each
model's mean checker score (1 exact, 0.5 near miss, 0.25 right format only) is printed overall and per skill, for
sampled and greedy decoding; any prompts file whose prompts are all built-in task prompts is scored the same way.
With a reasoning-gym spec (`--data_path 'reasoning_gym:chain_sum?max_terms=2'`) the prompts are its held-out
questions (tasks in turn), scored by each task's own verifier in [0, 1], overall and per task. With --tools the
answers may call the tool (inference/tool_rollout.py) and are scored on their final answer; each decoding also
reports the score without the tool (all_without_tools) and how often it was called (tool_call_rate) and ran
cleanly (tool_success_rate).

    python training/step1_supervised_finetuning/prompt_eval.py \\
        --model_name_or_path_baseline tiny --model_name_or_path_finetune output/actor --num_prompts 40
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from the clone: chatrlhf installs no packages
import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import json

from inference.evaluation import (BUILTIN_CHECKER, Checker, are_task_prompts, evaluate_models,
                                  fit_prompts_to_context, format_answer_stats, format_score_table,
                                  format_side_by_side, heldout_set, read_prompts_file, reward_fn_checker)
from inference.generation import DEFAULT_MAX_NEW_TOKENS, trained_max_new_tokens
from utils.model.model_utils import check_model_kind, resolve_model_path
from utils.runtime.args import (ArgumentParser, add_column_args, add_data_path_arg, add_generation_args,
                                add_output_json_arg, add_reward_fn_arg, add_tool_args, check_flag_ranges,
                                column_keys, is_auto)
from utils.runtime.errors import ConfigError, cli_entry
from utils.runtime.paths import check_not_an_input, check_output_file, write_file_atomic
from utils.runtime.tool_format import tool_use



def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_name_or_path_baseline", type=str, required=True,
                        help="The model before fine-tuning: a folder, hub name or built-in name (tiny).")
    parser.add_argument("--model_name_or_path_finetune", type=str, required=True,
                        help="The fine-tuned model: a step-1 (or step-3 actor) output folder.")
    parser.add_argument("--prompts_file", type=str, default=None,
                        help="JSON lines with a 'prompt' field (or a JSON array of them), or plain text with one "
                             "prompt per line, used verbatim; default: the held-out prompts of --data_path.")
    add_data_path_arg(parser, nargs="+",
                      help="Whose held-out prompts and checker: 'builtin' (the built-in task), a reasoning-gym spec, "
                           "reasoning_gym:<task>[?key=value&...][,<task>...] (scored by its tasks), or any other data "
                           "source (the prompts of its eval split, scored by --reward_model only).")
    add_column_args(parser)
    parser.add_argument("--num_prompts", type=int, default=None, help="Use only the first N prompts.")
    parser.add_argument("--num_show", type=int, default=8, help="Prompts printed with both models' answers.")
    add_output_json_arg(parser, "the scores and all answers (see inference.evaluation.evaluate_models)")
    parser.add_argument("--reward_model", type=str, default=None,
                        help="A reward-model folder (step 2 output): also report each model's mean reward.")
    add_reward_fn_arg(parser, role="Score the answers with this reward function instead of the data's checker (its "
                                   "mean is the 'all' score)")
    add_generation_args(parser, fallback_length=DEFAULT_MAX_NEW_TOKENS, auto_length=True, greedy=True,
                        samples_per_prompt=1, samples_help=" (the sampled scores are means over all of them)",
                        covers="the sampled decoding (the same for each model)")
    add_tool_args(parser)
    args = parser.parse_args(argv)
    check_flag_ranges(args)
    column_keys(args)
    args.tool_use = tool_use(args)
    if args.prompts_file and args.data_path != ["builtin"]:
        raise ConfigError("--prompts_file and --data_path both give the prompts; pass one")
    if args.prompts_file and is_auto(args.max_new_tokens):
        raise ConfigError("--max_new_tokens auto measures the reference answers of --data_path; with --prompts_file "
                          "give it a number of tokens")
    check_output_file("--output_json", args.output_json)
    return args


def fit_to_context(args, prompts):
    """The data's held-out prompts as they fit the finetuned model's context with --max_new_tokens
    (fit_prompts_to_context); a prompts file's prompts are the user's own, never cut (one too long is an error)."""
    from utils.model.model_utils import context_length, load_model_config, load_tokenizer

    path = resolve_model_path(args.model_name_or_path_finetune)
    return fit_prompts_to_context(prompts, load_tokenizer(path, args.trust_remote_code),
                                  context_length(load_model_config(path, args.trust_remote_code)),
                                  args.max_new_tokens, "--max_new_tokens")


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    models = {"baseline": args.model_name_or_path_baseline, "finetune": args.model_name_or_path_finetune}
    check_not_an_input("--output_json", args.output_json,
                       [("--prompts_file", args.prompts_file)] + [("--data_path", path) for path in args.data_path]
                       + [(f"--model_name_or_path_{name}", path) for name, path in models.items()])
    for name, path in models.items():  # a wrong folder fails at once, not after the first model's answers
        check_model_kind(resolve_model_path(path), reward=False, name=f"--model_name_or_path_{name} {path}")
    if args.prompts_file:
        prompts, checker = read_prompts_file(args.prompts_file), None
    else:
        prompts, checker = heldout_set(args.data_path, args.seed, column_keys(args))
    prompts = prompts[:args.num_prompts]
    if args.reward_fn:  # scores by the reward function, grouped as the data's checker groups the questions
        data_checker = checker or (BUILTIN_CHECKER if are_task_prompts(prompts) else None)
        from utils.rl.reward_fns import load_reward_fn

        checker = reward_fn_checker(load_reward_fn(args.reward_fn, args), args.reward_fn,
                                    data_checker.key if isinstance(data_checker, Checker) else None)
    if is_auto(args.max_new_tokens):
        from utils.data.data_utils import fit_auto_lengths
        from utils.model.model_utils import load_tokenizer

        tokenizer = load_tokenizer(resolve_model_path(args.model_name_or_path_finetune), args.trust_remote_code)
        fit_auto_lengths(args, args.data_path, tokenizer)
    elif args.max_new_tokens is None:
        args.max_new_tokens = trained_max_new_tokens(resolve_model_path(args.model_name_or_path_finetune), prompts,
                                                      args.trust_remote_code)
    if not args.prompts_file:
        prompts = fit_to_context(args, prompts)
    from utils.runtime.ds_utils import choose_dtype
    from utils.runtime.dist import quiet_transformers

    args.dtype, why = choose_dtype(args.dtype)
    print(f"dtype: {args.dtype} ({why})", flush=True)
    quiet_transformers()
    reward_fn = None
    if args.reward_model:
        from utils.model.reward_model import load_reward_model, score_answers

        reward_model, reward_tokenizer = load_reward_model(args.reward_model, args.trust_remote_code)

        def reward_fn(prompts, answers):
            return score_answers(reward_model, reward_tokenizer, prompts, answers, args.batch_size, "reward")

    results = evaluate_models(models, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_p=args.top_p, greedy_only=args.greedy, seed=args.seed,
                              batch_size=args.batch_size, reward_fn=reward_fn, dtype=args.dtype,
                              trust_remote_code=args.trust_remote_code, samples_per_prompt=args.samples_per_prompt,
                              checker=checker, tools=args.tool_use)

    print(f"{len(prompts)} prompts ({args.samples_per_prompt} sampled answer(s) each); "
          f"baseline = {models['baseline']}, finetune = {models['finetune']}")
    if args.num_show:
        print(format_side_by_side(prompts, results, args.num_show))
    table = format_score_table(results)
    if table:
        what = (f"mean score of the reward function --reward_fn {args.reward_fn}" if args.reward_fn else
                "mean reasoning-gym score (each task's own verifier, 0 to 1; solved: the share of answers scored 1)"
                if checker else
                "mean checker score (1 exact, 0.5 near miss, 0.25 right format only, 0 otherwise)")
        print(f"\n{what}" + ("; reward: mean reward-model score" if args.reward_model else ""))
        print(table)
    else:
        print("\n(no scores: the prompts are not all built-in task prompts)")
    print("\nthe answers, per group: best constant = the score of the best single answer given to every question "
          "(and that answer); distinct = different answers; top answer = the share of the most frequent one (and "
          f"it); cut = answers that reached --max_new_tokens {args.max_new_tokens} before their end")
    print(format_answer_stats(results))
    if args.output_json:
        write_file_atomic(args.output_json, lambda f: json.dump(results, f, indent=2))
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
