"""Step 3's sampler (`inference.sampling.sample`) against plain Hugging Face `generate` on one model, in the two
shapes step 3's recipes sample:

- rows: 64 distinct prompts a batch (the PPO recipes' rollouts);
- groups: 4 prompts x 8 answers each (`--num_samples_per_prompt 8`, the SmolLM2 reasoning-gym recipe), the same
  prompt rows given to `generate`, as step 3 would give them.

Prompts are the built-in task's held-out prompts in the model's format (its chat template when it has one);
sampling at temperature 1 and top-p 1, as step 3 samples by default, up to `max_new_tokens` or EOS. Both sides
draw from a fixed seed per batch; units are the answer tokens generated, up to and including the first EOS.
Models: the bench's (`tiny`, `llama-100m`) and `smollm2-135m` (when its package is installed); with `lora_dim`,
the model as step 3's actor holds it with `--only_optimize_lora`: LoRA layers on its decoder layers, their factors
moved away from zero as training moves them. With `zero3`, the model is partitioned by ZeRO-3 (a world of one) and
the baseline is our sampler on it as it is (ZeRO-3's hooks fetch each layer's parameters at every token), against
the same sampler with the parameters gathered whole for the call, as the hybrid engine's actor generates.
"""
import contextlib
import time

import torch

from bench.measure import paired_rates
from bench.models import MODELS, installed_models, model_path
from inference.evaluation import heldout_set
from inference.generation import load_causal_lm, tokenize_prompts
from inference.sampling import sample
from utils.data.data_utils import attention_mask_left, pad_left
from utils.data.prompting import model_prompt
from utils.model.lora import convert_linear_layer_to_lora
from utils.runtime.ds_utils import get_eval_ds_config
from utils.trainer.ppo_trainer import answer_action_mask
from utils.trainer.rlhf_engine import gathered_whole

SHAPES = {"rows": (64, 1), "groups": (4, 8)}
"""shape name -> (distinct prompts, answers per prompt) of one rollout batch."""


def measure_sampler(model_name, shape, max_new_tokens, dtype, repeats, warmup, batches=3, greedy_baseline=False,
                    lora_dim=0, zero3=False):
    """Answer tokens/s of `sample` (ours, T = 1) and `generate` (baseline: sampling as ours, or greedy with
    `greedy_baseline`, the cheapest decoding it has) over `batches` prompt batches, pair by pair; the model with
    LoRA layers of rank `lora_dim` if it is not 0; with `zero3` (the module docstring) ours gathered against ours
    partitioned."""
    model, tokenizer = load_causal_lm(_model_path(model_name), dtype)
    if lora_dim:
        torch.manual_seed(0)
        model = convert_linear_layer_to_lora(model, "layers.", lora_dim).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_left_weight" in name:
                    param.normal_(0, 0.01)
    if zero3:
        import deepspeed

        engine, *_ = deepspeed.initialize(model=model, config=get_eval_ds_config(micro_batch_size=1, world_size=1,
                                                                                 dtype=dtype, stage=3))
        model = engine.module
    prompts_per_batch, group = SHAPES[shape]
    texts = [model_prompt(tokenizer, prompt) for prompt in heldout_set("builtin")[0]]
    prompt_batches = []
    for index in range(batches):
        rows = tokenize_prompts(tokenizer, texts[index * prompts_per_batch:(index + 1) * prompts_per_batch])
        rows = [row for row in rows for _ in range(group)]
        prompt_batches.append((pad_left(rows, tokenizer.pad_token_id), attention_mask_left(rows)))
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def sampled(input_ids, attention_mask):
        return sample(model, input_ids, attention_mask, max_new_tokens, eos_token_id=eos, pad_token_id=pad)

    def ours(input_ids, attention_mask):
        with gathered_whole(model) if zero3 else contextlib.nullcontext():
            return sampled(input_ids, attention_mask)

    def baseline(input_ids, attention_mask):
        if zero3:
            return sampled(input_ids, attention_mask)
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                              use_cache=True, eos_token_id=eos, pad_token_id=pad,
                              **(dict(do_sample=False, temperature=None, top_p=None, top_k=None) if greedy_baseline
                                 else dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0)))

    def runner(generate):
        def run():
            tokens = seconds = 0.0
            for index, (input_ids, attention_mask) in enumerate(prompt_batches):
                torch.manual_seed(index)
                start = time.perf_counter()
                with torch.no_grad():
                    seq = generate(input_ids, attention_mask)
                seconds += time.perf_counter() - start
                tokens += answer_action_mask(seq[:, input_ids.shape[1]:], eos).sum().item()
            return {"tokens": tokens}, seconds
        return run

    rates = paired_rates(runner(ours), runner(baseline), repeats, warmup, desc=f"sampler {model_name} {shape}")
    baseline_decoding = ("ours, ZeRO-3 partitioned" if zero3 else "HF generate, greedy" if greedy_baseline
                         else "HF generate, sampling")
    rates.update(model=model_name + (f" with LoRA (rank {lora_dim})" if lora_dim else "")
                 + (", ZeRO-3 gathered" if zero3 else ""), shape=shape,
                 rows=prompts_per_batch * group, max_new_tokens=max_new_tokens, baseline_decoding=baseline_decoding,
                 dtype=dtype, prompt_len=max(input_ids.shape[1] for input_ids, _ in prompt_batches))
    return rates


def sampler_models(names):
    """The bench models named, and smollm2-135m when its package is installed."""
    return installed_models(list(dict.fromkeys([*names, "smollm2-135m"])))


def _model_path(name):
    return model_path(name) if name in MODELS else name

