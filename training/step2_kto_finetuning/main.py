"""Step 2 (KTO): train the step-1 actor on answers labelled desirable or undesirable, one by one, without pairs, a
reward model or PPO.

The policy starts from --model_name_or_path (the step-1 actor); a frozen reference (the same weights, or
--ref_model_name_or_path) scores the same answers. The data is phase 2 of --data_split read as unpaired feedback:
rows {"prompt", "completion", "label"} (utils/data/pair_formats.py), and every chosen/rejected pair as one desirable
answer and one undesirable one. Log-probs are summed over answer tokens only, EOS included, and the loss is
utils/rl/kto.py's (Ethayarajh et al. 2024):

    r    = log pi(y|x) - log ref(y|x)
    loss = mean over the batch of  lambda_D (1 - sigmoid(beta (r - z_0)))   for a desirable answer
                                   lambda_U (1 - sigmoid(beta (z_0 - r)))   for an undesirable one

with lambda_D = --desirable_weight, lambda_U = --undesirable_weight, and z_0 the batch's estimate of KL(pi || ref):
the mean log-ratio of each prompt with the answer of another row of the batch, over all ranks, clamped at 0, with
no gradient. Loss, z_0 and the rewards beta r of either kind on the eval split are measured before training, every
--eval_interval steps and at the end. The result is a Hugging Face folder in --output_dir (the KTO actor, for
step 1's prompt_eval.py or chat.py). --save_steps and --resume work as in steps 1 and 2 (utils/trainer/loop.py).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from the clone: chatrlhf installs no packages
import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split

import torch

from utils.data.data_utils import DataCollatorFeedback
from utils.model.model_utils import answer_sequence_logprobs, create_hf_model, resolve_model_path
from utils.rl.kto import kto_kl_estimate, kto_loss
from utils.runtime.args import parse_step_args
from utils.runtime.dist import all_reduce_mean, print_rank_0
from utils.runtime.errors import cli_entry
from utils.trainer.engine import start_run, train_ds_config_from_args
from utils.trainer.frozen import add_beta_arg, load_reference, reference_stage_parser, resolve_reference_path
from utils.trainer.loop import LoopState, evaluate_mean, make_loaders, save_run, step_data, step_engine


def parse_args(argv=None):
    parser = reference_stage_parser(__doc__.splitlines()[0])
    kto = parser.add_argument_group("KTO loss")
    add_beta_arg(kto, help="Scale of the log-ratio reward r = log pi(y|x) - log ref(y|x) inside the sigmoid; default "
                           "%(default)s.")
    kto.add_argument("--desirable_weight", type=float, default=1.0,
                     help="lambda_D, the weight of the desirable answers' losses (> 0); the paper keeps lambda_D x "
                          "their number / (lambda_U x the undesirable ones') in [1, 4/3]; default %(default)s.")
    kto.add_argument("--undesirable_weight", type=float, default=1.0,
                     help="lambda_U, the weight of the undesirable answers' losses (> 0); default %(default)s.")
    return parse_step_args(parser, argv)


# ---- log-probs and the loss ----------------------------------------------------------------------------------------


def answer_logps(engine, batch, prefix=""):
    """log pi(y|x) of every row of a feedback batch, summed over the answer's tokens, EOS included (prefix "kl_":
    of its mismatched rows). (B,)"""
    return answer_sequence_logprobs(engine, batch[f"{prefix}input_ids"], batch[f"{prefix}attention_mask"],
                                    batch[f"{prefix}answer_mask"])


def feedback_batch_loss(policy, reference, batch, args):
    """The KTO loss of one batch of labelled answers and its stats (utils/rl/kto.py), with the mean log-probs of
    either kind beside them. The reference's log-probs and the KL estimate z_0 (the policy's too) carry no
    gradient."""
    logps = answer_logps(policy, batch)
    with torch.no_grad():
        ref_logps = answer_logps(reference, batch)
        kl = kto_kl_estimate(answer_logps(policy, batch, "kl_"), answer_logps(reference, batch, "kl_"),
                             batch_mean=all_reduce_mean)
    desirable = batch["desirable"]
    loss, stats = kto_loss(logps, ref_logps, desirable, kl, args.beta, args.desirable_weight,
                           args.undesirable_weight)
    for name, kind in (("desirable_logps", desirable), ("undesirable_logps", ~desirable)):
        stats[name] = (logps.detach() * kind).sum() / kind.sum().clamp(min=1)
    return loss, stats


def weights_note(dataset, args):
    """One line on lambda_D n_D / (lambda_U n_U), which the paper keeps in [1, 4/3]."""
    desirable = sum(sample["desirable"] for sample in dataset)
    undesirable = len(dataset) - desirable
    ratio = args.desirable_weight * desirable / max(args.undesirable_weight * undesirable, 1e-12)
    return (f"{desirable} desirable / {undesirable} undesirable train answers: lambda_D n_D / (lambda_U n_U) = "
            f"{ratio:.3g} (the paper keeps it in [1, 4/3]: --desirable_weight, --undesirable_weight)")


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    start_time, world_size, device = start_run(args)

    # Data: phase 2's rows as labelled answers
    model_path = resolve_model_path(args.model_name_or_path)
    ref_path = resolve_reference_path(args, model_path)
    tokenizer, train_dataset, eval_dataset = step_data(args, 2, {"--model_name_or_path": model_path,
                                                                 "--ref_model_name_or_path": ref_path}, unpaired=True)
    print_rank_0(weights_note(train_dataset, args))
    train_loader, eval_loader = make_loaders(args, train_dataset, eval_dataset,
                                             DataCollatorFeedback(tokenizer.pad_token_id))

    # Reference, then policy and engine
    reference = load_reference(ref_path, tokenizer, args, world_size)
    ds_config = train_ds_config_from_args(args, world_size)
    from transformers import AutoModelForCausalLM

    model = create_hf_model(AutoModelForCausalLM, model_path, tokenizer, ds_config, args.dropout,
                            args.trust_remote_code)
    engine, total_steps = step_engine(model, ds_config, args, train_loader, eval_loader, world_size,
                                      f"KTO (beta {args.beta}) on {args.model_name_or_path}", rows="answers")

    # Loop (resumed from the latest checkpoint with --resume)
    state = LoopState(args, engine, train_loader, world_size, step="kto", run_name="step2_kto")
    def loss_and_stats(batch):
        return feedback_batch_loss(engine, reference, batch, args)

    metrics = state.train(engine, args, total_steps, device, loss_and_stats=loss_and_stats, what="the KTO loss",
                          evaluate=lambda: evaluate_mean(engine, eval_loader, device, args.eval_iters, loss_and_stats,
                                                         rows=lambda batch: batch["input_ids"].shape[0]))

    # Save
    save_run(engine, tokenizer, args, metrics, state, start_time)


if __name__ == "__main__":
    main()
