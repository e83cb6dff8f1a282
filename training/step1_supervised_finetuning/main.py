"""Step 1: supervised fine-tuning of a causal language model on prompt + chosen answer.

The loss counts answer tokens only (prompt and padding are labelled -100). Perplexity on the eval split is
measured before training and after every epoch. The result is a Hugging Face folder in --output_dir.
With --save_steps N a resumable checkpoint is written every N optimizer steps (utils/runtime/checkpoint.py), and --resume
continues from the latest one exactly as the uninterrupted run would have gone on.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from the clone: chatrlhf installs no packages
import math
import time

import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import torch

from utils.data.data_utils import (DataCollatorSFT, create_prompt_dataset, data_bound, fit_auto_lengths,
                                   make_dataloader)
from utils.model.model_utils import count_parameters, create_hf_model, load_tokenizer, resolve_model_path
from utils.model.save import save_hf_model
from utils.runtime.args import (ArgumentParser, add_checkpoint_args, add_data_args, add_deepspeed_args,
                                add_logging_args, add_lora_args, add_model_args, add_training_args, check_common_args,
                                training_flags)
from utils.runtime.checkpoint import Checkpointer, TrainingPosition, claim_output_dir
from utils.runtime.dist import all_reduce_mean, assert_finite, print_rank_0, to_device
from utils.runtime.engine import (count_training_steps, start_run, train_ds_config_from_args, train_engine_from_args,
                                  write_metrics)
from utils.runtime.errors import ConfigError, cli_entry
from utils.runtime.monitor import Monitor, Throughput, format_scalars


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    add_data_args(parser)
    add_model_args(parser)
    add_training_args(parser)
    add_deepspeed_args(parser)
    add_lora_args(parser)
    add_logging_args(parser)
    add_checkpoint_args(parser)
    args = parser.parse_args(argv)
    check_common_args(args)
    if not args.output_dir:
        raise ConfigError("--output_dir is required")
    return args


def evaluate_perplexity(engine, eval_loader, device):
    """exp of the mean loss per answer token over the whole eval split (all ranks)."""
    engine.eval()
    loss_sum = torch.zeros((), device=device)
    token_count = torch.zeros((), device=device)
    with torch.no_grad():
        for batch in eval_loader:
            batch = to_device(batch, device)
            tokens = (batch["labels"][:, 1:] != -100).sum()
            loss_sum += engine(**batch, use_cache=False).loss.float() * tokens
            token_count += tokens
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(loss_sum)
        torch.distributed.all_reduce(token_count)
    engine.train()
    mean_loss = (loss_sum / token_count.clamp(min=1)).item()
    return math.exp(min(mean_loss, 50.0)), mean_loss


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
                                                        1, args.seed, tokenizer, data_bound(args.max_seq_len))
    fit_auto_lengths(args, args.data_path, tokenizer, train_dataset, eval_dataset)
    collator = DataCollatorSFT(tokenizer.pad_token_id)
    train_loader = make_dataloader(train_dataset, collator, args.per_device_train_batch_size, True, args.seed)
    eval_loader = make_dataloader(eval_dataset, collator, args.per_device_eval_batch_size, False)

    # Model and engine
    ds_config = train_ds_config_from_args(args, world_size)
    model = create_hf_model(_causal_lm_class(), model_path, tokenizer, ds_config, args.dropout,
                            args.trust_remote_code)
    total_steps = count_training_steps(len(train_loader), args.gradient_accumulation_steps, args.num_train_epochs,
                                       args.max_steps)
    engine = train_engine_from_args(model, ds_config, args, total_steps)
    print_rank_0(f"model {args.model_name_or_path}: {count_parameters(model) / 1e6:.2f}M parameters, "
                 f"{args.dtype}, ZeRO-{args.zero_stage}, {world_size} process(es); {len(train_dataset)} train / "
                 f"{len(eval_dataset)} eval samples; {total_steps} optimizer steps")

    # Loop (resumed from the latest checkpoint with --resume)
    position = TrainingPosition(train_loader)
    checkpointer = Checkpointer(args.output_dir, args.save_steps, args.save_total_limit, {"model": engine}, position,
                                flags=training_flags(args, step=1))
    resumed = checkpointer.resume() if args.resume else None
    monitor = Monitor(args.enable_tensorboard, args.tensorboard_path, "step1_sft")
    throughput = Throughput(model.config, world_size, args.gradient_checkpointing, args.lora_dim)
    if resumed:
        metrics = resumed["metrics"]
    else:
        perplexity, eval_loss = evaluate_perplexity(engine, eval_loader, device)
        metrics = {"perplexity_before": perplexity}
        print_rank_0(f"eval before training: perplexity {perplexity:.4f} (loss {eval_loss:.4f})")
        monitor.write(0, "eval", perplexity=perplexity, loss=eval_loss)
    for epoch in position.epochs(args.num_train_epochs):
        train_one_epoch(engine, position.batches(epoch), len(train_loader), device, args, epoch, monitor,
                        throughput, total_steps, save_checkpoint_if_due=lambda step: checkpointer.save_if_due(
                            step, total_steps, {"metrics": metrics}))
        perplexity, eval_loss = evaluate_perplexity(engine, eval_loader, device)
        print_rank_0(f"eval after epoch {epoch + 1}/{args.num_train_epochs}: perplexity {perplexity:.4f} "
                     f"(loss {eval_loss:.4f})")
        monitor.write(engine.global_steps, "eval", perplexity=perplexity, loss=eval_loss)
        if engine.global_steps >= total_steps:
            break
    metrics.update(perplexity_after=perplexity, optimizer_steps=engine.global_steps,
                   parameters=count_parameters(model), wall_time_s=time.time() - start_time)
    monitor.close()

    # Save
    save_hf_model(engine.module, tokenizer, args.output_dir, args.zero_stage)
    write_metrics(args.output_dir, metrics)
    print_rank_0(f"saved {args.output_dir}; {format_scalars(**metrics)}")


def train_one_epoch(engine, batches, num_batches, device, args, epoch, monitor, throughput, total_steps,
                    save_checkpoint_if_due):
    """Train on `batches` ((micro_step, batch) pairs of this epoch) until the epoch or the run ends; after each
    optimizer step, `save_checkpoint_if_due(step)`."""
    from tqdm import tqdm

    engine.train()
    progress = tqdm(batches, total=num_batches, desc=f"epoch {epoch + 1}", disable=not _show_progress(),
                    mininterval=2.0)
    for micro_step, batch in progress:
        if engine.global_steps >= total_steps:  # a run resumed from its last checkpoint has nothing left
            break
        batch = to_device(batch, device)
        step_start = time.perf_counter()
        loss = engine(**batch, use_cache=False).loss
        assert_finite(loss, "the training loss")
        engine.backward(loss)
        engine.step()
        throughput.add(time.perf_counter() - step_start, *batch["input_ids"].shape,
                       int(batch["attention_mask"].sum()))
        if (micro_step + 1) % args.gradient_accumulation_steps != 0:
            continue
        step = engine.global_steps
        if step % args.print_interval == 0 or step == total_steps:
            mean_loss = all_reduce_mean(loss.detach().float()).item()
            lr = engine.lr_scheduler.get_last_lr()[0]
            progress.set_postfix(loss=f"{mean_loss:.4f}")
            print_rank_0(f"epoch {epoch + 1} step {step}/{total_steps}: {format_scalars(loss=mean_loss, lr=lr)}")
            monitor.write(step, "train", loss=mean_loss, lr=lr, **throughput.report())
        save_checkpoint_if_due(step)
        if step >= total_steps:
            break


def _causal_lm_class():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM


def _show_progress():
    import sys

    from utils.runtime.dist import is_rank_0

    return is_rank_0() and sys.stderr.isatty()


if __name__ == "__main__":
    main()
