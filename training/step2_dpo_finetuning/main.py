"""Step 2 (DPO): train the step-1 actor on chosen/rejected pairs directly, without a reward model or PPO.

The policy starts from --model_name_or_path (the step-1 actor); a frozen reference (the same weights, or
--ref_model_name_or_path) scores the same answers. Log-probs are summed over answer tokens only, EOS included
(`answer_sequence_logprobs` in utils/model/model_utils.py), and the loss is a row of utils/rl/preference_losses.py
(--loss_type), among them:

    sigmoid  DPO: -log sigmoid(beta * (log-ratio margin)), with --label_smoothing for conservative DPO
    ipo      IPO: (log-ratio margin - 1 / (2 beta))^2
    simpo    SimPO: length-normalised log-probs, no reference, margin --simpo_gamma
    orpo     ORPO: the chosen answers' NLL + beta x the odds-ratio term, no reference: it trains a base model (the
             orpo algorithm of train.py, which skips step 1)

where the log-ratio margin is (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l)). The reference runs in
eval mode under no_grad, once per batch, or once for the whole data set before training with
--precompute_ref_logps (then it is freed, so training holds one model). Pairs come from the same data sources and
split as step 2 (phase 2 of --data_split). Loss, accuracy, chosen/rejected rewards, margins and log-probs on the
eval split are measured before training, every --eval_interval steps and at the end. The result is a Hugging
Face folder in --output_dir (the DPO actor, for step-1's prompt_eval.py or chat.py).
--save_steps and --resume work as in steps 1 and 2 (utils/trainer/loop.py).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from the clone: chatrlhf installs no packages
import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import gc
import time

import torch

from utils.data.data_utils import DataCollatorPreference, ListDataset
from utils.model.model_utils import answer_sequence_logprobs, create_hf_model, resolve_model_path
from utils.rl.losses import chosen_nll
from utils.rl.preference_losses import PREFERENCE_LOSSES, preference_loss
from utils.runtime.args import parse_step_args, registry_help
from utils.runtime.dist import print_rank_0, to_device
from utils.runtime.errors import ConfigError, cli_entry
from utils.runtime.progress import progress
from utils.trainer.engine import start_run, train_ds_config_from_args
from utils.trainer.frozen import add_beta_arg, load_reference, reference_stage_parser, resolve_reference_path
from utils.trainer.loop import LoopState, evaluate_mean, make_loaders, save_run, step_data, step_engine


def parse_args(argv=None):
    parser = reference_stage_parser(__doc__.splitlines()[0])
    dpo = parser.add_argument_group("preference loss")
    dpo.add_argument("--loss_type", type=str, default="sigmoid", choices=tuple(PREFERENCE_LOSSES),
                     help="The loss on each pair; default %(default)s. " +
                          registry_help(PREFERENCE_LOSSES, "utils/rl/preference_losses.py"))
    add_beta_arg(dpo, help="DPO/IPO: scale of the log-ratio reward (IPO's tau); SimPO: scale of the mean log-prob; "
                           "ORPO: the weight lambda of the odds-ratio term.")
    dpo.add_argument("--label_smoothing", type=float, default=0.0,
                     help="Conservative DPO: the probability that a pair's preference label is wrong (0 <= eps < "
                          f"0.5); {_names(name for name, row in PREFERENCE_LOSSES.items() if row.label_smoothing)} "
                          "only.")
    dpo.add_argument("--simpo_gamma", type=float, default=0.5, help="SimPO's target reward margin.")
    dpo.add_argument("--rpo_alpha", type=float, default=0.0,
                     help="Weight of the chosen answers' per-token negative log-likelihood added to the loss (RPO, "
                          "TRL's rpo_alpha; 0: none). Keeps chosen log-probs from falling with the rejected ones'.")
    dpo.add_argument("--precompute_ref_logps", action="store_true",
                     help="Compute the reference's log-probs of every train and eval pair once before training, "
                          "then free the reference.")
    return parse_step_args(parser, argv, check=check_dpo_args)


def _names(names):
    """'a', 'a and b', 'a, b and c'."""
    names = list(names)
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]])) if names else ""


def check_dpo_args(args):
    """How the flags combine with the loss (the ranges of single flags are checked first: FLAG_RANGES)."""
    row = PREFERENCE_LOSSES[args.loss_type]
    if args.label_smoothing > 0 and not row.label_smoothing:
        smoothed = _names(name for name, other in PREFERENCE_LOSSES.items() if other.label_smoothing)
        raise ConfigError(f"--label_smoothing applies to --loss_type {smoothed}, not {args.loss_type}")
    if not row.needs_reference:
        given = [flag for flag, value in (("--ref_model_name_or_path", args.ref_model_name_or_path),
                                          ("--precompute_ref_logps", args.precompute_ref_logps),
                                          ("--offload_reference_model", args.offload_reference_model)) if value]
        if given:
            raise ConfigError(f"--loss_type {args.loss_type} uses no reference model: drop {', '.join(given)}")


def uses_reference(args):
    """Whether the loss compares with a frozen reference (DPO then loads one, or precomputes its log-probs)."""
    return PREFERENCE_LOSSES[args.loss_type].needs_reference


# ---- log-probs and the loss ----------------------------------------------------------------------------------------


def answer_logps(engine, batch):
    """log pi(y|x) of every row of a preference batch (chosen rows, then rejected rows), summed over the answer's
    tokens, EOS included. (2B,)"""
    return answer_sequence_logprobs(engine, batch["input_ids"], batch["attention_mask"], batch["answer_mask"])


def reference_logps(reference, batch):
    """The reference's answer log-probs: precomputed ones when the batch carries them, else computed now (the
    reference is an eval-mode frozen engine, under no_grad); None without a reference (SimPO)."""
    if "ref_logps" in batch:
        return batch["ref_logps"]
    if reference is None:
        return None
    with torch.no_grad():
        return answer_logps(reference, batch)


def preference_batch_loss(policy, reference, batch, args):
    """The loss of one batch of pairs and its stats (utils/rl/losses.py), with the mean chosen and rejected
    answer log-probs of the policy beside them."""
    logps = answer_logps(policy, batch)
    ref_logps = reference_logps(reference, batch)
    lengths = batch["answer_mask"].sum(dim=-1)
    pairs = logps.shape[0] // 2
    ref_chosen, ref_rejected = (None, None) if ref_logps is None else (ref_logps[:pairs], ref_logps[pairs:])
    loss, stats = preference_loss(args.loss_type, logps[:pairs], logps[pairs:], ref_chosen, ref_rejected,
                                  lengths[:pairs], lengths[pairs:], args)
    if args.rpo_alpha:
        nll = chosen_nll(logps[:pairs], lengths[:pairs])
        loss = loss + args.rpo_alpha * nll
        stats["chosen_nll"] = nll.detach()
    stats.update(chosen_logps=logps[:pairs].detach().mean(), rejected_logps=logps[pairs:].detach().mean())
    return loss, stats


def evaluate_preference(policy, reference, eval_loader, device, args):
    """Loss and stats averaged over the pairs of the eval split (or its first --eval_iters batches), all ranks."""
    return evaluate_mean(policy, eval_loader, device, args.eval_iters,
                         lambda batch: preference_batch_loss(policy, reference, batch, args),
                         rows=lambda batch: batch["input_ids"].shape[0] // 2)


# ---- the reference ---------------------------------------------------------------------------------------------


def with_reference_logps(dataset, reference, collator, batch_size, device):
    """A copy of `dataset` (its row counts and split kept) whose pairs carry the reference's answer log-probs
    (`ref_chosen_logps`, `ref_rejected_logps`). Each rank scores its share of the pairs (all ranks the same number
    of batches, as ZeRO-3 needs) and the shares are gathered, so every rank gets them all."""
    from torch.utils.data import DistributedSampler

    distributed = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
    share = list(DistributedSampler(dataset, shuffle=False)) if distributed else list(range(len(dataset)))
    rows = []
    for start in progress(range(0, len(share), batch_size), desc="reference log-probs", unit="batch"):
        indices = share[start:start + batch_size]
        batch = to_device(collator([dataset[i] for i in indices]), device)
        logps = reference_logps(reference, batch).double()
        rows.append(torch.stack([torch.tensor(indices, dtype=torch.float64, device=device), logps[:len(indices)],
                                 logps[len(indices):]], dim=1))
    table = torch.cat(rows)
    if distributed:
        gathered = [torch.empty_like(table) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(gathered, table)
        table = torch.cat(gathered)
    logps = {int(index): (chosen, rejected) for index, chosen, rejected in table.cpu().tolist()}
    return ListDataset([{**dataset[i], "ref_chosen_logps": logps[i][0], "ref_rejected_logps": logps[i][1]}
                        for i in range(len(dataset))], dataset.counts, dataset.split)


def precompute_reference_logps(datasets, ref_path, tokenizer, collator, args, world_size, device):
    """`datasets` with the reference's log-probs in every pair; the reference is loaded for this and freed after."""
    start = time.time()
    reference = load_reference(ref_path, tokenizer, args, world_size)
    datasets = [with_reference_logps(dataset, reference, collator, args.per_device_eval_batch_size, device)
                for dataset in datasets]
    reference.destroy()
    del reference
    gc.collect()
    print_rank_0(f"reference log-probs of {' + '.join(str(len(d)) for d in datasets)} pairs precomputed in "
                 f"{time.time() - start:.1f} s; reference freed")
    return datasets


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    start_time, world_size, device = start_run(args)

    # Data
    model_path = resolve_model_path(args.model_name_or_path)
    ref_path = resolve_reference_path(args, model_path) if uses_reference(args) else None
    inputs = {"--model_name_or_path": model_path, **({"--ref_model_name_or_path": ref_path} if ref_path else {})}
    tokenizer, train_dataset, eval_dataset = step_data(args, 2, inputs)
    collator = DataCollatorPreference(tokenizer.pad_token_id)

    # Reference, then policy and engine
    reference = None
    if args.precompute_ref_logps:
        train_dataset, eval_dataset = precompute_reference_logps([train_dataset, eval_dataset], ref_path, tokenizer,
                                                                 collator, args, world_size, device)
    elif uses_reference(args):
        reference = load_reference(ref_path, tokenizer, args, world_size)
    train_loader, eval_loader = make_loaders(args, train_dataset, eval_dataset, collator)
    ds_config = train_ds_config_from_args(args, world_size)
    from transformers import AutoModelForCausalLM

    model = create_hf_model(AutoModelForCausalLM, model_path, tokenizer, ds_config, args.dropout,
                            args.trust_remote_code)
    engine, total_steps = step_engine(model, ds_config, args, train_loader, eval_loader, world_size,
                                      f"DPO ({args.loss_type}, beta {args.beta}) on {args.model_name_or_path}",
                                      rows="pairs")

    # Loop (resumed from the latest checkpoint with --resume)
    state = LoopState(args, engine, train_loader, world_size, step="dpo", run_name="step2_dpo")
    metrics = state.train(engine, args, total_steps, device,
                          evaluate=lambda: evaluate_preference(engine, reference, eval_loader, device, args),
                          loss_and_stats=lambda batch: preference_batch_loss(engine, reference, batch, args),
                          what=f"the {args.loss_type} loss")

    # Save
    save_run(engine, tokenizer, args, metrics, state, start_time)


if __name__ == "__main__":
    main()
