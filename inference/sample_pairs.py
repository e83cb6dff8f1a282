"""Preference pairs from a model's own sampled answers, judged by a reward function (online / iterative DPO's data).

For each prompt of step 2's part of --data_path (train and eval splits), --samples_per_prompt answers sampled from
--model_name_or_path are scored by --reward_fn; the best-scored answer is chosen, the worst-scored rejected, and a
prompt whose answers all score the same is skipped (utils/data/sampled_pairs.py; where every prompt of a split is,
the split takes the data set's own pairs of its prompts, and says so). The pairs go to
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

from inference.generation import DEFAULT_MAX_NEW_TOKENS, generate, load_causal_lm, trained_max_new_tokens
from utils.data.prompting import model_prompt
from utils.data.data_utils import KNOWN_NAMES
from utils.data.sampled_pairs import (META_FILE, PAIRS_DATA_SPLIT, SPLITS, PairCounts, data_pairs, is_complete,
                                      judged_pairs, part_rows, write_pairs)
from utils.model.model_utils import check_model_kind, resolve_model_path
from utils.model.save import atomic_dir
from utils.rl.reward_fns import call_reward_fn, load_reward_fn
from utils.runtime.args import (ArgumentParser, add_data_args, add_generation_args, add_model_name_or_path_arg,
                                add_output_dir_arg, add_reward_fn_arg, check_flag_ranges, column_keys)
from utils.runtime.dist import quiet_transformers
from utils.runtime.ds_utils import choose_dtype
from utils.runtime.errors import ConfigError, DataError, cli_entry
from utils.runtime.paths import claim_folder, delete_leftovers


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    add_model_name_or_path_arg(parser, required=True, help="The policy whose answers are sampled: a step-1 actor "
                                                           "folder, hub name or built-in name.")
    add_reward_fn_arg(parser, role="The judge", required=True)
    add_output_dir_arg(parser, required=True, help="The pairs folder to write (train.jsonl, eval.jsonl, meta.json).")
    data = add_data_args(parser, default_max_seq_len=None, data_path_nargs="+")
    data.add_argument("--train_phase", type=int, default=2, choices=(1, 2, 3),
                      help="Whose part of --data_split gives the prompts: 2 (default), the step the pairs are for.")
    data.add_argument("--max_prompts", type=int, default=None,
                      help="Use at most the first N prompts of each split's part (they are in shuffled order); "
                           "default all.")
    add_generation_args(parser, fallback_length=DEFAULT_MAX_NEW_TOKENS, samples_per_prompt=4,
                        samples_help=", K: the pair is the best and the worst of them (at least 2)",
                        covers="the data split and the sampling")
    parser.add_argument("--resume", action="store_true",
                        help="Keep the pairs already in --output_dir if they were made with the same settings "
                             "(its meta.json says so) instead of sampling them again.")
    args = parser.parse_args(argv)
    if args.samples_per_prompt < 2:  # a pair is two answers; FLAG_RANGES says at least 1, as for prompt_eval.py
        raise ConfigError(f"--samples_per_prompt must be at least 2, got {args.samples_per_prompt}")
    check_flag_ranges(args)
    column_keys(args)
    if Path(args.output_dir).is_file():
        raise ConfigError(f"--output_dir {args.output_dir} is a file, not a folder")
    return args


def settings_of(args, model_path, max_new_tokens):
    """What the pairs depend on, as meta.json keeps it (--resume reuses pairs made with the same): the model's
    weights too, by their files' names, sizes and modification times, so a model saved again in the same folder
    (an earlier round of train.py --pair-rounds trained anew) is sampled again; and the data's columns."""
    keys = ("reward_fn", "data_path", "data_split", "train_phase", "max_prompts", "samples_per_prompt",
            "temperature", "top_p", "seed")
    weights = sorted([path.name, path.stat().st_size, path.stat().st_mtime_ns]
                     for path in Path(model_path).glob("*.safetensors"))
    return {"model": str(model_path), "weights": weights, "max_new_tokens": max_new_tokens,
            **{key: getattr(args, key) for key in keys}, "columns": column_keys(args)}


def sampled_answers(model, tokenizer, prompts, samples_per_prompt, max_new_tokens, temperature=1.0, top_p=1.0,
                    batch_size=32, seed=1234, desc=None):
    """K = samples_per_prompt sampled answers to each data-set prompt, in K rounds over the prompts: answer k * n + i
    answers prompts[i]. Prompts are put in the model's format (its chat template, if any) as training does."""
    model_prompts = [model_prompt(tokenizer, prompt) for prompt in prompts]
    return generate(model, tokenizer, model_prompts * samples_per_prompt, max_new_tokens=max_new_tokens,
                    temperature=temperature, top_p=top_p, batch_size=batch_size, seed=seed, desc=desc)


def local_data_inputs(data_paths):
    """("--data_path", the local file or folder) of each --data_path that names one (not builtin, a hub data set
    or a reasoning-gym spec; local/jsonfile: ./data), as claim_folder takes its inputs."""
    inputs = []
    for name in data_paths:
        if not Path(name).expanduser().exists():  # a folder with its splits chosen: folder?train=...
            name = name.partition("?")[0]
        if name == "local/jsonfile":
            name = str(Path.cwd() / "data")
        elif name in KNOWN_NAMES or name.startswith("reasoning_gym:") or not Path(name).expanduser().exists():
            continue
        inputs.append(("--data_path", str(Path(name).expanduser())))
    return inputs


def check_own_pairs(out):
    """Refuse an --output_dir whose train.jsonl / eval.jsonl this tool did not write (no meta.json beside them):
    someone's data, which writing the pairs would replace."""
    found = [f"{split}.jsonl" for split in SPLITS if (out / f"{split}.jsonl").exists()]
    if found and not (out / META_FILE).is_file():
        raise ConfigError(f"--output_dir {out} holds {' and '.join(found)} not written by sample_pairs (no "
                          f"{META_FILE} beside them), which the pairs would replace; pick another --output_dir")


@cli_entry
def main(argv=None):
    args = parse_args(argv)

    model_path = resolve_model_path(args.model_name_or_path)
    check_model_kind(model_path, reward=False, name=f"--model_name_or_path {args.model_name_or_path}")
    out = Path(args.output_dir)  # claimed as every step claims its own: inputs kept, writable, one run at a time
    claim_folder(out, "--output_dir", [("--model_name_or_path", model_path), *local_data_inputs(args.data_path)],
                 files=[out / f"{split}.jsonl" for split in SPLITS] + [out / META_FILE])
    check_own_pairs(out)
    delete_leftovers(out)
    reward_fn = load_reward_fn(args.reward_fn, args)  # a wrong judge fails before any answer is sampled
    parts = {split: part_rows(args.data_path, args.data_split, args.train_phase, args.seed, args.data_output_path,
                              split, column_keys(args))[:args.max_prompts] for split in SPLITS}
    prompts = {split: [prompt for prompt, _, _ in parts[split]] for split in SPLITS}
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
        if not rows[split]:  # an actor that fails (or solves) every question alike: the data's own pairs instead
            rows[split] = data_pairs(parts[split], counts[split])
            if rows[split]:
                print(f"WARNING: no {split} prompt's answers scored apart; its {len(rows[split])} pairs are the "
                      "data set's own", flush=True)
        print(counts[split].summary(split), flush=True)
    with atomic_dir(out) as tmp:  # the folder's earlier pairs until the new ones are whole (a full disk keeps them)
        write_pairs(tmp, rows, settings, counts)
    print(f"wrote {args.output_dir} (train.jsonl, eval.jsonl, meta.json) in {time.time() - start:.0f} s; train on "
          f"it with --data_path {args.output_dir} --data_split {PAIRS_DATA_SPLIT}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
