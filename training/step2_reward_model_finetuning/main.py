"""Step 2: train a reward model on chosen/rejected pairs.

A base transformer with a scalar value head scores each sequence at its last real token (EOS included); the loss
is the Bradley-Terry pairwise loss -log sigmoid(r_chosen - r_rejected), averaged over pairs. Accuracy and the
mean chosen/rejected scores on the eval split are measured before training, every --eval_interval steps and at
the end. The result is a reward-model folder in --output_dir that step 3 and rw_eval.py load.
Checkpoints (--save_steps) and --resume work as in step 1, through the same loop (utils/trainer/loop.py).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from the clone: chatrlhf installs no packages

import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import torch

from utils.data.data_utils import DataCollatorReward
from utils.data.packing import DataCollatorPackedReward, check_keeps_samples_apart
from utils.model.model_utils import resolve_model_path
from utils.model.reward_model import RewardModel
from utils.rl.losses import pairwise_loss
from utils.runtime.args import ArgumentParser, add_num_padding_at_beginning_arg, add_step_args, parse_step_args
from utils.runtime.dist import to_device
from utils.runtime.errors import cli_entry
from utils.runtime.progress import eval_batches
from utils.trainer.engine import start_run, train_ds_config_from_args
from utils.trainer.loop import LoopState, make_loaders, save_run, step_data, step_engine


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    groups = add_step_args(parser, default_lr=3e-4, eval_interval=True, packing=True)
    add_num_padding_at_beginning_arg(groups["model"])
    return parse_step_args(parser, argv)


def evaluate_reward(engine, eval_loader, device, eval_iters=0):
    """Accuracy (chosen scored above rejected), the pairwise loss (what --early_stopping_patience and
    --load_best_model_at_end watch) and mean end scores over the eval split, all ranks together."""
    engine.eval()
    totals = torch.zeros(5, device=device)  # correct, loss sum, chosen score sum, rejected score sum, pairs
    with torch.no_grad():
        for batch in eval_batches(eval_loader, eval_iters):
            out = engine(**to_device(batch, device))
            chosen, rejected = out["chosen_end_scores"].float(), out["rejected_end_scores"].float()
            totals += torch.stack([(chosen > rejected).sum(), pairwise_loss(chosen, rejected) * len(chosen),
                                   chosen.sum(), rejected.sum(), torch.tensor(float(len(chosen)), device=device)])
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals)
    engine.train()
    correct, loss_sum, chosen_sum, rejected_sum, pairs = totals.tolist()
    pairs = max(pairs, 1.0)
    return {"accuracy": correct / pairs, "loss": loss_sum / pairs, "chosen_score": chosen_sum / pairs,
            "rejected_score": rejected_sum / pairs, "score_diff": (chosen_sum - rejected_sum) / pairs}


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    start_time, world_size, device = start_run(args)

    # Data
    model_path = resolve_model_path(args.model_name_or_path)
    tokenizer, train_dataset, eval_dataset = step_data(args, 2, {"--model_name_or_path": model_path})
    collator = (DataCollatorPackedReward(tokenizer.pad_token_id, args.max_seq_len) if args.packing
                else DataCollatorReward(tokenizer.pad_token_id))
    train_loader, eval_loader = make_loaders(args, train_dataset, eval_dataset, collator)

    # Model and engine
    ds_config = train_ds_config_from_args(args, world_size)
    model = RewardModel.from_pretrained(model_path, tokenizer, ds_config, args.dropout,
                                        args.num_padding_at_beginning, args.trust_remote_code)
    engine, total_steps = step_engine(model, ds_config, args, train_loader, eval_loader, world_size,
                                      f"reward model on {args.model_name_or_path}", rows="pairs")
    if args.packing:
        check_keeps_samples_apart(engine.module.rwtransformer)

    # Loop (resumed from the latest checkpoint with --resume)
    state = LoopState(args, engine, train_loader, world_size, step=2, run_name="step2_reward")

    def loss_and_stats(batch):
        out = engine(**batch)
        return out["loss"], {"batch_accuracy": (out["chosen_end_scores"] > out["rejected_end_scores"]).float().mean()}

    metrics = state.train(engine, args, total_steps, device,
                          evaluate=lambda: evaluate_reward(engine, eval_loader, device, args.eval_iters),
                          loss_and_stats=loss_and_stats, what="the reward-model loss")

    # Save
    save_run(engine, tokenizer, args, metrics, state, start_time)


if __name__ == "__main__":
    main()
