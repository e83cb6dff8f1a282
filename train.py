"""Run an RLHF pipeline: a table of stages per algorithm, then a side-by-side evaluation of the actor before and
after.

    python train.py                                   # PPO: SFT, reward model, PPO on the built-in default
    python train.py --algorithm dpo                   # SFT, then DPO
    python train.py --algorithm grpo --reward-fn builtin   # SFT, then critic-free RL on the task's checker
    python train.py --algorithm dpo --pair-judge builtin   # SFT, pairs of its own answers judged by the checker, DPO
    python train.py --algorithm dpo --pair-judge builtin --pair-rounds 3   # iterative DPO: 3 rounds of both
    python train.py --step 1 2 --deployment-type single_node --actor-model facebook/opt-1.3b

Each stage runs its `training/<folder>/training_scripts/<deployment>/run.sh`, which calls the `deepspeed`
launcher (the sampled pairs: one Python process); its log goes to `<output-dir>/<stage folder>/training.log`. Outputs follow DeepSpeed-Chat's layout:
`actor-models/<name>`, `reward-models/<name>`, `dpo-models/<name>`, `step3-models/<name>/{actor,critic,actor_ema}`,
and `sampled-pairs/<name>` (--pair-judge: the step-1 actor's own answers as step 2's pairs). With --pair-rounds N,
round k > 1 samples its pairs from round k - 1's DPO actor into `sampled-pairs/<name>-round<k>`; every round but the
last saves its DPO actor in `dpo-models/<name>-round<k>`, the last in `dpo-models/<name>`.
Stages keep DeepSpeed-Chat's step numbers (1 SFT; 2 reward model or DPO; 3 RL): `--step`, `--stepN-args` and the
data split's parts (step N trains on part N of `--data-split`) follow them.
"""
import argparse
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from training.recipes import recipe_flags
from utils.runtime.errors import (ArgumentParser, ConfigError, Interrupted, cli_entry, interrupt_hint,
                                  interrupts_deferred)

ROOT = Path(__file__).resolve().parent
DEFAULT_ZERO_STAGE = {"single_gpu": 0, "single_node": 2, "multi_node": 2}
LOG_TAIL_LINES = 20
# How long an interrupted step may take to finish a checkpoint and exit before it is killed (DeepSpeed's launcher
# gives its ranks 30 s after a SIGTERM).
CHILD_EXIT_TIMEOUT = 120
# Sampled answers per held-out prompt in the closing evaluation: one per prompt leaves a standard error of about
# 0.02 on a 400-prompt mean checker score, as large as the differences the evaluation is there to show.
EVAL_SAMPLES_PER_PROMPT = 4
CRITIC_FREE = ("grpo", "rloo", "reinforce_pp")


@dataclass(frozen=True)
class Stage:
    """One training stage of a pipeline."""
    step: int  # DeepSpeed-Chat's step number: --step N, --stepN-args, part N of --data-split
    folder: str  # training/<folder>/ holds main.py and training_scripts/<deployment>/run.sh ("" for a script)
    output: str  # its output folder under --output-dir (then the model's name)
    trains: str  # "actor" or "reward": the model it trains, whose name labels its output and picks its recipe;
    # "" trains nothing (labelled by the actor)
    recipes: tuple  # the keys of its flags in training/recipes.py, in order
    inputs: tuple  # the stages whose outputs it starts from
    arguments: Callable  # (args, dirs) -> run.sh's positional arguments and extra flags
    actor_subdir: str = ""  # where in its output the trained actor is ("" for the folder itself)
    script: str = ""  # a one-process Python script run instead of a run.sh (its path under the repository)


def _reward_source(args, dirs):
    return dirs["sft"] if args.reward_from_sft else args.reward_model


def _pairs_arguments(args, dirs):
    """sample_pairs.py's flags: the actor that answers (dirs["sft"]: the step-1 actor, or in a later round of
    --pair-rounds the round before's DPO actor, see `round_dirs`), the judge, the output, and the --pair-* flags
    given (after the recipe's, so they win)."""
    flags = ["--model_name_or_path", dirs["sft"], "--reward_fn", args.pair_judge, "--output_dir", dirs["pairs"]]
    given = {"--samples_per_prompt": args.pair_samples, "--temperature": args.pair_temperature,
             "--max_prompts": args.pair_prompts}
    return flags + [item for flag, value in given.items() if value is not None for item in (flag, value)]


def _rl_arguments(args, dirs):
    flags = ["--advantage_estimator", args.algorithm] + (["--reward_fn", args.reward_fn] if args.reward_fn else [])
    return [dirs["sft"], dirs.get("reward", ""), args.actor_zero_stage, args.reward_zero_stage, dirs["rl"], *flags]


STAGES = {
    "sft": Stage(1, "step1_supervised_finetuning", "actor-models", "actor", (1,), (),
                 lambda args, dirs: [dirs["sft"], args.actor_zero_stage, args.actor_model]),
    "pairs": Stage(2, "", "sampled-pairs", "", ("pairs",), ("sft",), _pairs_arguments,
                   script="inference/sample_pairs.py"),
    "reward": Stage(2, "step2_reward_model_finetuning", "reward-models", "reward", (2,), ("sft",),
                    lambda args, dirs: [dirs["reward"], args.reward_zero_stage, _reward_source(args, dirs)]),
    "dpo": Stage(2, "step2_dpo_finetuning", "dpo-models", "actor", ("dpo",), ("sft",),
                 lambda args, dirs: [dirs["dpo"], args.actor_zero_stage, dirs["sft"]]),
    "ppo": Stage(3, "step3_rlhf_finetuning", "step3-models", "actor", (3,), ("sft", "reward"),
                 lambda args, dirs: [dirs["sft"], dirs["reward"], args.actor_zero_stage, args.reward_zero_stage,
                                     dirs["ppo"]], actor_subdir="actor"),
    "rl": Stage(3, "step3_rlhf_finetuning", "step3-models", "actor", (3, "grpo"), ("sft", "reward"), _rl_arguments,
                actor_subdir="actor"),
}
ALGORITHMS = {"ppo": ("sft", "reward", "ppo"), "dpo": ("sft", "dpo"),
              **{name: ("sft", "reward", "rl") for name in CRITIC_FREE}}


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", choices=tuple(ALGORITHMS), default="ppo",
                        help="ppo: SFT, reward model, PPO with a critic; dpo: SFT, then DPO; grpo, rloo, "
                             "reinforce_pp: SFT, a reward model unless --reward-fn is given, then critic-free RL.")
    parser.add_argument("--reward-fn", default=None,
                        help="Critic-free RL's reward from a program instead of a reward model: builtin (the "
                             "built-in task's checker), reasoning_gym, or package.module:function.")
    parser.add_argument("--pair-judge", default=None, metavar="FN",
                        help="Step 2's pairs (reward model or DPO) come from the step-1 actor's own sampled answers "
                             "to part 2's prompts, judged by the reward function FN (builtin, reasoning_gym, or "
                             "package.module:function): the best-scored answer is chosen, the worst rejected "
                             "(inference/sample_pairs.py, into <output-dir>/sampled-pairs/<actor>/, run as the "
                             "first stage of step 2).")
    parser.add_argument("--pair-samples", type=int, default=None,
                        help="--pair-judge: answers sampled per prompt, the best and worst of which make a pair "
                             "(default: the recipe's, else 4).")
    parser.add_argument("--pair-temperature", type=float, default=None,
                        help="--pair-judge: the sampling temperature (default: the recipe's, else 1.0, as step 3 "
                             "samples).")
    parser.add_argument("--pair-prompts", type=int, default=None,
                        help="--pair-judge: at most this many prompts of each split's part 2 (default: the "
                             "recipe's, else all).")
    parser.add_argument("--pair-rounds", type=int, default=1,
                        help="--algorithm dpo --pair-judge: iterative DPO, N rounds of sampling pairs from the "
                             "latest DPO actor (the step-1 actor in round 1) and training DPO on them from it, with "
                             "it as the reference (default 1).")
    parser.add_argument("--step", type=int, nargs="+", choices=(1, 2, 3), default=[1, 2, 3],
                        help="Which of the algorithm's steps to run (1 SFT; 2 reward model or DPO; 3 RL).")
    parser.add_argument("--deployment-type", choices=tuple(DEFAULT_ZERO_STAGE), default="single_gpu",
                        help="Which training_scripts/<type>/run.sh launches each step: single_gpu (one process), "
                             "single_node (every GPU of this machine; 2 CPU processes without one), multi_node "
                             "(the hosts of --hostfile). Default single_gpu.")
    parser.add_argument("--actor-model", default="tiny", help="Base model of the actor: built-in name, hub name "
                                                              "or folder.")
    parser.add_argument("--reward-model", default="tiny", help="Base model of the reward model and critic.")
    parser.add_argument("--reward-from-sft", action=argparse.BooleanOptionalAction, default=None,
                        help="Start the step-2 reward model from the step-1 actor's weights, as InstructGPT does, "
                             "rather than from --reward-model's (default: when --reward-model is --actor-model).")
    parser.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=None,
                        help="ZeRO stage of every model (default: 0 for single_gpu, 2 otherwise).")
    parser.add_argument("--actor-zero-stage", type=int, choices=(0, 1, 2, 3), default=None,
                        help="ZeRO stage of the actor and its frozen copies (default: --zero-stage).")
    parser.add_argument("--reward-zero-stage", type=int, choices=(0, 1, 2, 3), default=None,
                        help="ZeRO stage of the reward model and critic (default: --zero-stage).")
    parser.add_argument("--data-path", nargs="+", default=None,
                        help="The data of every stage (each stage's own default: builtin); see the README's Data.")
    parser.add_argument("--data-split", default=None,
                        help="Every stage's --data_split (default 2,4,4: step N trains on part N).")
    parser.add_argument("--seed", type=int, default=None, help="Every stage's --seed (each stage's default: 1234).")
    parser.add_argument("--output-dir", default="./output",
                        help="Where every step's model, log and the evaluation go, in DeepSpeed-Chat's layout "
                             "(<output-dir>/actor-models/..., reward-models/...); default ./output.")
    parser.add_argument("--hostfile", default=None, help="multi_node: the DeepSpeed hostfile.")
    for step in (1, 2, 3):
        parser.add_argument(f"--step{step}-args", default="",
                            help=f"Extra flags for step {step}'s main.py (quoted), after the recipe's and the "
                                 "pipeline-wide ones, so they win.")
    parser.add_argument("--save-steps", type=int, default=0,
                        help="Each step saves a resumable checkpoint every N optimizer steps (step 3: prompt "
                             "batches) and at its end, under <its output folder>/checkpoints/ (0: none).")
    parser.add_argument("--resume", action="store_true",
                        help="Each step resumes from its latest complete checkpoint (a step without one starts over).")
    parser.add_argument("--overwrite-output-dir", action="store_true",
                        help="Each step starts over in a folder holding an earlier run's checkpoints, deleting them "
                             "(without it, or --resume, a step refuses such a folder).")
    parser.add_argument("--no-eval", action="store_true", help="Skip the side-by-side evaluation at the end.")
    parser.add_argument("--dry-run", action="store_true", help="Print the launcher commands, run nothing.")
    args = parser.parse_args(argv)
    args.step = sorted(set(args.step))
    if args.reward_fn and args.algorithm not in CRITIC_FREE:
        raise ConfigError(f"--reward-fn needs a critic-free --algorithm ({', '.join(CRITIC_FREE)}), not "
                          f"{args.algorithm}")
    pair_flags = [flag for flag in ("pair_samples", "pair_temperature", "pair_prompts")
                  if getattr(args, flag) is not None]
    if pair_flags and not args.pair_judge:
        raise ConfigError(f"--{pair_flags[0].replace('_', '-')} sets how --pair-judge samples; it needs --pair-judge")
    if args.pair_samples is not None and args.pair_samples < 2:
        raise ConfigError(f"--pair-samples must be at least 2 (a pair is the best and the worst of them), not "
                          f"{args.pair_samples}")
    if args.pair_temperature is not None and not 0 < args.pair_temperature < float("inf"):
        raise ConfigError(f"--pair-temperature must be a positive number, not {args.pair_temperature}")
    if args.pair_prompts is not None and args.pair_prompts < 1:
        raise ConfigError(f"--pair-prompts must be at least 1, not {args.pair_prompts}")
    if args.pair_judge and "reward" not in ALGORITHMS[args.algorithm] and "dpo" not in ALGORITHMS[args.algorithm]:
        raise ConfigError(f"--pair-judge makes step 2's pairs, but --algorithm {args.algorithm} has no step 2")
    if args.pair_rounds < 1:
        raise ConfigError(f"--pair-rounds must be at least 1, not {args.pair_rounds}")
    if args.pair_rounds > 1 and not (args.pair_judge and args.algorithm == "dpo"):
        raise ConfigError("--pair-rounds repeats --pair-judge's sampling and DPO: it needs --algorithm dpo and "
                          "--pair-judge")
    if args.pair_judge and args.reward_fn:
        raise ConfigError("--pair-judge makes the reward model's pairs, but with --reward-fn there is no reward "
                          "model; pass one of them")
    stage = DEFAULT_ZERO_STAGE[args.deployment_type] if args.zero_stage is None else args.zero_stage
    args.actor_zero_stage = stage if args.actor_zero_stage is None else args.actor_zero_stage
    args.reward_zero_stage = stage if args.reward_zero_stage is None else args.reward_zero_stage
    if args.reward_from_sft is None:
        args.reward_from_sft = args.reward_model == args.actor_model
    flags_of_step = {}
    for step in (1, 2, 3):
        try:
            flags_of_step[step] = shlex.split(getattr(args, f"step{step}_args"))
        except ValueError as err:  # an unclosed quote
            raise ConfigError(f"--step{step}-args {getattr(args, f'step{step}_args')!r}: {err}") from None
    step_flags = [flag for flags in flags_of_step.values() for flag in flags]
    if args.pair_rounds > 1:  # every round's DPO gets --step2-args: these would cut the chain of rounds
        chained = [flag for flag in ("--model_name_or_path", "--output_dir", "--data_path")
                   if flag in flags_of_step[2]]
        if chained:
            raise ConfigError(f"--step2-args {chained[0]}: with --pair-rounds train.py sets it for each round (its "
                              "start, its output, its pairs)")
    if "--data_path" not in step_flags:  # else the steps' own data decides what reasoning_gym scores
        from utils.rl.reward_fns import check_reward_fn

        for flag, spec in (("--reward-fn", args.reward_fn), ("--pair-judge", args.pair_judge)):
            if spec:
                check_reward_fn(spec, args.data_path, flag)
    return args


def pipeline(args):
    """The algorithm's stages, in order (critic-free RL with a reward function needs no reward model; data without
    reference answers has nothing for step 1 to imitate; with --pair-judge the sampled pairs come first in step
    2, and --pair-rounds repeats them and DPO: round k's are "pairs@k" and "dpo@k")."""
    names = ALGORITHMS[args.algorithm]
    if args.reward_fn:
        names = tuple(name for name in names if name != "reward")
    if not has_reference_answers(tuple(args.data_path or ())):
        names = tuple(name for name in names if name != "sft")
    if args.pair_judge:
        first = next(i for i, name in enumerate(names) if STAGES[name].step == 2)
        names = (*names[:first], "pairs", *names[first:])
        names += tuple(round_name(stage, k) for k in range(2, args.pair_rounds + 1) for stage in ("pairs", "dpo"))
    return names


def round_name(stage, k):
    """The pipeline's name of round k of --pair-rounds' stage ("pairs" or "dpo"): round 1 is the stage itself."""
    return stage if k == 1 else f"{stage}@{k}"


def stage_round(name):
    """Which round of --pair-rounds a pipeline entry is (1 for every stage outside them)."""
    return int(name.partition("@")[2] or 1)


def stage_base(name):
    """The STAGES name of a pipeline entry: a later round ("dpo@2") runs as its stage ("dpo") does."""
    return name.partition("@")[0]


def stage_spec(name):
    """The Stage of a pipeline entry (see `stage_base`)."""
    return STAGES[stage_base(name)]


@functools.lru_cache(maxsize=None)
def has_reference_answers(data_paths):
    """Whether the data has answers to imitate: False for prompts alone (a local file of questions, reasoning-gym
    tasks that any valid solution answers, such as graph_color). Hub data sets, whose reading needs the network,
    and the built-in task have them. A path that is neither a known name nor an existing file or folder is refused
    here, before any step starts."""
    from utils.data.data_utils import get_raw_dataset
    from utils.data.raw_datasets import HUB_DATASETS
    from utils.runtime.errors import DataError

    def read(path):
        try:
            return get_raw_dataset(path, seed=1234)
        except DataError as err:
            raise DataError(f"--data-path: {err}") from None

    def answered(raw):
        try:
            return any(raw.get_chosen(row) is not None for row in raw.get_train_data())
        except DataError:  # a reasoning-gym spec none of whose tasks has reference answers
            return False

    paths = data_paths or ("builtin",)
    readable = [read(path) for path in paths if path not in HUB_DATASETS and path != "builtin"]
    return len(readable) < len(paths) or any(answered(raw) for raw in readable)


def model_label(model):
    """The folder name of a model's outputs: `facebook/opt-1.3b` -> `opt-1.3b`, `./my/model/` -> `model`."""
    return Path(model.rstrip("/")).name or "model"


def stage_model(args, stage):
    return args.reward_model if stage_spec(stage).trains == "reward" else args.actor_model


def output_dirs(args):
    """Every stage of the pipeline -> its output folder; "sft" is the base model where step 1 does not run for
    want of reference answers (the later steps start from it)."""
    dirs = {name: Path(args.output_dir) / stage_spec(name).output / (model_label(stage_model(args, name))
                                                                    + round_suffix(args, name))
            for name in pipeline(args)}
    dirs.setdefault("sft", args.actor_model)
    return dirs


def round_suffix(args, name):
    """The output folder's suffix of a round of --pair-rounds: `-round<k>` for the pairs of round k > 1 and for the
    DPO actor of every round but the last, which goes where a single round's does."""
    k, base = stage_round(name), stage_base(name)
    return f"-round{k}" if (base == "pairs" and k > 1) or (base == "dpo" and k < args.pair_rounds) else ""


def round_dirs(dirs, stage):
    """`dirs` as `stage` sees them: a stage of round k > 1 of --pair-rounds starts from round k - 1's DPO actor
    (where round 1 starts from the step-1 actor), and its "pairs" and "dpo" are its round's."""
    k = stage_round(stage)
    if k == 1:
        return dirs
    return {**dirs, "sft": dirs[round_name("dpo", k - 1)], "pairs": dirs[round_name("pairs", k)],
            "dpo": dirs[round_name("dpo", k)]}


def pipeline_flags(args):
    """The flags every training stage gets from train.py: TensorBoard, checkpoints, the shared data and seed
    settings."""
    # Every stage logs under one TensorBoard folder: `tensorboard --logdir <output-dir>/tensorboard`.
    flags = ["--enable_tensorboard", "--tensorboard_path", str(Path(args.output_dir) / "tensorboard")]
    flags += ["--save_steps", str(args.save_steps)] if args.save_steps else []
    flags += ["--overwrite_output_dir"] if args.overwrite_output_dir else []
    return flags + script_flags(args)


def script_flags(args):
    """The flags every stage gets, scripts included: --resume, the shared data and seed settings."""
    flags = ["--resume"] if args.resume else []
    flags += ["--data_path", *args.data_path] if args.data_path else []
    flags += ["--data_split", args.data_split] if args.data_split else []
    flags += ["--seed", str(args.seed)] if args.seed is not None else []
    return flags


def pairs_data_flags(args, stage, dirs):
    """Step 2's data when --pair-judge made it: the whole pairs folder (its part 2 under PAIRS_DATA_SPLIT)."""
    from utils.data.sampled_pairs import PAIRS_DATA_SPLIT

    if "pairs" not in dirs or stage_spec(stage).step != 2 or stage_base(stage) == "pairs":
        return []
    return ["--data_path", str(dirs["pairs"]), "--data_split", PAIRS_DATA_SPLIT]


def stage_recipes(args, stage):
    """The recipe keys of `stage`: its Stage's, then for DPO on the actor's judged answers (--pair-judge)
    "dpo_pairs" (the settings that differ from DPO on a data set's pairs)."""
    return stage_spec(stage).recipes + (("dpo_pairs",) if args.pair_judge and stage_base(stage) == "dpo" else ())


def step_command(args, stage, dirs):
    """The `bash run.sh ...` command of one stage: positional arguments, recipe, pipeline-wide flags, step 2's
    sampled pairs, then the user's --stepN-args (last, so they win). A script stage is `python <script> <its
    recipe> <its flags> <script_flags>` (its flags from train.py's own, after the recipe's so they win)."""
    spec = stage_spec(stage)
    dirs = round_dirs(dirs, stage)
    positional = spec.arguments(args, dirs)
    recipe = [flag for key in stage_recipes(args, stage) for flag in recipe_flags(stage_model(args, stage), key,
                                                                                   args.data_path)]
    if spec.script:
        return [sys.executable, str(ROOT / spec.script), *recipe, *map(str, positional), *script_flags(args)]
    script = ROOT / "training" / spec.folder / "training_scripts" / args.deployment_type / "run.sh"
    extra = shlex.split(getattr(args, f"step{spec.step}_args"))
    return ["bash", str(script), *map(str, positional), *recipe, *pipeline_flags(args),
            *pairs_data_flags(args, stage, dirs), *extra]


def stage_env():
    """The environment of every stage and of the evaluation. PYTHONHASHSEED is fixed (unless the user set it) so
    that data generators iterating over Python sets (a few reasoning-gym tasks) make the same questions in every
    process: the verifier of step 3 and of the evaluation must find the questions the data set made. PYTHON is
    this interpreter, for training/launch.sh."""
    # The `deepspeed` launcher of this interpreter's environment first, whatever PATH holds (a venv's python run by
    # its full path has its bin/ off PATH).
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {"PYTHONHASHSEED": "0", **os.environ, "PYTHONUNBUFFERED": "1", "PATH": path, "PYTHON": sys.executable}


def run_stage(args, stage, command, out_dir):
    """Run one stage with its output in `out_dir/training.log`; return its wall time, or None on failure."""
    spec = stage_spec(stage)
    step = spec.step
    env = stage_env()
    if args.hostfile:
        env["HOSTFILE"] = args.hostfile
    if args.dry_run and spec.script:
        print(shlex.join(command))
        return 0.0
    if args.dry_run:
        env["DRY_RUN"] = "1"
        print(subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout.strip())
        return 0.0
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "training.log"
    print(f"---- step {step} ({stage}): {spec.folder or spec.script} -> {out_dir} (log: "
          f"{log_path})", flush=True)
    interrupt_hint(f"step {step} stopped (its log: {log_path}); resume with --resume")
    start = time.time()
    with open(log_path, "a" if args.resume else "w") as log:  # a resumed step's log continues
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        returncode = run_child(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    elapsed = time.time() - start
    if returncode != 0:
        print(f"step {step} FAILED after {elapsed:.0f} s (exit {returncode}); last lines of {log_path}:")
        lines = log_path.read_text(errors="replace").splitlines()
        errors = [line for line in lines if line.startswith("error: ")]
        print("\n".join("    " + line for line in lines[-LOG_TAIL_LINES:]), flush=True)
        last = next((line.strip() for line in reversed(lines) if line.strip()), "nothing")
        cause = errors[-1][len("error: "):] if errors else f"exit {returncode}, its log {log_path} ends: {last}"
        print(f"error: step {step} failed: {cause}; re-run this step alone with --step {step}", file=sys.stderr,
              flush=True)
        return None
    print(f"step {step} done in {elapsed:.1f} s", flush=True)
    return elapsed


def run_child(command, **popen_kwargs):
    """Run `command` in a process group of its own and return its exit code. On SIGINT or SIGTERM the signal is
    passed on to the whole group (the launcher and every rank, which finish or discard a checkpoint in progress
    and exit) and awaited, so no step trains on as an orphan; then the interruption goes on up."""
    process = subprocess.Popen(command, start_new_session=True, **popen_kwargs)
    try:
        return process.wait()
    except Interrupted as stop:
        with interrupts_deferred():
            os.killpg(process.pid, stop.signum)
            process.wait()
            if not wait_for_group(process.pid, CHILD_EXIT_TIMEOUT):  # the launcher outlives the `bash run.sh`
                os.killpg(process.pid, signal.SIGKILL)
        raise


def wait_for_group(pgid, timeout):
    """Wait until no live process is left in the process group `pgid`; False if some still are after `timeout`
    seconds."""
    import psutil

    deadline = time.time() + timeout
    while time.time() < deadline:
        alive = []
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except (psutil.Error, OSError):
                continue
        if not alive:
            return True
        time.sleep(0.2)
    return False


def actor_dir(args, dirs, stage):
    """Where `stage` saves the actor it trains: for step 3 with --enable_ema (given or from the recipe), the moving
    average of its weights (`actor_ema`), which DeepSpeed-Chat recommends as the better model; the evaluation
    compares that one."""
    folder = dirs[stage] / stage_spec(stage).actor_subdir
    if stage_spec(stage).actor_subdir and "--enable_ema" in step_command(args, stage, dirs):
        return folder.with_name(folder.name + "_ema")
    return folder


def evaluation_command(args, stages, dirs):
    """Compare the actor before and after the last trained stage on the held-out prompts: the step-1 actor against
    the final actor (`actor_dir`), or the base model against the step-1 actor when only step 1 runs."""
    trained = [name for name in stages if stage_spec(name).trains == "actor"]
    if not trained:
        return None
    if trained[-1] == "sft":
        baseline, finetune = args.actor_model, dirs["sft"]
    else:
        baseline, finetune = dirs["sft"], actor_dir(args, dirs, trained[-1])
    reward = ["--reward_model", str(dirs["reward"])] if "reward" in dirs and trained[-1] != "sft" else []
    from inference.evaluation import has_checker

    if args.reward_fn and not has_checker(args.data_path):  # the RL's own yardstick where the data has none
        reward += ["--reward_fn", args.reward_fn]
    data = ["--data_path", *args.data_path] if args.data_path else []
    script = ROOT / "training" / STAGES["sft"].folder / "prompt_eval.py"
    return [sys.executable, str(script), "--model_name_or_path_baseline", str(baseline),
            "--model_name_or_path_finetune", str(finetune), *reward, *data,
            "--samples_per_prompt", str(EVAL_SAMPLES_PER_PROMPT),
            "--output_json", str(Path(args.output_dir) / "evaluation.json"),
            *recipe_flags(args.actor_model, "eval", args.data_path)]


def stage_inputs(args, stage):
    """The stages whose outputs `stage` starts from in this pipeline (a later round of --pair-rounds: the round
    before's DPO actor)."""
    if stage_round(stage) > 1:
        return [round_name("dpo", stage_round(stage) - 1)]
    inputs = [name for name in STAGES[stage].inputs if name in pipeline(args)]
    if stage == "reward" and not args.reward_from_sft:
        inputs.remove("sft")
    return inputs


def check_inputs(args, stages, dirs):
    """What the stages will need and cannot make themselves, refused before anything is launched or written."""
    from utils.model.model_utils import is_reward_model_folder

    if args.deployment_type == "multi_node":
        hostfile = args.hostfile or "/job/hostfile"
        if Path(hostfile).is_dir():
            raise ConfigError(f"--hostfile {hostfile} is a folder, not a DeepSpeed hostfile")
        if not Path(hostfile).is_file():
            raise ConfigError(f"--hostfile {hostfile} does not exist (multi_node runs the hosts of a DeepSpeed "
                              "hostfile)")
    for stage in stages:
        step = stage_spec(stage).step
        for earlier in stage_inputs(args, stage):
            if earlier in stages:  # made by this run before it is needed
                continue
            folder, is_reward = dirs[earlier], earlier == "reward"
            what = "step-2 reward model" if is_reward else "step-1 actor"
            if not (folder / "config.json").is_file():
                why = " (--reward-from-sft)" if stage == "reward" else ""
                raise ConfigError(f"--step {step}{why} needs the {what} {folder}, which does not exist: run --step "
                                  f"{stage_spec(earlier).step} first (with the same --output-dir and models)")
            if is_reward_model_folder(folder) != is_reward:
                raise ConfigError(f"--step {step} needs the {what} in {folder}, but it holds a "
                                  f"{'causal language model' if is_reward else 'reward model'}")


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    interrupt_hint("resume with --resume")
    dirs = output_dirs(args)
    stages = [name for name in pipeline(args) if stage_spec(name).step in args.step]
    if "sft" not in pipeline(args):
        print(f"step 1 skipped: {' '.join(args.data_path)} has no reference answers to imitate; later steps start "
              f"from {args.actor_model}", flush=True)
    if not stages:
        raise ConfigError(f"--step {' '.join(map(str, args.step))}: nothing to run for --algorithm {args.algorithm}")
    if not args.dry_run:
        check_inputs(args, stages, dirs)
    wall_times = {}
    for stage in stages:
        wall_times[stage] = run_stage(args, stage, step_command(args, stage, dirs), dirs[stage])
        if wall_times[stage] is None:
            return 1
    command = None if args.no_eval else evaluation_command(args, stages, dirs)
    if args.dry_run:
        if command:
            print(shlex.join(command))
        return 0
    if command:
        print("---- evaluation: " + shlex.join(command), flush=True)
        start = time.time()
        if run_child(command, env=stage_env()) != 0:
            return 1
        wall_times["evaluation"] = time.time() - start
    write_report(args, dirs, wall_times, None if command is None else Path(args.output_dir) / "evaluation.json")
    return 0


def write_report(args, dirs, wall_times, evaluation_path):
    """Print the run's table and keep it as <output-dir>/report.md."""
    from utils.trainer.report import pipeline_report

    evaluation = None
    if evaluation_path is not None and evaluation_path.is_file():
        evaluation = json.loads(evaluation_path.read_text())
    command = shlex.join(["python", "train.py", *(sys.argv[1:])])
    report = pipeline_report({name: dirs[name] for name in pipeline(args)}, wall_times, evaluation, command)
    (Path(args.output_dir) / "report.md").write_text(report)
    print(f"---- report ({Path(args.output_dir) / 'report.md'})\n{report}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
