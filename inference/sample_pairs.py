"""Preference pairs from a model's own sampled answers, judged by a reward function (online / iterative DPO's data).

For each prompt of step 2's part of --data_path (train and eval splits), --samples_per_prompt answers sampled from
--model_name_or_path are scored by --reward_fn; the best-scored answer is chosen, the worst-scored rejected, and a
prompt whose answers all score the same is skipped (utils/data/sampled_pairs.py). The pairs go to
<output_dir>/train.jsonl and eval.jsonl, with the settings and counts in meta.json; steps 2 and DPO read the
folder as a local data set, on all of it with `--data_path <output_dir> --data_split 0,1`.

    python inference/sample_pairs.py --model_name_or_path output/actor-models/tiny --reward_fn builtin \\
        --output_dir output/sampled-pairs/tiny
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from the clone: chatrlhf installs no packages
import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import time

from inference.generation import generate, load_causal_lm, trained_max_new_tokens
from utils.data.prompting import model_prompt
from utils.data.sampled_pairs import (PAIRS_DATA_SPLIT, SPLITS, PairCounts, is_complete, judged_pairs, part_prompts,
                                      write_pairs)
from utils.model.model_utils import check_model_kind, resolve_model_path
from utils.rl.reward_fns import call_reward_fn, load_reward_fn
from utils.runtime.args import ArgumentParser, check_flag_ranges
from utils.runtime.dist import quiet_transformers
from utils.runtime.ds_utils import choose_dtype
from utils.runtime.errors import ConfigError, DataError, cli_entry


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_name_or_path", type=str, required=True,
                        help="The policy whose answers are sampled: a step-1 actor folder, hub name or built-in name.")
    parser.add_argument("--reward_fn", type=str, required=True,
                        help="The judge: builtin (the built-in task's checker), reasoning_gym (the verifier of "
                             "--data_path's reasoning-gym tasks), or package.module:function / file.py:function "
                             "(utils/rl/reward_fns.py).")
    parser.add_argument("--output_dir", type=str, required=True,
                        help="The pairs folder to write (train.jsonl, eval.jsonl, meta.json).")
    parser.add_argument("--data_path", type=str, nargs="+", default=["builtin"],
                        help="Where the prompts come from: any data source steps 2 and 3 read (default builtin).")
    parser.add_argument("--data_split", type=str, default="2,4,4",
                        help="The data split of the steps (default 2,4,4); the prompts are --train_phase's part.")
    parser.add_argument("--train_phase", type=int, default=2, choices=(1, 2, 3),
                        help="Whose part of --data_split gives the prompts: 2 (default), the step the pairs are for.")
    parser.add_argument("--data_output_path", type=str, default="/tmp/data_files/",
                        help="Where the shuffled split indices are cached (the steps' flag of that name).")
    parser.add_argument("--max_prompts", type=int, default=None,
                        help="Use at most the first N prompts of each split's part (they are in shuffled order); "
                             "default all.")
    parser.add_argument("--samples_per_prompt", type=int, default=4,
                        help="Answers sampled per prompt, K: the pair is the best and the worst of them (default 4).")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="Sampling temperature (default 1.0, as step 3 samples).")
    parser.add_argument("--top_p", type=float, default=1.0, help="Nucleus top-p of the sampling (default 1.0).")
    parser.add_argument("--max_new_tokens", type=int, default=None,
                        help="The longest answer, in tokens (default: the answer length the model was trained to, "
                             "from its saved settings; else 16).")
    parser.add_argument("--batch_size", type=int, default=32, help="Prompts generated together (default 32).")
    parser.add_argument("--seed", type=int, default=1234, help="Seed of the data split and the sampling.")
    parser.add_argument("--dtype", type=str, default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                        help="auto: bf16 on a CPU with native bf16 (AMX / AVX-512 BF16), fp32 otherwise.")
    parser.add_argument("--trust_remote_code", action="store_true",
                        help="Allow the model folder's own Python code to run (off by default).")
    parser.add_argument("--resume", action="store_true",
                        help="Keep the pairs already in --output_dir if they were made with the same settings "
                             "(its meta.json says so) instead of sampling them again.")
    args = parser.parse_args(argv)
    check_flag_ranges(args)
    for flag in ("samples_per_prompt", "max_prompts", "max_new_tokens", "batch_size"):
        value = getattr(args, flag)
        if value is not None and value < (2 if flag == "samples_per_prompt" else 1):
            raise ConfigError(f"--{flag} must be at least {2 if flag == 'samples_per_prompt' else 1}, got {value}")
    if Path(args.output_dir).is_file():
        raise ConfigError(f"--output_dir {args.output_dir} is a file, not a folder")
    return args


def settings_of(args, model_path, max_new_tokens):
    """What the pairs depend on, as meta.json keeps it (--resume reuses pairs made with the same): the model's
    weights too, by their files' names, sizes and modification times, so a model saved again in the same folder
    (an earlier round of train.py --pair-rounds trained anew) is sampled again."""
    keys = ("reward_fn", "data_path", "data_split", "train_phase", "max_prompts", "samples_per_prompt",
            "temperature", "top_p", "seed")
    weights = sorted([path.name, path.stat().st_size, path.stat().st_mtime_ns]
                     for path in Path(model_path).glob("*.safetensors"))
    return {"model": str(model_path), "weights": weights, "max_new_tokens": max_new_tokens,
            **{key: getattr(args, key) for key in keys}}


def sampled_answers(model, tokenizer, prompts, samples_per_prompt, max_new_tokens, temperature=1.0, top_p=1.0,
                    batch_size=32, seed=1234, desc=None):
    """K = samples_per_prompt sampled answers to each data-set prompt, in K rounds over the prompts: answer k * n + i
    answers prompts[i]. Prompts are put in the model's format (its chat template, if any) as training does."""
    model_prompts = [model_prompt(tokenizer, prompt) for prompt in prompts]
    return generate(model, tokenizer, model_prompts * samples_per_prompt, max_new_tokens=max_new_tokens,
                    temperature=temperature, top_p=top_p, batch_size=batch_size, seed=seed, desc=desc)


@cli_entry
def main(argv=None):
    args = parse_args(argv)

    model_path = resolve_model_path(args.model_name_or_path)
    check_model_kind(model_path, reward=False, name=f"--model_name_or_path {args.model_name_or_path}")
    reward_fn = load_reward_fn(args.reward_fn, args)  # a wrong judge fails before any answer is sampled
    prompts = {split: part_prompts(args.data_path, args.data_split, args.train_phase, args.seed,
                                   args.data_output_path, split)[:args.max_prompts] for split in SPLITS}
    for split in SPLITS:
        if not prompts[split]:
            raise DataError(f"--data_path {' '.join(args.data_path)} has no {split} prompts in part "
                            f"{args.train_phase} of --data_split {args.data_split}")
    max_new_tokens = args.max_new_tokens or trained_max_new_tokens(model_path, prompts["train"],
                                                                   args.trust_remote_code)
    settings = settings_of(args, model_path, max_new_tokens)
    if args.resume and is_complete(args.output_dir, settings):
        print(f"{args.output_dir} already holds these pairs (--resume): nothing to do", flush=True)
        return 0
    args.dtype, why = choose_dtype(args.dtype)
    print(f"dtype: {args.dtype} ({why})", flush=True)
    quiet_transformers()
    model, tokenizer = load_causal_lm(model_path, args.dtype, args.trust_remote_code)
    start = time.time()
    rows, counts = {}, {}
    for split in SPLITS:
        answers = sampled_answers(model, tokenizer, prompts[split], args.samples_per_prompt, max_new_tokens,
                                  args.temperature, args.top_p, args.batch_size, args.seed, desc=f"{split} answers")
        answered = prompts[split] * args.samples_per_prompt
        scores = call_reward_fn(reward_fn, args.reward_fn, answered, answers).tolist()
        counts[split] = PairCounts()
        rows[split] = judged_pairs(prompts[split], answers, scores, counts[split])
        print(counts[split].summary(split), flush=True)
    write_pairs(args.output_dir, rows, settings, counts)
    print(f"wrote {args.output_dir} (train.jsonl, eval.jsonl, meta.json) in {time.time() - start:.0f} s; train on "
          f"it with --data_path {args.output_dir} --data_split {PAIRS_DATA_SPLIT}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
