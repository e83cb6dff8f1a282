"""Step 3: RLHF with PPO, from the step-1 actor and the step-2 reward model.

Each step samples answers to a batch of prompts (--generation_batches batches make one round of experience),
scores them with the reward model, subtracts a KL penalty against the frozen reference, computes GAE advantages
with the critic, then runs --ppo_epochs passes of clipped-PPO updates over minibatches of the experience
(plus, with --unsupervised_dataset_name, a language-modelling step on plain text per minibatch, scaled by
--unsup_coef). Saves `actor/`, `critic/` and, with --enable_ema, `actor_ema/` in --output_dir.
With --save_steps N a resumable checkpoint (both engines, the EMA, the KL controller, reward moments, minibatch
shuffler and metric history) is written between PPO rounds every N prompt batches, and --resume continues from
the latest one exactly as the uninterrupted run would have gone on.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from the clone: chatrlhf installs no packages
import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import itertools
import random
import time

from training.step3_rlhf_finetuning.arguments import parse_args
from training.step3_rlhf_finetuning.ppo_trainer import PPOTrainer
from training.step3_rlhf_finetuning.rlhf_engine import DeepSpeedRLHFEngine
from utils.data.data_utils import (DataCollatorRLHF, DataCollatorSFT, create_prompt_dataset,
                                   create_unsupervised_dataset, make_dataloader)
from utils.model.model_utils import is_reward_model_folder, load_tokenizer, resolve_model_path
from utils.model.save import save_hf_model
from utils.runtime.args import training_flags
from utils.runtime.checkpoint import (Checkpointer, CountingIterator, TrainingPosition, claim_output_dir,
                                      python_random_state, set_python_random_state)
from utils.runtime.dist import print_rank_0, to_device
from utils.runtime.engine import start_run, write_metrics
from utils.runtime.errors import ConfigError, cli_entry
from utils.runtime.monitor import Monitor, format_scalars


def resolve_step_models(args):
    """The actor must be a causal LM (step 1 output) and the critic a reward model (step 2 output)."""
    actor_path = resolve_model_path(args.actor_model_name_or_path)
    critic_path = resolve_model_path(args.critic_model_name_or_path)
    if is_reward_model_folder(actor_path):
        raise ConfigError(f"--actor_model_name_or_path {actor_path} is a reward model (step 2 output); pass the "
                          "step-1 actor")
    if not is_reward_model_folder(critic_path):
        raise ConfigError(f"--critic_model_name_or_path {critic_path} is not a reward model folder (step 2 output)")
    return actor_path, critic_path


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    start_time = time.time()
    _, world_size, device = start_run(args)

    # Data
    actor_path, critic_path = resolve_step_models(args)
    claim_output_dir(args, inputs={"--actor_model_name_or_path": actor_path,
                                   "--critic_model_name_or_path": critic_path},
                     model_dirs=[f"{args.output_dir}/{name}" for name in ("actor", "critic", "actor_ema")])
    tokenizer = load_tokenizer(actor_path, args.trust_remote_code)
    prompt_dataset, _ = create_prompt_dataset(args.data_path, args.data_split, args.data_output_path, 3, args.seed,
                                              tokenizer, args.max_prompt_seq_len)
    prompt_loader = make_dataloader(prompt_dataset, DataCollatorRLHF(tokenizer.pad_token_id),
                                    args.per_device_generation_batch_size, True, args.seed)
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
    total_steps = args.num_train_epochs * steps_per_epoch
    total_steps = min(total_steps, args.max_steps) if args.max_steps else total_steps
    minibatches = args.per_device_generation_batch_size // args.per_device_training_batch_size
    actor_steps, critic_steps = planned_optimizer_steps(args, total_steps)
    engine = DeepSpeedRLHFEngine(actor_path, critic_path, tokenizer, args, actor_steps, critic_steps, world_size)
    trainer = PPOTrainer(engine, args)
    print_rank_0(f"PPO: {len(prompt_dataset)} prompts, {total_steps} steps of {args.per_device_generation_batch_size}"
                 f" x {world_size} rollouts, {args.ppo_epochs} PPO epoch(s) of {minibatches} minibatch(es)")

    # Loop (resumed from the latest checkpoint with --resume; checkpoints are written between PPO rounds)
    position = TrainingPosition(prompt_loader)
    checkpointer = Checkpointer(args.output_dir, args.save_steps, args.save_total_limit,
                                {"actor": engine.actor, "critic": engine.critic}, position,
                                weights={"actor_ema": engine.actor_ema}, flags=training_flags(args, step=3))
    shuffler = random.Random(args.seed)
    history, experiences, step = [], [], 0
    resumed = checkpointer.resume() if args.resume else None
    if resumed:
        step, history = resumed["step"], resumed["history"]
        trainer.load_state_dict(resumed["trainer"])
        set_python_random_state(resumed["shuffler"], shuffler)
        if unsup_batches is not None:
            unsup_batches.skip(resumed["unsup_batches_drawn"])
    monitor = Monitor(args.enable_tensorboard, args.tensorboard_path, "step3_ppo")
    for epoch in position.epochs(args.num_train_epochs):
        for _, batch in position.batches(epoch):
            if step >= total_steps:
                break
            batch = to_device(batch, device)
            experiences.append(trainer.generate_experience(batch["prompt"], batch["prompt_att_mask"]))
            step += 1
            if len(experiences) < args.generation_batches:
                continue
            stats = trainer.train_round(experiences, unsup_batches, shuffler,
                                        train_actor=step > args.critic_warmup_steps * args.generation_batches)
            trainer.kl_controller.update(stats["kl"], args.per_device_generation_batch_size * world_size
                                         * args.generation_batches)
            stats["kl_coef"] = trainer.kl_controller.value
            history.append(stats)
            if step % args.print_interval == 0 or step == total_steps:
                recent = mean_stats(history[-max(1, args.print_interval // args.generation_batches):])
                window = f" (mean of the last {args.print_interval})" if args.print_interval > 1 else ""
                print_rank_0(f"epoch {epoch + 1} step {step}/{total_steps}{window}: {format_scalars(**recent)}")
            monitor.write(step, "ppo", **stats)
            if args.print_answers and step % args.print_answers_interval == 0:
                print_sample(experiences[0], tokenizer)
            experiences = []
            checkpointer.save_if_due(step, total_steps, {
                "history": history, "trainer": trainer.state_dict(), "shuffler": python_random_state(shuffler),
                "unsup_batches_drawn": unsup_batches.drawn if unsup_batches is not None else 0})
    monitor.close()

    # Save
    for name, model_engine in (("actor", engine.actor), ("critic", engine.critic), ("actor_ema", engine.actor_ema)):
        if model_engine is not None:
            save_hf_model(model_engine.module, tokenizer, f"{args.output_dir}/{name}",
                          model_engine.zero_optimization_stage())
    metrics = summarize(history, time.time() - start_time)
    metrics.update(actor_optimizer_steps=engine.actor.global_steps, actor_scheduled_steps=actor_steps,
                   critic_optimizer_steps=engine.critic.global_steps, critic_scheduled_steps=critic_steps)
    write_metrics(args.output_dir, metrics)
    print_rank_0(f"saved {args.output_dir}; {format_scalars(**metrics)}")


def planned_optimizer_steps(args, total_steps):
    """(actor, critic) optimizer steps of the run, the length of their learning-rate schedules.

    Each PPO round (--generation_batches prompt batches) makes ppo_epochs x (its rows / training batch) minibatch
    updates. The critic steps on every one; the actor skips the critic warm-up rounds and, with an unsupervised
    data set, takes a second (language-modelling) micro-step after each. DeepSpeed steps the optimizer once per
    --gradient_accumulation_steps micro-steps."""
    rounds = total_steps // args.generation_batches
    updates_per_round = (args.generation_batches * args.ppo_epochs
                         * (args.per_device_generation_batch_size // args.per_device_training_batch_size))
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


def mean_stats(rows):
    """The mean of each statistic over the rows that have it."""
    keys = dict.fromkeys(key for row in rows for key in row)
    return {key: sum(row[key] for row in rows if key in row) / sum(key in row for row in rows) for key in keys}


def summarize(history, wall_time):
    """Mean reward-model score and KL over the first and last tenth of the run, and the wall time."""
    if not history:
        return {"wall_time_s": wall_time}
    window = max(1, len(history) // 10)
    first, last = mean_stats(history[:window]), mean_stats(history[-window:])
    return {"score_start": first["score"], "score_end": last["score"], "reward_start": first["reward"],
            "reward_end": last["reward"], "kl_end": last["kl"], "answer_length_end": last["answer_length"],
            "eos_fraction_end": last["eos_fraction"], "steps": len(history), "wall_time_s": wall_time}


if __name__ == "__main__":
    main()
