"""Run an RLHF pipeline: the stages of an algorithm (training/pipeline.py), then a side-by-side evaluation of the
actor before and after.

    python train.py                                   # PPO: SFT, a reward model on its judged answers, PPO
    python train.py --algorithm dpo                   # SFT, then 4 rounds of DPO on its own judged answers
    python train.py --algorithm dpo --pair-judge none # SFT, then DPO on the data set's own pairs
    python train.py --algorithm grpo                  # SFT, then critic-free RL on the task's checker
    python train.py --algorithm grpo --reward-fn none # SFT, reward model, then critic-free RL on it
    python train.py --step 1 2 --deployment-type single_node --actor-model facebook/opt-1.3b

Where the data has a checker (the built-in task, reasoning-gym tasks) and none of --pair-judge, --reward-fn and
--answer-filter is given, an algorithm takes its best measured recipe on it (`with_checker` in
training/pipeline.py), and says so.
Each stage runs its `training/<folder>/training_scripts/<deployment>/run.sh`, which calls the `deepspeed`
launcher with the flags it is given (the sampled pairs: one Python process); its log goes to
`<output-dir>/<stage folder>/training.log`, and its lines about data or steps it left out (WARNING lines, skipped
counts) are printed after it. Outputs follow DeepSpeed-Chat's layout: `actor-models/<name>`,
`reward-models/<name>`, `dpo-models/<name>`, `step3-models/<name>/{actor,critic,actor_ema}`, and
`sampled-pairs/<name>` (--pair-judge: the step-1 actor's own answers as step 2's pairs). With --pair-rounds N,
round k > 1 samples its pairs from round k - 1's DPO actor into `sampled-pairs/<name>-round<k>`; every round but the
last saves its DPO actor in `dpo-models/<name>-round<k>`, the last in `dpo-models/<name>`.
Stages keep DeepSpeed-Chat's step numbers (1 SFT; 2 reward model or DPO; 3 RL): `--step`, `--stepN-args` and the
data split's parts (step N trains on part N of `--data-split`) follow them.
"""
import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from training.pipeline import (ALGORITHMS, STAGES, check_data_split, check_round_flags, check_step_flags,
                               checker_defaults, closing_answers, evaluation_command, evaluation_prompts,
                               fit_evaluation, has_step3, plan, run_inputs, step_command, train_recipe)
from utils.data.data_utils import check_columns_apply, parse_data_split
from utils.runtime.args import add_column_args, check_flag_ranges, column_keys, registry_help
from utils.runtime.errors import (ArgumentParser, ConfigError, Interrupted, cli_entry, interrupt_hint,
                                  interrupts_deferred)
from utils.runtime.paths import FolderLock
from utils.runtime.sandbox import TOOLS
from utils.runtime.trackers import NONE, TRACKERS, check_run_group, resolve_report_to

DEFAULT_ZERO_STAGE = {"single_gpu": 0, "single_node": 2, "multi_node": 2}
LOG_TAIL_LINES = 20
# The lines of a stage's log that say it left data or steps out (its WARNING lines; a data set's "(skipped: ...)"
# counts; the sampled pairs' "N skipped" counts): train.py prints them after the stage, so they are seen without
# opening the log.
DATA_NOTICE = re.compile(r"^WARNING: |\(skipped: | [1-9][0-9]* skipped ")
# How long an interrupted step may take to finish a checkpoint and exit before it is killed (DeepSpeed's launcher
# gives its ranks 30 s after a SIGTERM).
CHILD_EXIT_TIMEOUT = 120
RUN_GROUP_FILE = "run_group"
"""Under --output-dir: the pipeline's group of tracker runs, which --resume goes on in."""


def build_parser():
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", choices=tuple(ALGORITHMS), default="ppo",
                        help="; ".join(f"{name}: {row.help}" for name, row in ALGORITHMS.items()) + ".")
    parser.add_argument("--reward-fn", default=None,
                        help="Critic-free RL's reward from a program instead of a reward model: builtin (the "
                             "built-in task's checker), reasoning_gym, or package.module:function (default: the "
                             "data's checker where it has one; none: a step-2 reward model).")
    parser.add_argument("--pair-judge", default=None, metavar="FN",
                        help="Step 2's pairs (reward model or DPO) come from the step-1 actor's own sampled answers "
                             "to part 2's prompts, judged by the reward function FN (builtin, reasoning_gym, or "
                             "package.module:function): the best-scored answer is chosen, the worst rejected "
                             "(inference/sample_pairs.py, into <output-dir>/sampled-pairs/<actor>/, run as the "
                             "first stage of step 2). Default for --algorithm dpo: the data's checker where it has "
                             "one (none: the data set's own pairs).")
    parser.add_argument("--answer-filter", default=None, metavar="FN",
                        help="Steps 1 and 2 train only on the data's rows whose chosen answer the reward function "
                             "FN gives full marks (and, in pairs, whose rejected answer it scores lower): their "
                             "--answer_filter_fn. Default for --algorithm orpo: the data's checker where it has one "
                             "(none: every row).")
    parser.add_argument("--pair-samples", type=int, default=None,
                        help="--pair-judge: answers sampled per prompt, the best and worst of which make a pair "
                             "(default: the recipe's, else 4).")
    parser.add_argument("--pair-temperature", type=float, default=None,
                        help="--pair-judge: the sampling temperature (default: the recipe's, else 1.0, as step 3 "
                             "samples).")
    parser.add_argument("--pair-prompts", type=int, default=None,
                        help="--pair-judge: at most this many prompts of each split's part 2 (default: the "
                             "recipe's, else all).")
    parser.add_argument("--pair-rounds", type=int, default=None,
                        help="--algorithm dpo --pair-judge: iterative DPO, N rounds of sampling pairs from the "
                             "latest DPO actor (the step-1 actor in round 1) and training DPO on them from it, with "
                             "it as the reference (default 1; 4 with the data's checker as the default judge).")
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
                        help="Every stage's --data_split (default 2,4,4: step N trains on part N; on your own data the "
                             "parts of steps that do not run go to those that do, e.g. 2,4,0 for DPO).")
    parser.add_argument("--seed", type=int, default=None, help="Every stage's --seed (each stage's default: 1234).")
    add_column_args(parser, dashes=True, description=(
        "Which columns of --data-path's local files, hub data sets or save_to_disk folders hold the fields of the row "
        "shapes, for every stage and the evaluation (the steps' --prompt_key ...; default: the field's own name)."))
    parser.add_argument("--output-dir", default="./output",
                        help="Where every step's model, log and the evaluation go, in DeepSpeed-Chat's layout "
                             "(<output-dir>/actor-models/..., reward-models/...); default ./output.")
    parser.add_argument("--hostfile", default=None, help="multi_node: the DeepSpeed hostfile.")
    parser.add_argument("--step1-args", default="",
                        help="Extra flags for step 1's main.py (quoted), after the recipe's and the pipeline-wide "
                             "ones, so they win.")
    parser.add_argument("--step2-args", default="",
                        help="Extra flags for step 2's main.py (quoted), after the recipe's and the pipeline-wide "
                             "ones, so they win.")
    parser.add_argument("--step3-args", default="",
                        help="Extra flags for step 3's main.py (quoted), after the recipe's and the pipeline-wide "
                             "ones, so they win.")
    parser.add_argument("--save-steps", type=int, default=0,
                        help="Each step saves a resumable checkpoint every N optimizer steps (step 3: prompt "
                             "batches) and at its end, under <its output folder>/checkpoints/ (0: none).")
    parser.add_argument("--resume", action="store_true",
                        help="Each step resumes from its latest complete checkpoint (a step without one starts over).")
    parser.add_argument("--overwrite-output-dir", action="store_true",
                        help="Each step starts over in a folder holding an earlier run's checkpoints, deleting them "
                             "(without it, or --resume, a step refuses such a folder).")
    parser.add_argument("--report-to", nargs="+", choices=(*TRACKERS, NONE), default=["tensorboard"],
                        metavar="TRACKER",
                        help=f"Every stage's --report_to, one or more of {', '.join(TRACKERS)} (under "
                             f"<output-dir>/tensorboard, wandb, mlruns; W&B offline), or {NONE}; the stages' W&B "
                             "and MLflow runs are grouped as one pipeline (utils/runtime/trackers.py). Default "
                             "tensorboard.")
    parser.add_argument("--time-budget", type=float, default=None, metavar="MINUTES",
                        help="The whole command's wall time: step 3's RL trains until the time left is what saving "
                             "and the closing evaluation need, estimated from its own setup and held-out "
                             "evaluations (its --deadline; the earlier steps keep their own budgets). Default: the "
                             "recipe's (27 for smollm2-135m on reasoning-gym data, or on other data with "
                             "--reward-fn), else none; 0: none.")
    parser.add_argument("--no-eval", action="store_true", help="Skip the side-by-side evaluation at the end.")
    parser.add_argument("--eval-prompts", type=int, default=None,
                        help="The closing evaluation answers the first N held-out prompts (prompt_eval.py's "
                             "--num_prompts; default: the recipe's, else all).")
    parser.add_argument("--eval-samples", type=int, default=None,
                        help="The closing evaluation samples K answers per prompt (prompt_eval.py's "
                             "--samples_per_prompt; default: the recipe's, else 4).")
    parser.add_argument("--tools", default=None, choices=tuple(TOOLS),
                        help="RL's actor may call this tool in its answers (step 3's --tools: multi-turn rollouts, "
                             "inference/tool_rollout.py), and the closing evaluation scores both actors with and "
                             "without it. Step 1 learns the calls from a reasoning-gym spec with tool_traces=python. "
                             + registry_help(TOOLS, "utils/runtime/sandbox.py"))
    parser.add_argument("--dry-run", action="store_true", help="Print the launcher commands, run nothing.")
    return parser


def step_flags(args):
    """{step: the flags of its --stepN-args, split as a shell would}."""
    flags = {}
    for step in (1, 2, 3):
        try:
            flags[step] = shlex.split(getattr(args, f"step{step}_args"))
        except ValueError as err:  # an unclosed quote
            raise ConfigError(f"--step{step}-args {getattr(args, f'step{step}_args')!r}: {err}") from None
    return flags


STEP_ARGS = ("--step1-args", "--step2-args", "--step3-args")


def joined_step_args(argv):
    """argv with each `--stepN-args VALUE` written `--stepN-args=VALUE`, so that a value that is one flag alone
    (`--step3-args --enable_ema`) is that flag's value rather than an option argparse does not know."""
    joined, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        joined.append(f"{arg}={rest.pop(0)}" if arg in STEP_ARGS and rest else arg)
    return joined


def parse_args(argv=None):
    parser = build_parser()
    argv = joined_step_args(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    # A step's own --data_path: that data decides what a reward function scores, not --data-path.
    data_set_by_step = any(flag.startswith("--data_path") for flags in step_flags(args).values() for flag in flags)
    defaults = checker_defaults(args, data_set_by_step)
    if defaults:
        given = {arg.split("=")[0] for arg in argv if arg.startswith("--")}  # the user's own win: not said as taken
        taken = [part for flag, value in zip(defaults[::2], defaults[1::2]) if flag not in given
                 for part in (flag, value)]
        print(f"--algorithm {args.algorithm} takes {shlex.join(taken)} by default on data with a checker (the "
              f"best measured recipe); {defaults[0]} none opts out", flush=True)
    recipe = train_recipe(args) if args.time_budget is None else []
    if recipe:
        print(f"the recipe of {args.actor_model} on this data takes {shlex.join(recipe)} (minutes for the whole "
              f"command: step 3 trains until what is left is what saving and the evaluation need); "
              f"{recipe[0]} 0 opts out", flush=True)
    if defaults or recipe:
        args = parser.parse_args([*recipe, *defaults, *argv])  # the user's own flags come after, so they win
    args.deadline = time.time() + 60 * args.time_budget if args.time_budget else None  # step 3's --deadline
    # main: the closing evaluation's answers and its greedy ones, reserved in step 3 before the deadline
    args.reserve_answers = args.reserve_greedy_answers = None
    args.pair_judge, args.reward_fn, args.answer_filter = (None if spec == "none" else spec for spec in
                                                           (args.pair_judge, args.reward_fn, args.answer_filter))
    args.pair_rounds = 1 if args.pair_rounds is None else args.pair_rounds
    args.step = sorted(set(args.step))
    check_args(args)
    stage = DEFAULT_ZERO_STAGE[args.deployment_type] if args.zero_stage is None else args.zero_stage
    args.actor_zero_stage = stage if args.actor_zero_stage is None else args.actor_zero_stage
    args.reward_zero_stage = stage if args.reward_zero_stage is None else args.reward_zero_stage
    if args.reward_from_sft is None:
        args.reward_from_sft = args.reward_model == args.actor_model
    args.report_to = resolve_report_to(args.report_to, flag="--report-to")
    args.run_group = run_group(args) if any(TRACKERS[name].grouped for name in args.report_to) else None
    if not data_set_by_step:  # else the steps' own data decides what reasoning_gym scores
        from utils.rl.reward_fns import check_reward_fn  # loads datasets: --help and flag errors answer first

        for flag, spec in (("--reward-fn", args.reward_fn), ("--pair-judge", args.pair_judge),
                           ("--answer-filter", args.answer_filter)):
            if spec:
                check_reward_fn(spec, args.data_path, flag, column_keys(args))
    return args


def check_args(args):
    """Flags impossible together, refused before anything is read or run."""
    check_columns_apply(args.data_path or ["builtin"], column_keys(args), dashes=True)  # two fields in one column, or none
    if args.data_split is not None:  # refused here, not by step 1's parser once launched
        try:
            parse_data_split(args.data_split)
        except ConfigError as err:
            raise ConfigError(str(err).replace("--data_split", "--data-split", 1)) from None
    stages = ALGORITHMS[args.algorithm].stages
    critic_free = [name for name, row in ALGORITHMS.items() if "rl" in row.stages]  # RL that takes a reward fn
    if args.reward_fn and args.algorithm not in critic_free:
        raise ConfigError(f"--reward-fn needs a critic-free --algorithm ({', '.join(critic_free)}), not "
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
    for flag in ("eval_prompts", "eval_samples"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be at least 1, not {getattr(args, flag)}")
    if args.time_budget is not None and not 0 <= args.time_budget < float("inf"):
        raise ConfigError(f"--time-budget must be a number of minutes, at least 0, not {args.time_budget}")
    check_flag_ranges(argparse.Namespace(seed=args.seed))  # each step's range, checked before any step runs
    if args.save_steps < 0:  # refused here, not by a step's parser under --stepN-args it was never in
        raise ConfigError(f"--save-steps must be at least 0 (0: no checkpoints), not {args.save_steps}")
    if args.time_budget and not has_step3(args):
        raise ConfigError(f"--time-budget bounds step 3's RL, but --algorithm {args.algorithm} has no step 3")
    if args.pair_judge and not any(STAGES[name].step == 2 for name in stages):
        raise ConfigError(f"--pair-judge makes step 2's pairs, but --algorithm {args.algorithm} has no step 2")
    if args.pair_judge and "sft" not in ALGORITHMS[args.algorithm].stages:
        raise ConfigError(f"--pair-judge judges the step-1 actor's answers, but --algorithm {args.algorithm} has no "
                          "step 1")
    if args.pair_rounds < 1:
        raise ConfigError(f"--pair-rounds must be at least 1, not {args.pair_rounds}")
    if args.pair_rounds > 1 and not (args.pair_judge and any(STAGES[name].repeats for name in stages)):
        repeating = [name for name, row in ALGORITHMS.items() if any(STAGES[stage].repeats for stage in row.stages)]
        raise ConfigError(f"--pair-rounds repeats --pair-judge's sampling and DPO: it needs --algorithm "
                          f"{' or '.join(repeating)} and --pair-judge")
    if args.tools and not any(STAGES[name].step == 3 for name in stages):
        raise ConfigError(f"--tools is for RL's rollouts, but --algorithm {args.algorithm} has no step 3")
    if args.pair_judge and args.reward_fn:
        raise ConfigError("--pair-judge makes the reward model's pairs, but with --reward-fn there is no reward "
                          "model; pass one of them")


def run_group(args):
    """The group of the stages' W&B and MLflow runs: <output-dir's name>-<start time>, or with --resume the group the
    run it resumes kept in <output-dir>/run_group."""
    path = Path(args.output_dir) / RUN_GROUP_FILE
    if args.resume and path.is_file():
        group = path.read_text().strip()
        check_run_group(group, flag=str(path))
        return group
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(args.output_dir).resolve().name)[:100]
    return f"{name or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"


def stage_env():
    """The environment of every stage and of the evaluation. PYTHONHASHSEED is fixed (unless the user set it) so
    that data generators iterating over Python sets (a few reasoning-gym tasks) make the same questions in every
    process: the verifier of step 3 and of the evaluation must find the questions the data set made. PYTHON is
    this interpreter, for training/launch.sh."""
    # The `deepspeed` launcher of this interpreter's environment first, whatever PATH holds (a venv's python run by
    # its full path has its bin/ off PATH).
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {"PYTHONHASHSEED": "0", **os.environ, "PYTHONUNBUFFERED": "1", "PATH": path, "PYTHON": sys.executable}


def run_stage(args, run):
    """Run one stage with its output in `<its output>/training.log`; return its wall time, or None on failure."""
    step, command, out_dir = run.spec.step, step_command(args, run), run.output
    env = stage_env()
    if args.hostfile:
        env["HOSTFILE"] = args.hostfile
    if args.dry_run and run.spec.script:
        print(shlex.join(command))
        return 0.0
    if args.dry_run:
        env["DRY_RUN"] = "1"
        print(subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout.strip())
        return 0.0
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "training.log"
    # Over an earlier model, its log is kept until this run has saved in its place (a failed run leaves both).
    replacing = not args.resume and (out_dir / "config.json").is_file() and log_path.is_file()
    log_path = log_path.with_name("training.log.partial") if replacing else log_path
    print(f"---- step {step} ({run.name}): {run.spec.folder or run.spec.script} -> {out_dir} (log: "
          f"{log_path})", flush=True)
    interrupt_hint(f"step {step} stopped (its log: {log_path}); resume with --resume")
    lock = FolderLock(out_dir)  # a step running there keeps its log: refuse before opening it
    if not lock.acquire():
        raise ConfigError(f"--output-dir {args.output_dir}: {out_dir} is in use by another run (PID {lock.holder()})")
    lock.release()
    start = time.time()
    offset = log_path.stat().st_size if args.resume and log_path.is_file() else 0  # where this run's lines start
    with open(log_path, "a" if args.resume else "w") as log:  # a resumed step's log continues
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        returncode = run_child(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    elapsed = time.time() - start
    if returncode != 0:
        lines = log_path.read_text(errors="replace").splitlines()
        errors = [line for line in lines if line.startswith("error: ")]
        if errors:  # the step said what went wrong: its error line and the data it left out tell it
            print(f"step {step} FAILED after {elapsed:.0f} s (exit {returncode}); its log: {log_path}", flush=True)
            for line in data_notices(log_path, offset):  # "no train data left": the skipped counts say why
                print(line, flush=True)
        else:  # a crash: the log's tail shows where
            print(f"step {step} FAILED after {elapsed:.0f} s (exit {returncode}); last lines of {log_path}:")
            print("\n".join("    " + line for line in lines[-LOG_TAIL_LINES:]), flush=True)
        last = next((line.strip() for line in reversed(lines) if line.strip()), "nothing")
        cause = errors[-1][len("error: "):] if errors else f"exit {returncode}, its log {log_path} ends: {last}"
        print(f"error: step {step} failed: {cause}; re-run this step alone with --step {step}", file=sys.stderr,
              flush=True)
        return None
    result = out_dir / ("meta.json" if run.spec.script else "metrics.json")  # what a stage writes last
    if not result.is_file() or (not run.spec.script and result.stat().st_mtime < start):
        print(f"error: step {step} failed: it exited 0 but wrote no {result.name} in {out_dir} (a stage writes it "
              f"last: it stopped before saving); its log: {log_path}; re-run this step alone with --step {step}",
              file=sys.stderr, flush=True)
        return None
    if replacing:  # saved: this run's log is the model's now
        os.replace(log_path, out_dir / "training.log")
        log_path = out_dir / "training.log"
    for line in data_notices(log_path, offset):
        print(line, flush=True)
    print(f"step {step} done in {elapsed:.1f} s", flush=True)
    return elapsed


def data_notices(log_path, offset=0):
    """The DATA_NOTICE lines of `log_path` after its first `offset` bytes, each once (every rank may print one)."""
    with open(log_path, "rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    return list(dict.fromkeys(line.rstrip() for line in lines if DATA_NOTICE.search(line)))


def run_child(command, **popen_kwargs):
    """Run `command` in a process group of its own and return its exit code. On an interrupting signal the signal
    is passed on to the whole group (the launcher and every rank, which finish or discard a checkpoint in progress
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


def check_output_dir(path):
    """Make --output-dir, or refuse it in one line: empty (the working directory), a file, a folder that cannot be
    made or written in."""
    if not path.strip():
        raise ConfigError("--output-dir is empty: give the folder for the run's models and logs, such as ./output")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--output-dir {path} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--output-dir {path}: cannot make the folder ({err.strerror}: {err.filename})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--output-dir {path}: cannot write in the folder (permission denied)")


def check_own_report(args):
    """Refuse an --output-dir holding a report.md that no run of train.py wrote (its first line is REPORT_START):
    the run's report would replace someone's file; --overwrite-output-dir lets it."""
    from utils.trainer.report import REPORT_START  # loads transformers: --help and flag errors answer first

    report = Path(args.output_dir) / "report.md"
    if (report.is_file() and not args.overwrite_output_dir
            and not report.read_text(errors="replace").startswith(REPORT_START)):
        raise ConfigError(f"--output-dir {args.output_dir} holds a report.md that no run of train.py wrote; pick "
                          "another --output-dir, or pass --overwrite-output-dir to let this run's report replace it")


HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)$")
"""A DeepSpeed hostfile's line: a host and its number of accelerators (`worker-1 slots=8`); `#` starts a comment."""


def check_hostfile(hostfile):
    """The hosts DeepSpeed's launcher would read from `hostfile`, refused where it would stop with a traceback."""
    try:
        lines = Path(hostfile).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--hostfile {hostfile}: cannot read it ({err})") from None
    hosts = set()
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = HOSTFILE_LINE.match(line)
        if not match or int(match.group(2)) < 1:
            raise ConfigError(f"--hostfile {hostfile}: line {number}: expected 'HOST slots=N' (N at least 1), got "
                              f"{line!r}")
        if match.group(1) in hosts:
            raise ConfigError(f"--hostfile {hostfile}: line {number}: host {match.group(1)} is listed twice")
        hosts.add(match.group(1))
    if not hosts:
        raise ConfigError(f"--hostfile {hostfile}: names no host (a line 'HOST slots=N' for each)")


def check_inputs(args, runs, selected):
    """What the stages will need and cannot make themselves, refused before anything is launched or written."""
    from utils.model.model_utils import is_reward_model_folder  # loads transformers: --help answers first

    if args.deployment_type == "multi_node":
        hostfile = args.hostfile or "/job/hostfile"
        if Path(hostfile).is_dir():
            raise ConfigError(f"--hostfile {hostfile} is a folder, not a DeepSpeed hostfile")
        if not Path(hostfile).is_file():
            raise ConfigError(f"--hostfile {hostfile} does not exist (multi_node runs the hosts of a DeepSpeed "
                              "hostfile)")
        check_hostfile(hostfile)
    for flag, model in (("--actor-model", args.actor_model), ("--reward-model", args.reward_model)):
        if model is not None and Path(model).exists() and not (Path(model) / "config.json").is_file():
            raise ConfigError(f"{flag} {model or repr(model)} is not a model folder (no config.json in it)")
    made = {run.name for run in selected}
    for run in selected:
        for earlier in run_inputs(args, run, runs):
            if earlier.name in made:  # made by this run before it is needed
                continue
            folder, is_reward = earlier.output, earlier.spec.trains == "reward"
            what = f"step-{earlier.spec.step} {'reward model' if is_reward else 'actor'}"
            if not (folder / "config.json").is_file():
                why = " (--reward-from-sft)" if run.spec.trains == "reward" else ""
                raise ConfigError(f"--step {run.spec.step}{why} needs the {what} {folder}, which does not exist: "
                                  f"run --step {earlier.spec.step} first (with the same --output-dir and models)")
            if is_reward_model_folder(folder) != is_reward:
                raise ConfigError(f"--step {run.spec.step} needs the {what} in {folder}, but it holds a "
                                  f"{'causal language model' if is_reward else 'reward model'}")
    check_own_report(args)
    check_output_dir(args.output_dir)  # last: a refused run leaves no folder behind


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    runs = plan(args)
    selected = [run for run in runs if run.spec.step in args.step]
    if any(STAGES[name].step == 1 for name in ALGORITHMS[args.algorithm].stages) and \
            not any(run.spec.step == 1 for run in runs):
        print(f"step 1 skipped: {' '.join(args.data_path)} has no reference answers to imitate; later steps start "
              f"from {args.actor_model}", flush=True)
    if not selected:
        raise ConfigError(f"--step {' '.join(map(str, args.step))}: nothing to run for --algorithm {args.algorithm}")
    check_data_split(args, runs)
    check_round_flags(args, runs)  # first: its message says why a round's output is train.py's
    check_step_flags(args, runs)
    if args.deadline:
        args.reserve_answers, args.reserve_greedy_answers = closing_answers(args, runs)
    if not args.dry_run:
        check_inputs(args, runs, selected)
        if args.run_group:
            (Path(args.output_dir) / RUN_GROUP_FILE).write_text(args.run_group + "\n")
    wall_times = {}
    for run in selected:
        if args.deadline and run.spec.step == 3:
            print(f"--time-budget {args.time_budget:g}: {max(0.0, args.deadline - time.time()) / 60:.1f} minutes left "
                  f"for step 3 and the closing evaluation ({args.reserve_answers} answers)", flush=True)
        wall_times[run.name] = run_stage(args, run)
        if wall_times[run.name] is None:
            return 1
    command = None if args.no_eval else evaluation_command(args, runs)
    if args.dry_run:
        if command:
            print(shlex.join(command))
        return 0
    evaluation_path = Path(args.output_dir) / "evaluation.json"
    eval_note = None
    if command and args.deadline:
        command, eval_note = fit_closing_evaluation(args, runs, command)
    if command:
        if eval_note:
            print(f"WARNING: the closing evaluation answers {eval_note}", flush=True)
        print("---- evaluation: " + shlex.join(command), flush=True)
        interrupt_hint("the closing evaluation stopped, every step having finished (its command: the "
                       "'---- evaluation:' line above)")
        start = time.time()
        if run_child(command, env=stage_env()) != 0:
            return 1
        wall_times["evaluation"] = time.time() - start
    interrupt_hint(f"writing the report stopped, every step{' and the evaluation' if command else ''} having "
                   "finished")
    write_report(args, runs, wall_times, command, evaluation_path if command else None, eval_note)
    return 0


def fit_closing_evaluation(args, runs, command):
    """fit_evaluation's (command, note) for the time step 3 left of --time-budget, at its decoding rates."""
    step3 = next((run for run in runs if run.spec.step == 3), None)
    metrics = step3.output / "metrics.json" if step3 is not None else None
    if metrics is None or not metrics.is_file():
        return command, None
    decoding_s = json.loads(metrics.read_text()).get("decoding_s") or {}
    return fit_evaluation(command, evaluation_prompts(args, command), decoding_s, args.deadline - time.time(),
                          tools=bool(args.tools))


def write_report(args, runs, wall_times, eval_command, evaluation_path, eval_note=None):
    """Print the run's table and keep it as <output-dir>/report.md, its pictures beside it; add the evaluation's
    table to the model card of the actor it evaluated (eval_command's --model_name_or_path_finetune)."""
    from utils.model.card import add_evaluation  # loads transformers: --help and flag errors answer first
    from utils.trainer.report import pipeline_report, skill_table

    evaluation = None
    if evaluation_path is not None and evaluation_path.is_file():
        evaluation = json.loads(evaluation_path.read_text())
    command = shlex.join(["python", "train.py", *(sys.argv[1:])])
    report = pipeline_report({run.name: run.output for run in runs}, wall_times, evaluation, command,
                             figures_dir=args.output_dir, eval_note=eval_note)
    (Path(args.output_dir) / "report.md").write_text(report)
    print(f"---- report ({Path(args.output_dir) / 'report.md'})\n{report}", flush=True)
    table = skill_table(evaluation) if evaluation else ""  # "" for a reward model's scores alone: report rows
    if table:
        baseline, finetune = (eval_command[eval_command.index(flag) + 1] for flag in
                              ("--model_name_or_path_baseline", "--model_name_or_path_finetune"))
        add_evaluation(finetune, f"The held-out checker score of this model (after) and of `{baseline}` (before), "
                                 f"by train.py's closing evaluation (`prompt_eval.py {shlex.join(eval_command[2:])}`) "
                                 f"at the end of `{command}`:\n\n{table}")


if __name__ == "__main__":
    sys.exit(main())
