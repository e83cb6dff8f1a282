"""Step 3: RLHF with PPO, from the step-1 actor and the step-2 reward model or a reward function.

Each step samples answers to a batch of prompts (--num_samples_per_prompt each; --generation_batches batches make
one round of experience), scores them with the reward model and/or a reward function (--reward_fn, e.g. the
built-in task's checker), subtracts a KL penalty against the frozen reference (or keeps the KL for the loss,
--use_kl_loss), computes advantages (--advantage_estimator: GAE with the critic, or critic-free GRPO, RLOO or
REINFORCE++), then runs --ppo_epochs passes of clipped-PPO updates over minibatches of the experience (with
--positive_nll_coef, the policy loss plus the NLL of the answers that scored well; with
--unsupervised_dataset_name, a language-modelling step on plain text per minibatch, scaled by --unsup_coef).
With --eval_interval N the actor is scored on held-out prompts every N steps (with --load_best_model_at_end on
validation prompts, and the best-scoring actor is the one saved). With --tools the actor may call a tool in its
answers (inference/tool_rollout.py), and the evaluations score it with and without. Saves `actor/`, `critic/`
(GAE only) and, with --enable_ema, `actor_ema/` in --output_dir.
With --save_steps N a resumable checkpoint (the engines, the EMA, the KL controller, reward moments, minibatch
shuffler, metric history, evaluations and the best actor's weights) is written between PPO rounds every N prompt
batches, and --resume continues from the latest one exactly as the uninterrupted run would have gone on.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from the clone: chatrlhf installs no packages
import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import itertools
import random
import time

from inference.evaluation import (TOOL_FIGURES, fit_prompts_to_context, gym_validation_prompts, has_checker,
                                  heldout_set, reward_fn_checker)
from training.step3_rlhf_finetuning.arguments import parse_args
from utils.data.data_utils import (DataCollatorRLHF, DataCollatorSFT, create_prompt_dataset,
                                   create_unsupervised_dataset, data_bound, data_metrics, fit_auto_lengths,
                                   make_dataloader)
from utils.model.card import model_card
from utils.model.model_utils import (check_fits_context, check_model_kind, context_length, load_model_config,
                                     load_tokenizer, resolve_model_path)
from utils.model.save import save_engine_model
from utils.rl.base_rate import AnswerBaseRate, reference_prompts
from utils.rl.reward_fns import load_reward_fn
from utils.runtime.args import column_keys, rollouts_per_batch, training_flags
from utils.runtime.dist import print_rank_0, to_device
from utils.runtime.errors import ConfigError, cli_entry
from utils.runtime.progress import progress
from utils.trainer.best import BestWeights
from utils.trainer.checkpoint import (PYTHON_RANDOM_SHAPE, Checkpointer, CountingIterator, TrainingPosition,
                                      claim_output_dir, python_random_state, set_python_random_state)
from utils.trainer.engine import start_run, step_budget, write_metrics
from utils.trainer.monitor import Monitor, format_scalars
from utils.trainer.ppo_trainer import PPOTrainer, mean_stats
from utils.trainer.rlhf_engine import DeepSpeedRLHFEngine
from utils.trainer.stopping import Reserve, StopRule, stop_rule_from_args


def resolve_step_models(args):
    """The actor must be a causal LM (step 1 output) and the critic, if given, a reward model (step 2 output)."""
    actor_path = resolve_model_path(args.actor_model_name_or_path)
    check_model_kind(actor_path, reward=False, name=f"--actor_model_name_or_path {actor_path}")
    if not args.critic_model_name_or_path:
        return actor_path, None
    critic_path = resolve_model_path(args.critic_model_name_or_path)
    check_model_kind(critic_path, reward=True, name=f"--critic_model_name_or_path {critic_path}")
    return actor_path, critic_path


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    start_time, world_size, device = start_run(args)

    # Data
    actor_path, critic_path = resolve_step_models(args)
    for path in filter(None, (actor_path, critic_path)):  # both read prompt + answer
        check_fits_context(path, {"--max_prompt_seq_len": args.max_prompt_seq_len,
                                  "--max_answer_seq_len": args.max_answer_seq_len}, args.trust_remote_code)
    inputs = {"--actor_model_name_or_path": actor_path, "--critic_model_name_or_path": critic_path}
    claim_output_dir(args, inputs={flag: path for flag, path in inputs.items() if path},
                     model_dirs=[f"{args.output_dir}/{name}" for name in ("actor", "critic", "actor_ema")])
    reward_fn = load_reward_fn(args.reward_fn, args) if args.reward_fn else None
    tokenizer = load_tokenizer(actor_path, args.trust_remote_code)
    def build(max_prompt_len):
        return create_prompt_dataset(args.data_path, args.data_split, args.data_output_path, 3, args.seed, tokenizer,
                                     max_prompt_len, columns=column_keys(args))

    prompt_dataset, eval_dataset = build(data_bound(args.max_prompt_seq_len))
    fit_auto_lengths(args, args.data_path, tokenizer, prompt_dataset, eval_dataset, rebuild=build)
    eval_prompts, eval_checker = ([], None) if not args.eval_interval else (
        validation_prompts if args.load_best_model_at_end else heldout_prompts)(args, eval_dataset, reward_fn)
    if eval_prompts:  # answered up to --max_answer_seq_len within the actor's context, as training's are
        eval_prompts = fit_prompts_to_context(
            eval_prompts, tokenizer, context_length(load_model_config(actor_path, args.trust_remote_code)),
            args.max_answer_seq_len, "--max_answer_seq_len")
    # Every round has a whole generation batch (a short last one would not split into training minibatches).
    prompt_loader = make_dataloader(prompt_dataset, DataCollatorRLHF(tokenizer.pad_token_id),
                                    args.per_device_generation_batch_size, True, args.seed, full_batches=True)
    unsup_batches = None
    if args.unsupervised_dataset_name:
        unsup_dataset = create_unsupervised_dataset(args.unsupervised_dataset_name,
                                                    args.unsupervised_dataset_config_name, tokenizer,
                                                    args.max_prompt_seq_len + args.max_answer_seq_len, args.seed)
        unsup_batches = CountingIterator(itertools.cycle(make_dataloader(
            unsup_dataset, DataCollatorSFT(tokenizer.pad_token_id), args.per_device_training_batch_size, True,
            args.seed)))

    # Models
    steps_per_epoch = len(prompt_loader) // args.generation_batches * args.generation_batches
    if steps_per_epoch == 0:
        raise ConfigError(f"no PPO round to train: --generation_batches {args.generation_batches} is more than the "
                          f"{len(prompt_loader)} prompt batch(es) of an epoch ({len(prompt_dataset)} prompts, "
                          f"--per_device_generation_batch_size {args.per_device_generation_batch_size}, "
                          f"{world_size} process(es))")
    budget, warning = step_budget(steps_per_epoch, 1, args.num_train_epochs, args.max_steps)
    total_steps = budget["total_steps"]
    if warning:
        print_rank_0(warning)
    rollouts = rollouts_per_batch(args)
    minibatches = rollouts // args.per_device_training_batch_size
    actor_steps, critic_steps = planned_optimizer_steps(args, total_steps)
    engine = DeepSpeedRLHFEngine(actor_path, critic_path, tokenizer, args, actor_steps, critic_steps, world_size)
    base_rate = None
    if args.answer_base_rate:
        references = reference_prompts(prompt_dataset, args.answer_base_rate, args.seed)
        if len(references) < 2:
            raise ConfigError(f"--answer_base_rate {args.answer_base_rate}: the training data has "
                              f"{len(references)} prompt(s) to draw from, and an answer's base rate needs 2")
        base_rate = AnswerBaseRate(reward_fn, args.reward_fn, references)
    trainer = PPOTrainer(engine, args, reward_fn, base_rate)
    print_rank_0(f"PPO ({args.advantage_estimator}): {len(prompt_dataset)} prompts, {total_steps} steps of "
                 f"{rollouts} x {world_size} rollouts ({args.per_device_generation_batch_size} prompt(s) x "
                 f"{args.num_samples_per_prompt} answer(s) per process), {args.ppo_epochs} PPO epoch(s) of "
                 f"{minibatches} minibatch(es)")

    # Loop (resumed from the latest checkpoint with --resume; checkpoints are written between PPO rounds)
    position = TrainingPosition(prompt_loader)
    trained = {name: model for name, model in (("actor", engine.actor), ("critic", engine.critic))
               if model is not None}
    best = BestWeights(engine.actor) if args.load_best_model_at_end else None
    checkpointer = Checkpointer(args.output_dir, args.save_steps, args.save_total_limit, trained, position,
                                weights={"actor_ema": engine.actor_ema}, flags=training_flags(args, step=3),
                                tensors={"best": best})
    shuffler = random.Random(args.seed)
    history, evaluations, experiences, step = [], [], [], 0
    resumed = checkpointer.resume({
        "history": [{"*": (None, 0.0)}], "evaluations": [{"step": 0}], "trainer": PPOTrainer.STATE_SHAPE,
        "shuffler": PYTHON_RANDOM_SHAPE, "stop": StopRule.STATE_SHAPE, "unsup_batches_drawn": 0,
        "best": (None, BestWeights.STATE_SHAPE)}) if args.resume else None
    if resumed:
        step, history, evaluations = resumed["step"], resumed["history"], resumed["evaluations"]
        trainer.load_state_dict(resumed["trainer"])
        if best is not None:
            best.load_state_dict(resumed["best"])
        set_python_random_state(resumed["shuffler"], shuffler)
        if unsup_batches is not None:
            unsup_batches.skip(resumed["unsup_batches_drawn"])
    monitor = Monitor(args, "step3_ppo", args.output_dir, resumed=resumed is not None)
    stop = stop_rule_from_args(args, device, state=(resumed or {}).get("stop"))
    reserve = Reserve(time.time() - start_time, args.reserve_answers, args.reserve_greedy_answers)  # --deadline's

    def evaluate_now():
        started = time.time()
        evaluations.append(evaluate(trainer, eval_prompts, eval_checker, step, monitor,
                                    "validation" if best is not None else "held-out"))
        if best is not None and best.observe(step, selection_score(evaluations[-1])):
            print_rank_0(f"best so far: step {step} (validation score {best.score:.4f})")
        reserve.observe_evaluation(time.time() - started, 2 * len(eval_prompts),  # sampled and greedy
                                   {decoding: (spent, len(eval_prompts))
                                    for decoding, spent in trainer.evaluation_seconds.items()})

    if eval_prompts and not resumed:
        evaluate_now()
    round_start, generation_s, generated = time.time(), 0.0, 0
    bar = progress(total=total_steps, initial=step, desc="ppo", unit="prompt batch")
    for epoch in position.epochs(args.num_train_epochs):
        for _, batch in position.batches(epoch):
            if step + args.generation_batches > total_steps or stop.stopped:  # no whole round left
                break
            batch = to_device(batch, device)
            started = time.time()
            experiences.append(trainer.generate_experience(batch["prompt"], batch["prompt_att_mask"],
                                                           batch["prompt_text"]))
            generation_s += time.time() - started
            generated += len(batch["prompt"]) * args.num_samples_per_prompt
            if not trainer.round_ready(experiences):
                continue
            step += args.generation_batches  # (with --filter_zero_variance a round may draw more batches)
            bar.update(args.generation_batches)
            stats = trainer.train_round(experiences, unsup_batches, shuffler,
                                        train_actor=step > args.critic_warmup_steps * args.generation_batches)
            if "kl" in stats:  # with a reference (utils/rl/kl.py uses_reference)
                trainer.kl_controller.update(stats["kl"], rollouts * world_size * args.generation_batches)
            stats["kl_coef"] = trainer.kl_controller.value
            stats["entropy_coef"] = trainer.entropy_coef.bonus  # the bonus this round trained with
            trainer.entropy_coef.update(stats.get("entropy"))
            history.append(stats)
            if step % args.print_interval == 0 or step == total_steps:
                recent = mean_stats(history[-max(1, args.print_interval // args.generation_batches):])
                window = f" (mean of the last {args.print_interval})" if args.print_interval > 1 else ""
                print_rank_0(f"epoch {epoch + 1} step {step}/{total_steps}{window}: {format_scalars(**recent)}")
            monitor.write(step, "ppo", **stats)
            if args.print_answers and step % args.print_answers_interval == 0:
                print_sample(experiences[0], tokenizer)
            experiences = []
            stop.observe_round(stats["trained_rows"])
            reserve.observe_round(time.time() - round_start, generation_s, generated)
            stop.reserve_s = reserve.seconds()
            reason = stop.reason(step, total_steps)  # --max_train_minutes, --stop_after_idle_rounds, --deadline
            if eval_prompts and (step % args.eval_interval == 0 or step == total_steps or reason):
                evaluate_now()
            checkpointer.save_if_due(step, step if reason else total_steps, {
                "history": history, "evaluations": evaluations, "trainer": trainer.state_dict(),
                "shuffler": python_random_state(shuffler), "stop": stop.state_dict(),
                "unsup_batches_drawn": unsup_batches.drawn if unsup_batches is not None else 0,
                "best": best.state_dict() if best is not None else None})
            if reason:
                break
            round_start, generation_s, generated = time.time(), 0.0, 0
        if stop.stopped:
            break
    bar.close()
    monitor.close()

    # Save (each folder with its model card; the wall time in metrics.json counts the saves)
    kept = evaluations
    if best is not None and best.step is not None:
        if best.step != step:
            best.restore()
            print_rank_0(f"--load_best_model_at_end: the actor of step {best.step} is saved (validation score "
                         f"{best.score:.4f}, against {selection_score(evaluations[-1]):.4f} at step {step})")
        kept = evaluations[:1] + [evaluation for evaluation in evaluations if evaluation["step"] == best.step][-1:]
    metrics = summarize(history, kept, time.time() - start_time, "validation" if best is not None else "heldout")
    if best is not None:
        metrics.update(best_step=best.step, best_validation_score=best.score)
    metrics.update(actor_optimizer_steps=engine.actor.global_steps, actor_scheduled_steps=actor_steps)
    if engine.critic is not None:
        metrics.update(critic_optimizer_steps=engine.critic.global_steps, critic_scheduled_steps=critic_steps)
    metrics.update(budget, **stop.metrics(), **data_metrics(prompt_dataset.counts))
    if args.deadline:  # what train.py sizes the closing evaluation by when the time left cannot hold all of it
        metrics["decoding_s"] = {"setup": reserve.setup_s, **reserve.rates}
    settings = training_flags(args, step=3)
    for name, model_engine in (("actor", engine.actor), ("critic", engine.critic), ("actor_ema", engine.actor_ema)):
        if model_engine is not None:
            save_engine_model(model_engine, tokenizer, f"{args.output_dir}/{name}", settings=settings,
                              card=model_card(settings, metrics, role=name))
    metrics["wall_time_s"] = time.time() - start_time
    write_metrics(args.output_dir, metrics)
    monitor.publish()
    scalars = {name: value for name, value in metrics.items() if not isinstance(value, dict)}  # not rows_skipped
    print_rank_0(f"saved {args.output_dir}; {format_scalars(**scalars)}")


def planned_optimizer_steps(args, total_steps):
    """(actor, critic) optimizer steps of the run, the length of their learning-rate schedules.

    Each PPO round (--generation_batches prompt batches) makes ppo_epochs x (its rows / training batch) minibatch
    updates. The critic steps on every one; the actor skips the critic warm-up rounds and, with an unsupervised
    data set, takes a second (language-modelling) micro-step after each. DeepSpeed steps the optimizer once per
    --gradient_accumulation_steps micro-steps. A batch's rows are its prompts x --num_samples_per_prompt. (With
    --filter_zero_variance a round short of rows, after --max_generation_batches, makes fewer: the schedule then
    ends short of its last steps.)"""
    rounds = total_steps // args.generation_batches
    updates_per_round = (args.generation_batches * args.ppo_epochs
                         * (rollouts_per_batch(args) // args.per_device_training_batch_size))
    actor_rounds = max(0, rounds - args.critic_warmup_steps)
    actor_micro_steps = actor_rounds * updates_per_round * (2 if args.unsupervised_dataset_name else 1)
    accumulation = args.gradient_accumulation_steps
    return max(1, actor_micro_steps // accumulation), max(1, rounds * updates_per_round // accumulation)


def print_sample(experience, tokenizer):
    prompt_len = experience.prompt_len
    seq, mask = experience.seq[0], experience.attention_mask[0]
    prompt = tokenizer.decode(seq[:prompt_len][mask[:prompt_len].bool()], skip_special_tokens=True)
    answer = tokenizer.decode(seq[prompt_len:][mask[prompt_len:].bool()], skip_special_tokens=False)
    print_rank_0(f"  prompt: {prompt!r}\n  answer: {answer!r}")


def heldout_prompts(args, eval_dataset, reward_fn=None):
    """(prompts, checker) --eval_interval scores, the first --eval_prompts: data of held-out questions with a
    checker (the built-in task, a reasoning-gym spec) gives those, scored as the closing evaluation scores them
    (inference.evaluation.heldout_set); other data the prompts of its eval split, scored as the closing evaluation
    scores them too: by the reward function where there is one (other_checker), else checker None (the mean reward
    is reported)."""
    if has_checker(args.data_path):
        prompts, checker = heldout_set(args.data_path)
        return prompts[:args.eval_prompts], checker
    return [sample["prompt"] for sample in eval_dataset][:args.eval_prompts], other_checker(args, reward_fn)


def other_checker(args, reward_fn):
    """The checker of data without one of its own: --reward_fn's function (its constant answers then show in the
    evaluations, as in the closing one), else None."""
    return None if reward_fn is None else reward_fn_checker(reward_fn, args.reward_fn)


def validation_prompts(args, eval_dataset, reward_fn=None):
    """(prompts, checker) --eval_interval scores with --load_best_model_at_end, the first --eval_prompts: questions
    never trained on and, for data with held-out questions (the built-in task, reasoning-gym specs), apart from them,
    scored by the same checker: a reasoning-gym spec's whole eval part, else the prompts of step 3's eval split
    (other data's closing evaluation reads that split too: its figures are then those the actor was chosen on)."""
    prompts = gym_validation_prompts(args.data_path)
    prompts = (prompts if prompts is not None else [sample["prompt"] for sample in eval_dataset])[:args.eval_prompts]
    if not prompts:
        raise ConfigError(f"--load_best_model_at_end: {args.data_path} has no eval split to pick the best actor on "
                          "(--data_split gives it a share)")
    return prompts, heldout_set(args.data_path)[1] if has_checker(args.data_path) else other_checker(args, reward_fn)


def selection_score(evaluation):
    """What --load_best_model_at_end compares: the mean of the sampled and greedy scores (the checker's, else the
    mean reward)."""
    return sum(evaluation[decoding].get("all", evaluation[decoding].get("reward"))
               for decoding in ("sampled", "greedy")) / 2


def evaluate(trainer, prompts, checker, step, monitor, which="held-out"):
    """Score the actor on the held-out (or validation) prompts (PPOTrainer.evaluate); log it to the console and
    TensorBoard."""
    scores = trainer.evaluate(prompts, checker)
    for decoding, values in scores.items():
        monitor.write(step, f"eval_{decoding}", **values)
    print_rank_0(f"eval at step {step} ({len(prompts)} {which} prompts): "
                 + " | ".join(f"{decoding} {format_scalars(**values)}" for decoding, values in scores.items()))
    return {"step": step, **scores}


ANSWER_FIGURES = ("best_constant", "scored_as_constant", "distinct_answers", "top_answer_share", "hit_limit")
"""What an evaluation says of the answers (inference.evaluation.answer_scalars), kept in metrics.json."""


def summarize(history, evaluations, wall_time, prefix="heldout"):
    """Mean score and KL over the first and last tenth of the run, the first and last held-out evaluation (the
    checker's mean score when there is one, else the mean reward, and what the answers were: ANSWER_FIGURES; keys
    `<prefix>_<decoding>_...`, "validation" with --load_best_model_at_end), and the wall time."""
    if not history:
        return {"wall_time_s": wall_time}
    window = max(1, len(history) // 10)
    first, last = mean_stats(history[:window]), mean_stats(history[-window:])
    metrics = {"score_start": first["score"], "score_end": last["score"], "reward_start": first["reward"],
               "reward_end": last["reward"], "kl_end": last.get("kl"), "answer_length_end": last["answer_length"],
               "eos_fraction_end": last["eos_fraction"], "steps": len(history)}
    for when, evaluation in (("start", evaluations[:1]), ("end", evaluations[-1:])):
        for decoding in ("sampled", "greedy"):
            for scores in evaluation:
                metrics[f"{prefix}_{decoding}_{when}"] = scores[decoding].get("all", scores[decoding].get("reward"))
                for name in ANSWER_FIGURES + TOOL_FIGURES:
                    if name in scores[decoding]:  # best_constant: only with a checker; tool figures with --tools
                        metrics[f"{prefix}_{decoding}_{name}_{when}"] = scores[decoding][name]
    return {**metrics, "wall_time_s": wall_time}


if __name__ == "__main__":
    main()
