"""Step 1: supervised fine-tuning of a causal language model on prompt + chosen answer.

The loss counts answer tokens only (prompt and padding are labelled -100). Perplexity on the eval split is
measured before training and after every epoch, or with --eval_interval every so many steps (where
--early_stopping_patience may stop the run) and at the end. The result is a Hugging Face folder in --output_dir.
With --save_steps N a resumable checkpoint is written every N optimizer steps (utils/trainer/checkpoint.py), and
--resume continues from the latest one exactly as the uninterrupted run would have gone on. The loop is the one
steps 2 and DPO share (utils/trainer/loop.py).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from the clone: chatrlhf installs no packages
import math

import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import torch

from inference.evaluation import evaluate_models, validation_set
from utils.data.data_utils import DataCollatorSFT
from utils.data.packing import DataCollatorPackedSFT, check_keeps_samples_apart
from utils.model.model_utils import causal_lm_loss, create_hf_model, resolve_model_path
from utils.runtime.args import AUTO, ArgumentParser, add_eval_prompts_arg, add_step_args, parse_step_args
from utils.runtime.dist import to_device
from utils.runtime.errors import ConfigError, cli_entry
from utils.runtime.progress import eval_batches
from utils.trainer.engine import start_run, train_ds_config_from_args
from utils.trainer.loop import LoopState, make_loaders, save_run, step_data, step_engine


STOPPING_METRICS = {
    "loss": "the eval loss (the default)",
    "score": "the data's checker (the built-in task's, a reasoning-gym verifier) on greedy answers to the first "
             "--eval_prompts questions no step trains on and the closing evaluation never reads (a reasoning-gym "
             "spec's eval part, the built-in task's eval split), taken at each evaluation: the skill, not the loss; "
             "it counts as improving while the eval loss does (a task the model rarely solves yet keeps a flat "
             "score), and of two equal scores the one with the lower loss is the better",
}
"""What --early_stopping_patience may watch in step 1."""


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    groups = add_step_args(parser, eval_interval=True, packing=True)
    parser.add_argument("--train_every_turn", action="store_true",
                        help="A multi-turn conversation trains each of its assistant turns, each a sample with the "
                             "turns before it as its prompt (TRL's assistant-only loss, OpenRLHF's --multiturn); "
                             "default: its last answer, the earlier ones context, as DeepSpeed-Chat.")
    logging = groups["logging"]
    logging.add_argument("--early_stopping_metric", choices=list(STOPPING_METRICS), default="loss",
                         help="What --early_stopping_patience watches: "
                              + "; ".join(f"{name}: {what}" for name, what in STOPPING_METRICS.items()) + ".")
    add_eval_prompts_arg(logging, 64, "With --early_stopping_metric score: the questions each evaluation answers "
                                      "(greedily, up to twice the 95th percentile of the reference answers' lengths).")
    return parse_step_args(parser, argv, check=check_args)


def check_args(args):
    if args.early_stopping_metric == "score" and not args.early_stopping_patience:
        raise ConfigError("--early_stopping_metric score needs --early_stopping_patience > 0: the evaluations it "
                          "counts")
    # the score's answer length, the data's (utils.data.data_utils.fit_auto_lengths); no answers, nothing to measure
    args.max_new_tokens = AUTO if args.early_stopping_metric == "score" else None


def validation(args):
    """(prompts, checker) --early_stopping_metric score answers and scores; None for the eval loss."""
    if args.early_stopping_metric != "score":
        return None
    found = validation_set(args.data_path, args.seed)
    if found is None:
        raise ConfigError(f"--early_stopping_metric score needs data with a checker and questions no step trains "
                          f"on (builtin, or one reasoning_gym: spec); --data_path {' '.join(args.data_path)} "
                          "has none")
    prompts, checker = found
    return prompts[:args.eval_prompts], checker


def evaluate(engine, tokenizer, eval_loader, device, args, questions):
    """evaluate_perplexity's figures, and with `questions` (prompts, checker) "score": the checker's mean on greedy
    answers to them (every rank answers all of them: ZeRO-3 gathers weights collectively; random states are left
    as they were)."""
    scores = evaluate_perplexity(engine, eval_loader, device, args.eval_iters)
    if questions is not None:
        prompts, checker = questions
        engine.eval()
        with torch.random.fork_rng(devices=[]):
            result = evaluate_models({"actor": (engine.module, tokenizer)}, prompts, greedy_only=True,
                                     max_new_tokens=args.max_new_tokens, seed=args.seed, checker=checker)
        engine.train()
        scores["score"] = result["actor"]["greedy"]["all"]
    return scores


def evaluate_perplexity(engine, eval_loader, device, eval_iters=0):
    """{"perplexity", "loss"} over the eval split (or its first `eval_iters` batches; all ranks): loss = the mean
    loss per answer token, perplexity = exp(loss)."""
    engine.eval()
    loss_sum = torch.zeros((), device=device)
    token_count = torch.zeros((), device=device)
    with torch.no_grad():
        for batch in eval_batches(eval_loader, eval_iters):
            batch = to_device(batch, device)
            tokens = (batch["labels"][:, 1:] != -100).sum()
            loss_sum += causal_lm_loss(engine, batch).float() * tokens
            token_count += tokens
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(loss_sum)
        torch.distributed.all_reduce(token_count)
    engine.train()
    mean_loss = (loss_sum / token_count.clamp(min=1)).item()
    return {"perplexity": math.exp(min(mean_loss, 50.0)), "loss": mean_loss}


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    start_time, world_size, device = start_run(args)

    # Data
    model_path = resolve_model_path(args.model_name_or_path)
    questions = validation(args)
    tokenizer, train_dataset, eval_dataset = step_data(args, 1, {"--model_name_or_path": model_path})
    collator = (DataCollatorPackedSFT(tokenizer.pad_token_id, args.max_seq_len) if args.packing
                else DataCollatorSFT(tokenizer.pad_token_id))
    train_loader, eval_loader = make_loaders(args, train_dataset, eval_dataset, collator)

    # Model and engine
    from transformers import AutoModelForCausalLM

    ds_config = train_ds_config_from_args(args, world_size)
    model = create_hf_model(AutoModelForCausalLM, model_path, tokenizer, ds_config, args.dropout,
                            args.trust_remote_code)
    engine, total_steps = step_engine(model, ds_config, args, train_loader, eval_loader, world_size,
                                      f"model {args.model_name_or_path}")
    if args.packing:
        check_keeps_samples_apart(engine.module)

    # Loop (resumed from the latest checkpoint with --resume): perplexity (and the score) before training, every
    # --eval_interval steps and at the end; without --eval_interval after each epoch instead
    state = LoopState(args, engine, train_loader, world_size, step=1, run_name="step1_sft")
    metrics = state.train(engine, args, total_steps, device,
                          evaluate=lambda: evaluate(engine, tokenizer, eval_loader, device, args, questions),
                          loss_and_stats=lambda batch: (causal_lm_loss(engine, batch), {}), eval_each_epoch=True)

    # Save
    save_run(engine, tokenizer, args, metrics, state, start_time)


if __name__ == "__main__":
    main()
