"""The fused output layer (utils/rl/head_logprobs.py through utils/model/model_utils.py) against the model's full
logits (`plain_output_layer`), on the same engine and batches in alternation, for each bench model:

  - step 1: one engine built as step 1 builds it takes its training steps (`engine_train_step`, step 1's loss)
    fused and plain in turn, on step 1's batches (bench/step1.py CASES): train tokens/s, and the largest
    difference of the two's losses on the same batch before training;
  - step 3: the actor's update pass of a PPO minibatch (`answer_logprobs` at the rollout temperature with the
    entropy, a loss on them, backward): GROUPS' answer groups or ROWS' distinct prompts, random tokens, answer
    tokens/s.
"""
import torch

from bench.measure import paired_rates, timed
from bench.models import model_path
from bench.step1 import CASES, batch_runner, engine_train_step, step1_case
from utils.model.model_utils import answer_logprobs, causal_lm_loss, plain_output_layer

SHAPES = {"groups": {"prompts": 2, "group": 8, "prompt_len": 57, "answer_len": 8},
          "rows": {"prompts": 16, "group": 1, "prompt_len": 32, "answer_len": 12}}
"""step 3 minibatches: the SmolLM2 reasoning-gym recipe's answer groups, and distinct prompts as the PPO recipes."""


def plain(step):
    def run(*args):
        with plain_output_layer():
            return step(*args)
    return run


def measure_head_step1(model_name, repeats, warmup, num_batches=4):
    """Step 1's train tokens/s fused (`ours`) against plain (`baseline`), one engine stepping both ways."""
    args, batches, engine = step1_case(model_name, num_batches)
    with torch.no_grad():
        hugging_face_loss = engine(**batches[0], use_cache=False).loss
        difference = (causal_lm_loss(engine, batches[0]) - hugging_face_loss).abs().item()
    step = lambda batch: engine_train_step(engine, batch)  # noqa: E731
    steps = CASES[model_name]["steps_per_run"]
    config = engine.module.config
    rates = paired_rates(batch_runner(step, batches, config, steps), batch_runner(plain(step), batches, config, steps),
                         repeats, warmup, desc=f"head step 1 {model_name}")
    rates.update(dtype=args.dtype, batch_size=args.per_device_train_batch_size, seq_len=args.max_seq_len,
                 vocab_size=config.vocab_size, max_loss_difference=difference)
    return rates


def measure_head_step3(model_name, shape, repeats, warmup, dtype="auto", case=None):
    """The actor's update pass on a minibatch of `SHAPES[shape]` (or `case`), fused (`ours`) against plain: answer
    tokens/s, and the largest difference of the two's log-probs and of their gradients."""
    from transformers import AutoModelForCausalLM

    from utils.runtime.ds_utils import resolve_dtype, torch_dtype

    case = case or SHAPES[shape]
    dtype = resolve_dtype(dtype)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path(model_name), dtype=torch_dtype(dtype)).train()
    rows = case["prompts"] * case["group"]
    prompts = torch.randint(4, model.config.vocab_size, (case["prompts"], case["prompt_len"]))
    seq = torch.cat([prompts.repeat_interleave(case["group"], 0),
                     torch.randint(4, model.config.vocab_size, (rows, case["answer_len"]))], 1)
    mask = torch.ones_like(seq)

    def update(keep=False):
        logprobs, entropy = answer_logprobs(model, seq, mask, case["prompt_len"], 0.7, with_entropy=True)
        (logprobs.exp().mean() + entropy.mean().detach()).backward()
        grads = [p.grad.clone() for p in model.parameters()] if keep else None
        model.zero_grad(set_to_none=True)
        return logprobs.detach(), grads

    (fused, fused_grads), (full, full_grads) = update(keep=True), plain(update)(True)
    difference = max([(fused - full).abs().max().item()]
                     + [(a - b).abs().max().item() for a, b in zip(fused_grads, full_grads)])

    def run(step):
        return lambda: ({"answer_tokens": rows * case["answer_len"]}, timed(step)[1])

    rates = paired_rates(run(update), run(plain(update)), repeats, warmup, desc=f"head step 3 {model_name} {shape}")
    rates.update(case=dict(case), dtype=dtype, vocab_size=model.config.vocab_size, max_difference=difference)
    return rates
