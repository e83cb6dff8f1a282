"""Step 2: train a reward model on chosen/rejected pairs.

A base transformer with a scalar value head scores each sequence at its last real token (EOS included); the loss
is the Bradley-Terry pairwise loss -log sigmoid(r_chosen - r_rejected), averaged over pairs. Accuracy and the
mean chosen/rejected scores on the eval split are measured before training, every --eval_interval steps and at
the end. The result is a reward-model folder in --output_dir that step 3 and rw_eval.py load.
With --save_steps N a resumable checkpoint is written every N optimizer steps (utils/runtime/checkpoint.py), and --resume
continues from the latest one exactly as the uninterrupted run would have gone on.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from the clone: chatrlhf installs no packages
import time

import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import torch

from utils.data.data_utils import (DataCollatorReward, create_prompt_dataset, data_bound, fit_auto_lengths,
                                   make_dataloader)
from utils.model.model_utils import count_parameters, load_tokenizer, resolve_model_path
from utils.model.reward_model import RewardModel
from utils.model.save import save_hf_model
from utils.runtime.args import (ArgumentParser, add_checkpoint_args, add_data_args, add_deepspeed_args,
                                add_eval_interval_args, add_logging_args, add_lora_args, add_model_args,
                                add_training_args, check_common_args, training_flags)
from utils.runtime.checkpoint import Checkpointer, TrainingPosition, claim_output_dir
from utils.runtime.dist import print_rank_0, to_device
from utils.runtime.engine import (count_training_steps, start_run, train_ds_config_from_args, train_engine_from_args,
                                  write_metrics)
from utils.runtime.errors import ConfigError, cli_entry
from utils.runtime.loop import train_loop
from utils.runtime.monitor import Monitor, Throughput, format_scalars


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    add_data_args(parser)
    model = add_model_args(parser)
    model.add_argument("--num_padding_at_beginning", type=int, default=0,
                       help="DeepSpeed-Chat's flag for OPT-style tokenizers, recorded in the saved config. The "
                            "end score is found from the attention mask, so padding never moves it.")
    add_training_args(parser, default_lr=3e-4)
    add_deepspeed_args(parser)
    add_lora_args(parser)
    add_eval_interval_args(add_logging_args(parser))
    add_checkpoint_args(parser)
    args = parser.parse_args(argv)
    check_common_args(args)
    if not args.output_dir:
        raise ConfigError("--output_dir is required")
    return args


def evaluate_reward(engine, eval_loader, device, eval_iters=0):
    """Accuracy (chosen scored above rejected) and mean end scores over the eval split, all ranks together."""
    engine.eval()
    totals = torch.zeros(4, device=device)  # correct, chosen score sum, rejected score sum, pairs
    with torch.no_grad():
        for step, batch in enumerate(eval_loader):
            if eval_iters and step >= eval_iters:
                break
            out = engine(**to_device(batch, device))
            chosen, rejected = out["chosen_end_scores"].float(), out["rejected_end_scores"].float()
            totals += torch.stack([(chosen > rejected).sum(), chosen.sum(), rejected.sum(),
                                   torch.tensor(float(len(chosen)), device=device)])
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals)
    engine.train()
    correct, chosen_sum, rejected_sum, pairs = totals.tolist()
    pairs = max(pairs, 1.0)
    return {"accuracy": correct / pairs, "chosen_score": chosen_sum / pairs, "rejected_score": rejected_sum / pairs,
            "score_diff": (chosen_sum - rejected_sum) / pairs}


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    start_time = time.time()
    _, world_size, device = start_run(args)

    # Data
    model_path = resolve_model_path(args.model_name_or_path)
    claim_output_dir(args, inputs={"--model_name_or_path": model_path})
    tokenizer = load_tokenizer(model_path, args.trust_remote_code)
    train_dataset, eval_dataset = create_prompt_dataset(args.data_path, args.data_split, args.data_output_path,
                                                        2, args.seed, tokenizer, data_bound(args.max_seq_len))
    fit_auto_lengths(args, args.data_path, tokenizer, train_dataset, eval_dataset)
    collator = DataCollatorReward(tokenizer.pad_token_id)
    train_loader = make_dataloader(train_dataset, collator, args.per_device_train_batch_size, True, args.seed)
    eval_loader = make_dataloader(eval_dataset, collator, args.per_device_eval_batch_size, False)

    # Model and engine
    ds_config = train_ds_config_from_args(args, world_size)
    model = RewardModel.from_pretrained(model_path, tokenizer, ds_config, args.dropout,
                                        args.num_padding_at_beginning, args.trust_remote_code)
    total_steps = count_training_steps(len(train_loader), args.gradient_accumulation_steps, args.num_train_epochs,
                                       args.max_steps)
    engine = train_engine_from_args(model, ds_config, args, total_steps)
    print_rank_0(f"reward model on {args.model_name_or_path}: {count_parameters(model) / 1e6:.2f}M parameters, "
                 f"{args.dtype}, ZeRO-{args.zero_stage}, {world_size} process(es); {len(train_dataset)} train / "
                 f"{len(eval_dataset)} eval pairs; {total_steps} optimizer steps")

    # Loop (resumed from the latest checkpoint with --resume)
    position = TrainingPosition(train_loader)
    checkpointer = Checkpointer(args.output_dir, args.save_steps, args.save_total_limit, {"model": engine}, position,
                                flags=training_flags(args, step=2))
    resumed = checkpointer.resume() if args.resume else None
    monitor = Monitor(args.enable_tensorboard, args.tensorboard_path, "step2_reward")
    throughput = Throughput(model.config, world_size, args.gradient_checkpointing, args.lora_dim)

    def run_eval(when):
        scores = evaluate_reward(engine, eval_loader, device, args.eval_iters)
        print_rank_0(f"eval {when}: {format_scalars(**scores)}")
        monitor.write(engine.global_steps, "eval", **scores)
        return scores

    if resumed:
        metrics = resumed["metrics"]
    else:
        metrics = {f"{k}_before": v for k, v in run_eval("before training").items()}

    def loss_and_stats(batch):
        out = engine(**batch)
        return out["loss"], {"batch_accuracy": (out["chosen_end_scores"] > out["rejected_end_scores"]).float().mean()}

    train_loop(engine, position, args, total_steps, device, loss_and_stats=loss_and_stats, throughput=throughput,
               monitor=monitor, checkpointer=checkpointer, checkpoint_state={"metrics": metrics}, run_eval=run_eval,
               what="the reward-model loss")
    metrics.update({f"{k}_after": v for k, v in run_eval("after training").items()})
    metrics.update(optimizer_steps=engine.global_steps, parameters=count_parameters(model),
                   wall_time_s=time.time() - start_time)
    monitor.close()

    # Save
    save_hf_model(engine.module, tokenizer, args.output_dir, args.zero_stage)
    write_metrics(args.output_dir, metrics)
    print_rank_0(f"saved {args.output_dir}; {format_scalars(**metrics)}")


if __name__ == "__main__":
    main()
