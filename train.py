"""Run the RLHF pipeline: step 1 (SFT), step 2 (reward model), step 3 (PPO), then a side-by-side evaluation.

    python train.py                                   # all three steps on the built-in default, one process
    python train.py --step 1 2 --deployment-type single_node --actor-model facebook/opt-1.3b

Each step runs its `training_scripts/<deployment>/run.sh`, which calls the `deepspeed` launcher; its log goes to
`<output-dir>/<step folder>/training.log`. Outputs follow DeepSpeed-Chat's layout:
`actor-models/<name>`, `reward-models/<name>`, `step3-models/<name>/{actor,critic,actor_ema}`.
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from training.recipes import recipe_flags
from utils.errors import ArgumentParser, ConfigError, Interrupted, cli_entry, interrupt_hint, interrupts_deferred

ROOT = Path(__file__).resolve().parent
STEP_DIRS = {1: "step1_supervised_finetuning", 2: "step2_reward_model_finetuning", 3: "step3_rlhf_finetuning"}
DEFAULT_ZERO_STAGE = {"single_gpu": 0, "single_node": 2, "multi_node": 2}
LOG_TAIL_LINES = 20
# How long an interrupted step may take to finish a checkpoint and exit before it is killed (DeepSpeed's launcher
# gives its ranks 30 s after a SIGTERM).
CHILD_EXIT_TIMEOUT = 120
# Sampled answers per held-out prompt in the closing evaluation: one per prompt leaves a standard error of about
# 0.02 on a 400-prompt mean checker score, as large as the differences the evaluation is there to show.
EVAL_SAMPLES_PER_PROMPT = 4


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step", type=int, nargs="+", choices=(1, 2, 3), default=[1, 2, 3])
    parser.add_argument("--deployment-type", choices=tuple(DEFAULT_ZERO_STAGE), default="single_gpu")
    parser.add_argument("--actor-model", default="tiny", help="Base model of the actor: built-in name, hub name "
                                                              "or folder.")
    parser.add_argument("--reward-model", default="tiny", help="Base model of the reward model and critic.")
    parser.add_argument("--reward-from-sft", action=argparse.BooleanOptionalAction, default=None,
                        help="Start the step-2 reward model from the step-1 actor's weights, as InstructGPT does, "
                             "rather than from --reward-model's (default: when --reward-model is --actor-model).")
    parser.add_argument("--actor-zero-stage", type=int, choices=(0, 1, 2, 3), default=None)
    parser.add_argument("--reward-zero-stage", type=int, choices=(0, 1, 2, 3), default=None)
    parser.add_argument("--output-dir", default="./output")
    parser.add_argument("--hostfile", default=None, help="multi_node: the DeepSpeed hostfile.")
    for step in (1, 2, 3):
        parser.add_argument(f"--step{step}-args", default="",
                            help=f"Extra flags for step {step}'s main.py (quoted), after the recipe's.")
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
    stage = DEFAULT_ZERO_STAGE[args.deployment_type]
    args.actor_zero_stage = stage if args.actor_zero_stage is None else args.actor_zero_stage
    args.reward_zero_stage = stage if args.reward_zero_stage is None else args.reward_zero_stage
    if args.reward_from_sft is None:
        args.reward_from_sft = args.reward_model == args.actor_model
    for step in (1, 2, 3):
        try:
            shlex.split(getattr(args, f"step{step}_args"))
        except ValueError as err:  # an unclosed quote
            raise ConfigError(f"--step{step}-args {getattr(args, f'step{step}_args')!r}: {err}") from None
    return args


def model_label(model):
    """The folder name of a model's outputs: `facebook/opt-1.3b` -> `opt-1.3b`, `./my/model/` -> `model`."""
    return Path(model.rstrip("/")).name or "model"


def output_dirs(args):
    out = Path(args.output_dir)
    return {1: out / "actor-models" / model_label(args.actor_model),
            2: out / "reward-models" / model_label(args.reward_model),
            3: out / "step3-models" / model_label(args.actor_model)}


def step_command(args, step, dirs):
    """The `bash run.sh ...` command of one step."""
    script = ROOT / "training" / STEP_DIRS[step] / "training_scripts" / args.deployment_type / "run.sh"
    if step == 1:
        positional = [dirs[1], args.actor_zero_stage, args.actor_model]
        model = args.actor_model
    elif step == 2:
        positional = [dirs[2], args.reward_zero_stage, dirs[1] if args.reward_from_sft else args.reward_model]
        model = args.reward_model
    else:
        positional = [dirs[1], dirs[2], args.actor_zero_stage, args.reward_zero_stage, dirs[3]]
        model = args.actor_model
    # Every step logs under one TensorBoard folder: `tensorboard --logdir <output-dir>/tensorboard`.
    tensorboard = ["--enable_tensorboard", "--tensorboard_path", str(Path(args.output_dir) / "tensorboard")]
    checkpoints = ["--save_steps", str(args.save_steps)] if args.save_steps else []
    checkpoints += ["--resume"] if args.resume else []
    checkpoints += ["--overwrite_output_dir"] if args.overwrite_output_dir else []
    extra = shlex.split(getattr(args, f"step{step}_args"))
    return ["bash", str(script), *map(str, positional), *tensorboard, *recipe_flags(model, step), *checkpoints,
            *extra]


def run_step(args, step, command, out_dir):
    """Run one step with its output in `out_dir/training.log`; return its wall time, or None on failure."""
    # The `deepspeed` launcher of this interpreter's environment first, whatever PATH holds (a venv's python
    # run by its full path has its bin/ off PATH).
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if args.hostfile:
        env["HOSTFILE"] = args.hostfile
    if args.dry_run:
        env["DRY_RUN"] = "1"
        print(subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout.strip())
        return 0.0
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "training.log"
    print(f"---- step {step}: {STEP_DIRS[step]} -> {out_dir} (log: {log_path})", flush=True)
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


def evaluation_command(args, dirs):
    """Compare the actor before and after the last trained step on the held-out prompts."""
    if 3 in args.step:
        baseline, finetune = dirs[1], dirs[3] / "actor"
        reward = ["--reward_model", str(dirs[2])]
    elif 1 in args.step:
        baseline, finetune = args.actor_model, dirs[1]
        reward = []
    else:
        return None
    script = ROOT / "training" / STEP_DIRS[1] / "prompt_eval.py"
    return [sys.executable, str(script), "--model_name_or_path_baseline", str(baseline),
            "--model_name_or_path_finetune", str(finetune), *reward,
            "--samples_per_prompt", str(EVAL_SAMPLES_PER_PROMPT),
            "--output_json", str(Path(args.output_dir) / "evaluation.json"), *recipe_flags(args.actor_model, "eval")]


def check_inputs(args, dirs):
    """What the steps will need and cannot make themselves, refused before anything is launched or written."""
    from utils.model_utils import is_reward_model_folder

    if args.deployment_type == "multi_node":
        hostfile = args.hostfile or "/job/hostfile"
        if Path(hostfile).is_dir():
            raise ConfigError(f"--hostfile {hostfile} is a folder, not a DeepSpeed hostfile")
        if not Path(hostfile).is_file():
            raise ConfigError(f"--hostfile {hostfile} does not exist (multi_node runs the hosts of a DeepSpeed "
                              "hostfile)")
    needs = []  # (the step that needs an earlier output, the earlier step)
    if 2 in args.step and args.reward_from_sft:
        needs.append((2, 1))
    if 3 in args.step:
        needs += [(3, 1), (3, 2)]
    for step, earlier in needs:
        if earlier in args.step:  # made by this run before it is needed
            continue
        folder, is_reward = dirs[earlier], earlier == 2
        what = "step-2 reward model" if is_reward else "step-1 actor"
        if not (folder / "config.json").is_file():
            why = " (--reward-from-sft)" if step == 2 else ""
            raise ConfigError(f"--step {step}{why} needs the {what} {folder}, which does not exist: run --step "
                              f"{earlier} first (with the same --output-dir and models)")
        if is_reward_model_folder(folder) != is_reward:
            raise ConfigError(f"--step {step} needs the {what} in {folder}, but it holds a "
                              f"{'causal language model' if is_reward else 'reward model'}")


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    interrupt_hint("resume with --resume")
    dirs = output_dirs(args)
    if not args.dry_run:
        check_inputs(args, dirs)
    wall_times = {}
    for step in args.step:
        wall_times[step] = run_step(args, step, step_command(args, step, dirs), dirs[step])
        if wall_times[step] is None:
            return 1
    command = None if args.no_eval else evaluation_command(args, dirs)
    if args.dry_run:
        if command:
            print(shlex.join(command))
        return 0
    if command:
        print("---- evaluation: " + shlex.join(command), flush=True)
        start = time.time()
        if run_child(command) != 0:
            return 1
        wall_times["evaluation"] = time.time() - start
    write_report(args, dirs, wall_times, None if command is None else Path(args.output_dir) / "evaluation.json")
    return 0


def write_report(args, dirs, wall_times, evaluation_path):
    """Print the run's table and keep it as <output-dir>/report.md."""
    from utils.report import pipeline_report

    evaluation = None
    if evaluation_path is not None and evaluation_path.is_file():
        evaluation = json.loads(evaluation_path.read_text())
    command = shlex.join(["python", "train.py", *(sys.argv[1:])])
    report = pipeline_report(dirs, wall_times, evaluation, command)
    (Path(args.output_dir) / "report.md").write_text(report)
    print(f"---- report ({Path(args.output_dir) / 'report.md'})\n{report}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
