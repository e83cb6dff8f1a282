"""Step 3's actor forward + backward on a batch of answer groups (--num_samples_per_prompt): each prompt run once
for its whole group (`utils.model.model_utils.answer_logits`, what step 3 does) against one pass over every
[prompt | answer] row (what it did before, and what a plain training forward does).

The shapes are those of the SmolLM2 reasoning-gym recipe (training/recipes.py): a minibatch of 16 rows, two
prompts of 57 tokens (a chat template and a question) with 8 sampled answers of 8 tokens each. Token ids are
random; the model is trained as step 3 trains it (train mode, gradients of every weight).
"""
import torch

from bench.measure import paired_rates, timed
from bench.models import model_path
from utils.model.model_utils import answer_logits, last_logits_kwargs, model_forward_kwargs

CASE = {"prompts": 2, "group": 8, "prompt_len": 57, "answer_len": 8}


def measure_groups(model_name, repeats, warmup, case=CASE):
    """Answer tokens/s of forward + backward with prompts shared (`ours`) and not (`baseline`), their ratio pair by
    pair, and the largest difference of the two's logits (they must agree to float rounding)."""
    from transformers import AutoModelForCausalLM


    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path(model_name), dtype=torch.float32).train()
    rows = case["prompts"] * case["group"]
    prompts = torch.randint(4, model.config.vocab_size, (case["prompts"], case["prompt_len"]))
    seq = torch.cat([prompts.repeat_interleave(case["group"], 0),
                     torch.randint(4, model.config.vocab_size, (rows, case["answer_len"]))], 1)
    mask = torch.ones_like(seq)
    prompt_len = case["prompt_len"]

    def full():
        keep = case["answer_len"] + 1
        return model(input_ids=seq, use_cache=False, **model_forward_kwargs(model, mask),
                     **last_logits_kwargs(model, keep)).logits[:, -keep:-1]

    def shared():
        return answer_logits(model, seq, mask, prompt_len)

    def run(logits_fn):
        def step():
            logits_fn().logsumexp(-1).sum().backward()
            model.zero_grad(set_to_none=True)
        return lambda: ({"answer_tokens": rows * case["answer_len"]}, timed(step)[1])

    with torch.no_grad():
        difference = (shared() - full()).abs().max().item()
    rates = paired_rates(run(shared), run(full), repeats, warmup, desc=f"groups {model_name}")
    rates.update(case=dict(case), max_logit_difference=difference,
                 positions={"ours": case["prompts"] * prompt_len + rows * (case["answer_len"] - 1),
                            "baseline": rows * (prompt_len + case["answer_len"] - 1)})
    return rates
