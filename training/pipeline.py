"""The registry of train.py's algorithms, the stages they run, and the command of each run.

A stage (STAGES) is a step's main.py, run by `training/<folder>/training_scripts/<deployment>/run.sh` under the
`deepspeed` launcher, or a one-process script; its flags name the models it starts from, its output folder and its
ZeRO stages. An algorithm (ALGORITHMS) is one row: the stages it runs, the recipe keys and flags it adds to its own
stage (its last), and the flags it takes by default where the data has a checker. Every critic-free estimator of
utils/rl/estimators.py is an algorithm of the same name; another algorithm on an estimator is one more row (GSPO:
the grpo estimator with `--policy_loss gspo`).

--pair-judge adds a stage to step 2 that samples its pairs from the actor's own answers; with --pair-rounds N the
stages marked `repeats` run N times, each round from the actor the round before trained ("dpo@2": round 2's DPO).
"""
import contextlib
import importlib
import json
import os
import shlex
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from training.recipes import data_kind, recipe_flags
from utils.data.data_utils import parse_data_split
from utils.rl.estimators import CRITIC_FREE, ESTIMATORS
from utils.runtime.args import DATA_SPLIT, column_flag, column_keys
from utils.runtime.errors import ConfigError, DataError
from utils.runtime.trackers import NONE

ROOT = Path(__file__).resolve().parents[1]
EVAL_SCRIPT = ROOT / "training" / "step1_supervised_finetuning" / "prompt_eval.py"
# Sampled answers per held-out prompt in the closing evaluation: one per prompt leaves a standard error of about
# 0.02 on a 400-prompt mean checker score, as large as the differences the evaluation is there to show (a recipe's
# "eval" flags, then train.py's --eval-samples, set another number).
EVAL_SAMPLES_PER_PROMPT = 4
# What train.py sets anew for each round of --pair-rounds: the actor it starts from, its output, its pairs.
ROUND_FLAGS = ("model_name_or_path", "output_dir", "data_path")


@dataclass(frozen=True)
class Stage:
    """One training stage of a pipeline."""
    step: int  # DeepSpeed-Chat's step number: --step N, --stepN-args, part N of --data-split
    folder: str  # training/<folder>/ holds main.py and training_scripts/<deployment>/run.sh ("" for a script)
    output: str  # its output folder under --output-dir (then the model's name)
    trains: str  # "actor" or "reward": the model it trains, whose name labels its output and picks its recipe;
    # "" trains nothing (labelled by the actor)
    recipes: tuple  # the keys of its flags in training/recipes.py, in order
    flags: Callable  # (args, dirs, out) -> {flag: value} naming the models it starts from (dirs: the pipeline's
    # folders by stage), its output `out` and its ZeRO stages; a value None is left out
    actor_subdir: str = ""  # where in its output the trained actor is ("" for the folder itself)
    script: str = ""  # a one-process Python script run instead of a run.sh (its path under the repository)
    pairs_recipes: tuple = ()  # recipe keys added after `recipes` when it trains on --pair-judge's sampled pairs
    repeats: str = ""  # "first" or "last": it runs in every round of --pair-rounds, round k writing to its output
    # folder + "-round<k>", but the first or last round, which writes where a single round does


def _pairs_flags(args, dirs, out):
    """sample_pairs.py's: the actor that answers, the judge, the output, and the --pair-* flags given."""
    return {"--model_name_or_path": dirs["sft"], "--reward_fn": args.pair_judge, "--output_dir": out,
            "--samples_per_prompt": args.pair_samples, "--temperature": args.pair_temperature,
            "--max_prompts": args.pair_prompts}


def _step3_flags(args, dirs, out):
    """Step 3's: the actor, the critic (the reward model it starts from; none for critic-free RL on a reward
    function, which then gets --reward_fn), their ZeRO stages, the output."""
    return {"--actor_model_name_or_path": dirs["sft"], "--critic_model_name_or_path": dirs.get("reward"),
            "--actor_zero_stage": args.actor_zero_stage, "--critic_zero_stage": args.reward_zero_stage,
            "--output_dir": out, "--reward_fn": args.reward_fn, "--tools": args.tools,
            **deadline_flags(args)}


def deadline_flags(args):
    """With --time-budget: step 3's --deadline (the command's start plus the budget), --reserve_answers and
    --reserve_greedy_answers (the closing evaluation's answers and its greedy ones, train.py's `closing_answers`);
    {} without one."""
    if not getattr(args, "deadline", None):
        return {}
    return {"--deadline": f"{args.deadline:.0f}", "--reserve_answers": args.reserve_answers,
            "--reserve_greedy_answers": args.reserve_greedy_answers}


def _preference_flags(args, dirs, out):
    """A step-2 stage that trains the actor on preferences (DPO, KTO, ORPO): it starts from the step-1 actor (the
    base model where step 1 does not run), at the actor's ZeRO stage."""
    return {"--model_name_or_path": dirs["sft"], "--zero_stage": args.actor_zero_stage, "--output_dir": out,
            "--answer_filter_fn": args.answer_filter}


STAGES = {
    "sft": Stage(1, "step1_supervised_finetuning", "actor-models", "actor", (1,), lambda args, dirs, out: {
        "--model_name_or_path": args.actor_model, "--zero_stage": args.actor_zero_stage, "--output_dir": out,
        "--answer_filter_fn": args.answer_filter}),
    "pairs": Stage(2, "", "sampled-pairs", "", ("pairs",), _pairs_flags, script="inference/sample_pairs.py",
                   repeats="first"),
    # --reward-from-sft: the reward model starts from the step-1 actor's weights, as InstructGPT's does.
    "reward": Stage(2, "step2_reward_model_finetuning", "reward-models", "reward", (2,), lambda args, dirs, out: {
        "--model_name_or_path": dirs["sft"] if args.reward_from_sft else args.reward_model,
        "--zero_stage": args.reward_zero_stage, "--output_dir": out, "--answer_filter_fn": args.answer_filter}),
    "dpo": Stage(2, "step2_dpo_finetuning", "dpo-models", "actor", ("dpo",), _preference_flags,
                 pairs_recipes=("dpo_pairs",), repeats="last"),
    "kto": Stage(2, "step2_kto_finetuning", "kto-models", "actor", ("kto",), _preference_flags),
    # ORPO is DPO's stage with a reference-free loss (--loss_type orpo) run on the base model.
    "orpo": Stage(2, "step2_dpo_finetuning", "orpo-models", "actor", ("orpo",), _preference_flags),
    "ppo": Stage(3, "step3_rlhf_finetuning", "step3-models", "actor", (3,), _step3_flags, actor_subdir="actor"),
    "rl": Stage(3, "step3_rlhf_finetuning", "step3-models", "actor", (3,), _step3_flags, actor_subdir="actor"),
}


PAIR_STAGES = ("reward", "dpo", "orpo")
"""The stages that train on the data's preference pairs unless --pair-judge makes them from the actor's answers."""
WHOLE_DATA_SPLIT = "0,0,1"
"""The --data_split of step 3 where no other stage reads the data (prompts alone, a reward function): all of it,
rather than the 40% of 2,4,4 with the rest unread."""


def default_data_split(names, data_paths):
    """The --data_split the runs `names` take where --data-split is not given, so that no part of the data goes
    unread: WHOLE_DATA_SPLIT where step 3 alone reads it; on the user's own data (files, hub data sets) DATA_SPLIT
    with the parts of the steps that do not run given nothing (DPO, KTO: 2,4,0, step 1 a third and step 2 two
    thirds; ORPO: 0,4,0, all of it; critic-free RL on a reward function: 2,0,4); None (each step's DATA_SPLIT)
    otherwise. The built-in task and reasoning-gym specs make as many rows as asked: their parts stay DATA_SPLIT's."""
    steps = {STAGES[name].step for name in names}
    if steps == {3}:
        return WHOLE_DATA_SPLIT
    parts = DATA_SPLIT.split(",")
    if data_kind(data_paths) != "user" or steps >= set(range(1, len(parts) + 1)):
        return None
    return ",".join(part if step in steps else "0" for step, part in enumerate(parts, 1))


@dataclass(frozen=True)
class Algorithm:
    """One --algorithm."""
    stages: tuple  # its STAGES, in order; the last is its own
    help: str  # what it runs, for --algorithm's help
    recipes: tuple = ()  # recipe keys its own stage takes after the stage's
    flags: tuple = ()  # flags its own stage takes after the stage's (a recipe or --stepN-args may change them)
    with_checker: tuple = ()  # train.py flags it takes by default where the data has a checker ("{checker}": its
    # name) and neither --pair-judge nor --reward-fn is given: the best measured recipe (docs/algorithms.md)


ALGORITHMS = {
    # The reward model on the actor's own judged answers: +0.120 to +0.134 held-out (sampled) over three seeds, no
    # greedy skill down; on the data set's own pairs it ranked held-out sums' near misses too high (greedy sums
    # fell by up to 0.020: docs/defaults.md).
    "ppo": Algorithm(("sft", "reward", "ppo"), "SFT, reward model (with a checker: on the actor's judged answers), "
                     "PPO with a critic", with_checker=("--pair-judge", "{checker}")),
    # Four rounds on the actor's own judged answers: +0.16 to +0.175 held-out (sampled) over six seeds, no greedy
    # skill down by more than 0.005; on the data set's own pairs DPO gains least.
    "dpo": Algorithm(("sft", "dpo"), "SFT, then DPO (with a checker: iterative, on the actor's judged answers)",
                     with_checker=("--pair-judge", "{checker}", "--pair-rounds", "4")),
    # On the checker, no reward model: grpo +0.171 to +0.178 held-out (sampled) over seven seeds.
    **{name: Algorithm(("sft", "reward", "rl"), f"SFT, a reward model unless --reward-fn, then critic-free RL, "
                       f"{ESTIMATORS[name].help}", recipes=("grpo",), flags=("--advantage_estimator", name),
                       with_checker=("--reward-fn", "{checker}"))
       for name in CRITIC_FREE},
    # KTO on the actor's judged answers: +0.120 to +0.128 held-out (sampled), three seeds; ORPO from the base model
    # on the pairs whose chosen answer the checker passes +0.198 to +0.205 over step 1 at the same budget, three
    # seeds (on every pair +0.049; step 1 on the same rows +0.202: the filter's gain; docs/algorithms.md).
    "kto": Algorithm(("sft", "kto"), "SFT, then KTO on answers labelled desirable or undesirable (a pair: one of "
                     "each; with a checker: the actor's judged answers)", with_checker=("--pair-judge", "{checker}")),
    "orpo": Algorithm(("orpo",), "ORPO from the base model: SFT and the preference in one stage, no step 1, no "
                      "reference (with a checker: on the pairs whose chosen answer it gives full marks)",
                      flags=("--loss_type", "orpo"), with_checker=("--answer-filter", "{checker}")),
    # GSPO: the grpo estimator with one clipped ratio per answer (the paper's ranges), averaged over answers as the
    # paper's objective, on GRPO's recipe: +0.169 to +0.171 held-out (sampled), three seeds.
    "gspo": Algorithm(("sft", "reward", "rl"), "SFT, a reward model unless --reward-fn, then GSPO: the grpo "
                      "estimator with a sequence-level importance ratio (--policy_loss gspo)", recipes=("grpo",),
                      flags=("--advantage_estimator", "grpo", "--policy_loss", "gspo", "--loss_agg_mode",
                             "seq_mean_token_mean", "--cliprange_low", "3e-4", "--cliprange_high", "4e-4"),
                      with_checker=("--reward-fn", "{checker}")),
}


def has_step3(args):
    return any(STAGES[name].step == 3 for name in ALGORITHMS[args.algorithm].stages)


def train_recipe(args):
    """train.py's own flags from the recipe of its actor and data (its "train" entry, and "train_reward_fn" where a
    reward function scores step 3: the time budget) where the algorithm has a step 3 to bound."""
    if not has_step3(args):
        return []
    keys = ("train", "train_reward_fn") if reward_fn_given(args) else ("train",)
    return [flag for key in keys for flag in recipe_flags(args.actor_model, key, args.data_path)]


def reward_fn_given(args):
    """Whether step 3 is scored by a reward function (--reward-fn, not `none`)."""
    return args.reward_fn not in (None, "none")


def closing_answers(args, runs):
    """(the answers the closing evaluation decodes, the greedy ones among them): its prompts (--num_prompts, else
    the whole held-out set) x its sampled answers and the greedy one x its two models (x 2 with --tools: with and
    without); (0, 0) without one."""
    command = None if args.no_eval else evaluation_command(args, runs)
    if not command:
        return 0, 0

    prompts = evaluation_prompts(args, command)
    greedy = prompts * 2 * (2 if args.tools else 1)
    return greedy * (_last_int(command, "--samples_per_prompt") + 1), greedy


def _last_int(command, flag):
    """The last value of `flag` in `command` (the one that wins), None where it is not given."""
    values = [command[i + 1] for i, item in enumerate(command[:-1]) if item == flag]
    return int(values[-1]) if values else None


def evaluation_prompts(args, command):
    """The held-out prompts the closing evaluation `command` answers: its --num_prompts, else the whole set."""
    prompts = _last_int(command, "--num_prompts")
    if prompts is None:
        from inference.evaluation import heldout_set  # loads transformers: --help and flag errors answer first

        prompts = len(heldout_set(args.data_path or ["builtin"], columns=column_keys(args))[0])
    return prompts


MIN_EVAL_PROMPTS = 20
"""The fewest held-out prompts a closing evaluation cut to fit the time budget answers (fit_evaluation)."""


def fit_evaluation(command, prompts, decoding_s, seconds_left, tools=False):
    """(the closing evaluation `command` of `prompts` prompts, None) where `seconds_left` (the --time-budget's)
    holds it at step 3's decoding rates (`decoding_s`, its metrics': seconds per sampled and greedy answer, and its
    setup), or where they are unknown; else (the command cut to the prompts that fit, at least MIN_EVAL_PROMPTS,
    the line that says so): the budget bounds the whole command, the evaluation too."""
    sampled = decoding_s.get("sampled", decoding_s.get("evaluation", decoding_s.get("rollouts")))
    greedy = decoding_s.get("greedy", sampled)
    if not sampled or prompts <= MIN_EVAL_PROMPTS:
        return command, None
    per_prompt = 2 * (2 if tools else 1) * (_last_int(command, "--samples_per_prompt") * sampled + greedy)
    fit = int((seconds_left - decoding_s.get("setup", 0.0)) // per_prompt)
    if fit >= prompts:
        return command, None
    kept = max(MIN_EVAL_PROMPTS, fit)
    why = (f"the {seconds_left / 60:.1f} minutes --time-budget left hold {max(fit, 0)} at step 3's decoding rates"
           if seconds_left > 0 else f"--time-budget is spent, and {MIN_EVAL_PROMPTS} the fewest it answers")
    return [*command, "--num_prompts", str(kept)], (
        f"{kept} of {prompts} held-out prompts: {why} (--time-budget 0 answers them all)")


def data_checker(data_paths):
    """The reward function that is the data's own checker (utils/rl/reward_fns.py): builtin for the built-in task
    (the default data), reasoning_gym for one reasoning-gym spec; None for other data or a mix."""
    from inference.evaluation import has_checker  # loads transformers: --help and flag errors answer first

    paths = data_paths or ["builtin"]
    if not has_checker(paths):
        return None
    return "builtin" if set(paths) == {"builtin"} else "reasoning_gym" if len(paths) == 1 else None


def checker_defaults(args, data_set_by_step):
    """The flags --algorithm takes by default (its `with_checker`) where none of --pair-judge, --reward-fn and
    --answer-filter is given and the data has a checker (not where a --stepN-args sets a step's data); []
    otherwise."""
    row = ALGORITHMS[args.algorithm]
    if not row.with_checker or args.pair_judge or args.reward_fn or args.answer_filter or data_set_by_step:
        return []
    checker = data_checker(args.data_path)
    return [flag.format(checker=checker) for flag in row.with_checker] if checker else []


@dataclass(frozen=True)
class Run:
    """A stage as one pipeline runs it."""
    name: str  # its key for folders, wall times and the report: the stage's, "<stage>@<k>" in round k > 1
    stage: str  # its STAGES name
    dirs: dict  # {stage: folder} as it sees them: its own output, and in round k > 1 of --pair-rounds the round's
    # folders, "sft" (the actor it starts from) being the actor round k - 1 trained
    round: int = 1
    data_split: str = None  # its --data_split where --data-split is not given (default_data_split; None: DATA_SPLIT)

    @property
    def spec(self):
        return STAGES[self.stage]

    @property
    def output(self):
        return self.dirs[self.stage]

    def flags(self, args):
        """Its Stage's flags: {flag: value as text}, without the None ones."""
        flags = self.spec.flags(args, self.dirs, self.output)
        return {flag: str(value) for flag, value in flags.items() if value is not None}


def plan(args):
    """Every run of the pipeline, whichever --step runs, in order: the algorithm's stages, less the reward model
    where a reward function replaces it and step 1 where the data has no answers to imitate; with --pair-judge the
    sampled pairs first in step 2; with --pair-rounds N the `repeats` stages again for rounds 2 to N."""
    names = [name for name in ALGORITHMS[args.algorithm].stages
             if not (STAGES[name].trains == "reward" and args.reward_fn)]
    data = tuple(args.data_path or ()), tuple(column_keys(args).items())
    if not has_reference_answers(*data):
        names = [name for name in names if STAGES[name].step != 1]
    own_data = "--data_path" in getattr(args, "step2_args", "")  # step 2's own data: its stage reads and checks it
    on_pairs = [name for name in names if name in PAIR_STAGES and STAGES[name].step in getattr(args, "step", (2,))
                and not own_data]
    if on_pairs and not args.pair_judge and not has_pairs(*data):
        unread = other_columns(*data)
        named = (f"; its rows' columns not read as a prompt or an answer: {', '.join(unread)} (name the answers' "
                 "with --chosen-key and --rejected-key)") if unread else ""
        raise ConfigError(f"--data-path {' '.join(data[0]) or 'builtin'} has no preference pairs (a row with a chosen "
                          f"and a rejected answer) for the {on_pairs[0]} stage of --algorithm {args.algorithm}: give "
                          "pair data, --pair-judge FN to judge the actor's own answers, or a critic-free --algorithm "
                          f"with --reward-fn FN (--step 1 trains SFT alone; labelled answers: --algorithm kto){named}")
    if args.pair_judge:
        names.insert(next(i for i, name in enumerate(names) if STAGES[name].step == 2), "pairs")
    repeating = [name for name in names if STAGES[name].repeats]
    rounds = [(name, 1) for name in names] + [(name, k) for k in range(2, args.pair_rounds + 1) for name in repeating]

    def run_name(name, k):
        return name if k == 1 else f"{name}@{k}"

    folders = {run_name(name, k): Path(args.output_dir) / STAGES[name].output / (model_label(stage_model(args, name))
                                                                                 + round_suffix(name, k, args))
               for name, k in rounds}
    folders.setdefault("sft", args.actor_model)  # without step 1 the later steps start from the base model
    actor = next((name for name in repeating if STAGES[name].trains == "actor"), None)
    split = default_data_split(names, args.data_path)
    runs = []
    for name, k in rounds:
        dirs = folders if k == 1 else {**folders, **{other: folders[run_name(other, k)] for other in repeating},
                                       "sft": folders[run_name(actor, k - 1)]}
        runs.append(Run(run_name(name, k), name, dirs, k, data_split=split))
    return runs


def round_suffix(name, k, args):
    """The output folder's suffix of round k of --pair-rounds: `-round<k>`, but in the round that writes where a
    single round does (the first for the sampled pairs, the last for the DPO actor)."""
    repeats = STAGES[name].repeats
    return f"-round{k}" if repeats and k != (1 if repeats == "first" else args.pair_rounds) else ""


def model_label(model):
    """The folder name of a model's outputs: `facebook/opt-1.3b` -> `opt-1.3b`, `./my/model/` -> `model`."""
    return Path(model.rstrip("/")).name or "model"


def stage_model(args, name):
    return args.reward_model if STAGES[name].trains == "reward" else args.actor_model


def run_inputs(args, run, runs):
    """The runs whose outputs `run` starts from: those whose folders its flags name."""
    given = set(run.flags(args).values())
    return [other for other in runs if other is not run and str(other.output) in given]


def has_reference_answers(data_paths, columns=()):
    """Whether the data has answers to imitate: False for prompts alone (a local file of questions, reasoning-gym
    tasks that any valid solution answers, such as graph_color), its columns renamed by `columns` ((field, column)
    pairs). DeepSpeed-Chat's hub data sets, whose reading needs the network, and the built-in task have them. A
    path that is neither a known name nor an existing file or folder nor a data set `datasets` loads, or whose
    columns are not there, is refused here, before any step starts."""
    return _some_row(data_paths, columns, lambda raw, row: raw.get_chosen(row) is not None)


def has_pairs(data_paths, columns=()):
    """Whether the data has preference pairs (a chosen and a rejected answer to one prompt), read as
    has_reference_answers reads it."""
    return _some_row(data_paths, columns,
                     lambda raw, row: raw.get_chosen(row) is not None and raw.get_rejected(row) is not None)


def other_columns(data_paths, columns=()):
    """The columns of each data set's first train row that were not read as a prompt or an answer (a pair whose
    answers are under names the row shapes do not know; READ_FIELDS were read), sorted."""
    from utils.data.pair_formats import READ_FIELDS
    from utils.data.raw_datasets import ROW_COLUMNS  # loads datasets: --help and flag errors answer first

    names = set()
    for raw in _read_data(data_paths, columns, os.getcwd())[0]:
        try:
            rows = raw.get_train_data()
            kept = rows[0].get(ROW_COLUMNS) if len(rows) else None
        except DataError:
            continue
        names.update(json.loads(kept) if kept else ())
    return sorted(names - {"prompt"} - READ_FIELDS)


def _some_row(data_paths, columns, test):
    """Whether a row of the data's train splits passes `test(raw, row)`; True where the data's reading needs the
    network (DeepSpeed-Chat's hub names) or is the built-in task."""
    readable, unread = _read_data(data_paths, columns, os.getcwd())
    if unread:
        return True

    def passes(raw):
        try:
            return any(test(raw, row) for row in raw.get_train_data())
        except DataError:  # a reasoning-gym spec none of whose tasks has reference answers
            return False

    return any(passes(raw) for raw in readable)


@lru_cache(maxsize=None)
def _read_data(data_paths, columns=(), cwd=None):
    """(the raw data sets of `data_paths`, columns renamed by `columns`, read once per working directory `cwd`, in
    which relative paths are read; whether a path is a kind not read here: DeepSpeed-Chat's hub names, builtin)."""
    from utils.data.data_utils import get_raw_dataset  # loads datasets: --help and flag errors answer first
    from utils.data.raw_datasets import HUB_DATASETS

    def read(path):
        try:
            return get_raw_dataset(path, seed=1234, columns=dict(columns))
        except DataError as err:
            raise DataError(f"--data-path: {err}") from None

    paths = data_paths or ("builtin",)
    readable = [read(path) for path in paths if path not in HUB_DATASETS and path != "builtin"]
    return readable, len(readable) < len(paths)


def pipeline_flags(args, data_columns=True):
    """The flags every training stage gets from train.py: its trackers (--report-to) in the pipeline's group,
    checkpoints, the shared data and seed settings (`data_columns`: with the data's columns, not for a stage that
    reads sampled pairs)."""
    # Every stage logs under one TensorBoard folder (`tensorboard --logdir <output-dir>/tensorboard`), and its W&B
    # and MLflow runs under <output-dir>/wandb and <output-dir>/mlruns, grouped as one pipeline.
    flags = ["--report_to", *(args.report_to or [NONE]), "--tensorboard_path",
             str(Path(args.output_dir) / "tensorboard"), "--tracking_dir", str(args.output_dir)]
    flags += ["--run_group", args.run_group] if args.run_group else []
    flags += ["--save_steps", str(args.save_steps)] if args.save_steps else []
    flags += ["--overwrite_output_dir"] if args.overwrite_output_dir else []
    return flags + script_flags(args, data_columns)


def script_flags(args, data_columns=True):
    """The flags every stage gets, scripts included: --resume, the shared data and seed settings, and (unless not
    `data_columns`) the data's columns."""
    flags = ["--resume"] if args.resume else []
    flags += ["--data_path", *args.data_path] if args.data_path else []
    flags += column_flags(args) if data_columns else []
    flags += ["--data_split", args.data_split] if args.data_split else []
    flags += ["--seed", str(args.seed)] if args.seed is not None else []
    return flags


def column_flags(args):
    """train.py's --prompt-key ... as the stages' --prompt_key ... (utils/runtime/args.py column_keys)."""
    return [item for field, column in column_keys(args).items() for item in (column_flag(field), column)]


def step_command(args, run):
    """The command of one run. A step: `bash run.sh` with its Stage's flags and its algorithm's, its recipe, the
    pipeline-wide flags and the run's default_data_split, step 2's sampled pairs (the round's folder, whole), then
    the user's --stepN-args (last, so they win). A script: `python <script>`, its recipe, its flags (after the
    recipe's, so they win), then the pipeline-wide data flags and the run's default_data_split."""
    from utils.data.sampled_pairs import PAIRS_DATA_SPLIT  # loads datasets: --help and flag errors answer first

    spec, algorithm = run.spec, ALGORITHMS[args.algorithm]
    own = algorithm if run.stage == algorithm.stages[-1] else Algorithm((), "")
    flags = [item for pair in run.flags(args).items() for item in pair] + list(own.flags)
    keys = spec.recipes + (spec.pairs_recipes if args.pair_judge else ()) + own.recipes
    keys += tuple(f"{key}_reward_fn" for key in own.recipes if reward_fn_given(args))  # RL on a reward function
    recipe = [flag for key in keys for flag in recipe_flags(stage_model(args, run.stage), key, args.data_path)]
    split = ["--data_split", run.data_split] if run.data_split and not args.data_split else []
    if spec.script:
        return [sys.executable, str(ROOT / spec.script), *recipe, *flags, *script_flags(args), *split]
    script = ROOT / "training" / spec.folder / "training_scripts" / args.deployment_type / "run.sh"
    pairs = ["--data_path", str(run.dirs["pairs"]), "--data_split", PAIRS_DATA_SPLIT] \
        if "pairs" in run.dirs and spec.step == 2 else []
    # Sampled pairs are written in the standard columns: the data's own column names do not apply to them.
    return ["bash", str(script), *flags, *recipe, *pipeline_flags(args, data_columns=not pairs), *split, *pairs,
            *shlex.split(getattr(args, f"step{spec.step}_args"))]


def step_parser(folder):
    """The `parse_args` of the step in training/<folder>/main.py, imported without the OpenMP defaults importing it
    sets (each launch decides those for itself)."""
    environ = dict(os.environ)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's notes on loading, off the printed commands
            return importlib.import_module(f"training.{folder}.main").parse_args
    finally:
        os.environ.clear()
        os.environ.update(environ)


def check_step_flags(args, runs):
    """Parse each command of the steps to run that carries --stepN-args with that step's own parse_args before any
    step runs, so that a flag the step refuses (unknown, out of its range, a combination it cannot run with the
    recipe's flags) is one error line at once, not after the steps before it have trained; and refuse those that
    move a stage's output (`--output_dir`, abbreviated or not): the later stages, the evaluation and the report
    read it where train.py puts it."""
    for run in runs:
        user_flags = shlex.split(getattr(args, f"step{run.spec.step}_args"))
        if run.spec.script or run.spec.step not in args.step or not user_flags:
            continue
        parse, command = step_parser(run.spec.folder), step_command(args, run)[2:]
        try:
            given = parse(command)
        except ConfigError as err:
            raise ConfigError(f"--step{run.spec.step}-args {shlex.join(user_flags)}: {err}") from None
        if given.output_dir != parse(command[:len(command) - len(user_flags)]).output_dir:
            raise ConfigError(f"--step{run.spec.step}-args --output_dir: train.py puts each stage's output under "
                              "--output-dir, where the later stages, the evaluation and the report read it; give "
                              "--output-dir instead")


def check_data_split(args, runs):
    """Refuse a --data-split that leaves a step to run without its part (step N trains on part N): fewer parts than
    the step's number, or a part of 0, at once rather than once the steps before it have trained."""
    if args.data_split is None:
        return
    fractions = parse_data_split(args.data_split)
    for run in runs:
        step = run.spec.step
        if step in args.step and (step > len(fractions) or fractions[step - 1] == 0):
            have = f"has {len(fractions)} part(s)" if step > len(fractions) else f"gives part {step} nothing"
            raise ConfigError(f"--data-split {args.data_split} {have}, but step {step} ({run.stage}) reads part "
                              f"{step}: give each step that runs a part, like 2,4,4")


def check_round_flags(args, runs):
    """Refuse --stepN-args that set what train.py sets for each round of --pair-rounds (ROUND_FLAGS), as the step
    reads its flags: `--output_dir=X` and an abbreviation such as `--output_d X` count. Round 2's command is parsed
    by its step's own parse_args with and without the user's flags."""
    later = next((run for run in runs if run.round > 1 and not run.spec.script), None)
    user_flags = shlex.split(getattr(args, f"step{later.spec.step}_args")) if later else []
    if not user_flags:
        return
    command = step_command(args, later)[2:]
    parse = step_parser(later.spec.folder)
    try:
        given = parse(command)
    except ConfigError as err:
        raise ConfigError(f"--step{later.spec.step}-args {shlex.join(user_flags)}: {err}") from None
    ours = parse(command[:len(command) - len(user_flags)])
    changed = [dest for dest in ROUND_FLAGS if getattr(given, dest) != getattr(ours, dest)]
    if changed:
        raise ConfigError(f"--step{later.spec.step}-args --{changed[0]}: with --pair-rounds train.py sets it for "
                          "each round (its start, its output, its pairs)")


def actor_dir(args, run):
    """Where `run` saves the actor it trains: for step 3 with --enable_ema (given or from the recipe), the moving
    average of its weights (`actor_ema`), which DeepSpeed-Chat recommends as the better model; the evaluation
    compares that one."""
    folder = run.output / run.spec.actor_subdir
    if run.spec.actor_subdir and "--enable_ema" in step_command(args, run):
        return folder.with_name(folder.name + "_ema")
    return folder


def evaluation_command(args, runs):
    """Compare the actor before and after the last run of --step that trains it, on the held-out prompts: the
    step-1 actor (the base model where step 1 cannot run) against the final actor (`actor_dir`), or the base model
    against the step-1 actor when only step 1 runs. --eval-prompts and --eval-samples, where given, win over the
    recipe's "eval" flags and EVAL_SAMPLES_PER_PROMPT."""
    trained = [run for run in runs if run.spec.step in args.step and run.spec.trains == "actor"]
    if not trained:
        return None
    last = trained[-1]
    if last.spec.step == 1:
        baseline, finetune, reward = args.actor_model, last.output, []
    else:
        baseline, finetune = next((run.output for run in runs if run.spec.step == 1), args.actor_model), \
            actor_dir(args, last)
        reward = [flag for run in runs if run.spec.trains == "reward" for flag in ("--reward_model", str(run.output))]
    from inference.evaluation import has_checker  # loads transformers: --help and flag errors answer first

    if args.reward_fn and not has_checker(args.data_path):  # the RL's own yardstick where the data has none
        reward += ["--reward_fn", args.reward_fn]
    data = (["--data_path", *args.data_path] if args.data_path else []) + column_flags(args)
    asked = {"--num_prompts": args.eval_prompts, "--samples_per_prompt": args.eval_samples,  # last: they win
             "--tools": args.tools}
    return [sys.executable, str(EVAL_SCRIPT), "--model_name_or_path_baseline", str(baseline),
            "--model_name_or_path_finetune", str(finetune), *reward, *data,
            "--samples_per_prompt", str(EVAL_SAMPLES_PER_PROMPT),
            "--output_json", str(Path(args.output_dir) / "evaluation.json"),
            *recipe_flags(args.actor_model, "eval", args.data_path),
            *(str(item) for flag, value in asked.items() if value is not None for item in (flag, value))]
