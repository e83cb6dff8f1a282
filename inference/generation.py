"""Generating answers with a causal language model: loading it, formatting a conversation, batched sampling.

One piece of code serves the chat CLI, the step-1 prompt evaluation and the step-3 comparison. Prompts are
tokenized as training tokenizes them (`utils.data.data_utils.tokenize_prompt`: the tokenizer's own special tokens
added), LEFT-padded with an attention mask so that every prompt of a batch ends at the same column and the
new tokens of all of them start together. The answers come from step 3's sampler (`inference.sampling.sample`:
the same distributions, faster) where the model's forward takes a cache object, else from Hugging Face
`generate`; both derive the positions from the mask.
"""
import torch

from inference.sampling import sample, supports_native_sampling
from inference.tool_rollout import tool_rollout
from utils.data.data_utils import attention_mask_left, pad_left, tokenize_prompt
from utils.data.prompting import encode_prompt_text
from utils.model.model_utils import (ADDED_TOKENS_ROOM, check_model_kind, check_tokenizer_fits, context_length,
                                     load_pretrained, load_tokenizer, resolve_model_path)
from utils.model.save import read_training_settings, trained_answer_length
from utils.runtime.ds_utils import TORCH_DTYPES
from utils.runtime.errors import ChatRLHFError, ConfigError
from utils.runtime.progress import progress

DEFAULT_MAX_NEW_TOKENS = 16
"""The answer length for a model folder without saved training settings (a base model, a hub name)."""
NEUTRAL_PROCESSORS = dict(num_beams=1, repetition_penalty=1.0, no_repeat_ngram_size=0, min_new_tokens=0)
NEUTRAL_SAMPLING = dict(top_k=0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
"""Every logits processor (all decodings) and warper (sampling) other than temperature and top-p, off: `generate`
fills the settings we leave unset from the model's own generation_config.json (often top_k=50, a repetition
penalty...), so we set them all."""


def load_causal_lm(path_or_name, dtype="fp32", trust_remote_code=False):
    """(model, tokenizer) of a saved step-1/step-3 actor, a base model folder, or a built-in name, in eval mode.

    The tokenizer pads on the left. A step-2 reward model folder is refused: it has no language-model head.
    """
    from transformers import AutoModelForCausalLM

    if dtype not in TORCH_DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    path = resolve_model_path(path_or_name)
    check_model_kind(path, reward=False, name=path_or_name)
    tokenizer = load_tokenizer(path, trust_remote_code, padding_side="left")
    model = load_pretrained(AutoModelForCausalLM, path, dtype=TORCH_DTYPES[dtype], trust_remote_code=trust_remote_code)
    check_tokenizer_fits(model, tokenizer, path, room=ADDED_TOKENS_ROOM)  # ids past the rows: an IndexError
    model.eval()
    return model, tokenizer


def trained_max_new_tokens(model_path, prompts, trust_remote_code=False):
    """The answer length the model in `model_path` was trained to write (`utils.model.save.trained_answer_length`,
    less the longest of these prompts in its tokens where the run bounded prompt + answer), or
    DEFAULT_MAX_NEW_TOKENS for a folder without saved settings."""
    if not read_training_settings(model_path):
        return DEFAULT_MAX_NEW_TOKENS
    tokenizer = load_tokenizer(model_path, trust_remote_code)
    longest = max((len(tokenize_prompt(tokenizer, prompt)) for prompt in prompts), default=0)
    length = trained_answer_length(model_path, longest)
    print(f"--max_new_tokens {length}: the answer length {model_path} was trained to", flush=True)
    return length


def max_prompt_tokens(model, max_new_tokens):
    """The longest prompt, in tokens, that leaves room for `max_new_tokens` in the model's context (None:
    unbounded)."""
    context = context_length(model)
    if context is None:
        return None
    if max_new_tokens >= context:
        raise ConfigError(f"max_new_tokens {max_new_tokens} leaves no room for a prompt in the model's context "
                          f"of {context} positions")
    return context - max_new_tokens


def tokenize_prompts(tokenizer, prompts):
    """Token ids of prompts already in the model's format, as training tokenizes them."""
    return [encode_prompt_text(tokenizer, prompt) for prompt in prompts]


def check_prompts(model, tokenizer, prompts, max_new_tokens):
    """Token ids of each prompt; ChatRLHFError naming the first empty prompt or one too long for the context."""
    def name(index):
        return "the prompt" if len(prompts) == 1 else f"prompt {index}"

    limit = max_prompt_tokens(model, max_new_tokens)
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str) or not prompt.strip():
            raise ChatRLHFError(f"{name(index)} is empty")
    token_ids = tokenize_prompts(tokenizer, prompts)
    for index, ids in enumerate(token_ids):
        if limit is not None and len(ids) > limit:
            raise ChatRLHFError(f"{name(index)} is too long: {len(ids)} tokens, but the model's context of "
                                f"{context_length(model)} positions leaves {limit} for the prompt with "
                                f"max_new_tokens {max_new_tokens}")
    return token_ids


def eos_token_ids(model, tokenizer):
    """Every token that ends an answer: the tokenizer's EOS and the model's generation-config EOS id(s) (chat
    models often end a turn with their own token, e.g. Llama 3's <|eot_id|>)."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    return sorted(i for i in ids if i is not None)


@torch.no_grad()
def generate(model, tokenizer, prompts, max_new_tokens=64, temperature=1.0, top_p=1.0, greedy=False,
             batch_size=16, seed=None, desc=None, return_ended=False, tools=None, return_calls=False):
    """The answer to each prompt: only the new text, decoded without special tokens, cut at the first EOS.
    With `return_ended`, (answers, ended): ended[i] is False where answer i hit max_new_tokens without an EOS.
    With `tools` (a utils.runtime.tool_format.ToolUse) the answers are multi-turn (inference/tool_rollout.py): the
    text holds the calls and their outputs, and max_new_tokens bounds model and tool tokens together; with
    `return_calls` a list of (calls, clean runs) per answer comes last in the returned tuple.

    Sampling uses `temperature` and nucleus `top_p` only (no top-k, no repetition penalty, whatever the
    model's generation config says); `greedy` takes the arg-max instead (`inference.sampling.sample`, or HF
    `generate` for a model it cannot drive). Prompts are sorted by length and batched `batch_size` at a time
    (less padding; copies of a prompt side by side, so that the sampler runs it once for all of them), and the
    answers returned in the prompts' order. With a `seed` the sampled answers are reproducible for the same
    prompts and batch size, and the global torch random state is left as it was. `desc`: the label of a progress
    bar over the batches (None: no bar).
    """
    from transformers import GenerationConfig

    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
    if not greedy and not temperature > 0:
        raise ConfigError(f"temperature must be > 0 for sampling, got {temperature} (use greedy decoding)")
    if not greedy and not 0 < top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
    token_ids = check_prompts(model, tokenizer, prompts, max_new_tokens)
    eos_ids = eos_token_ids(model, tokenizer)
    sampling = {} if greedy else dict(temperature=temperature, top_p=top_p)
    config = GenerationConfig(**NEUTRAL_PROCESSORS, **({} if greedy else NEUTRAL_SAMPLING), **sampling,
                              max_new_tokens=max_new_tokens, do_sample=not greedy, eos_token_id=eos_ids,
                              pad_token_id=tokenizer.pad_token_id)
    device = next(model.parameters()).device
    native = supports_native_sampling(model)
    if tools is not None and not native:
        raise ConfigError("--tools needs a model the native sampler can drive (its forward takes position ids and a "
                          "cache object)")
    order = sorted(range(len(prompts)), key=lambda i: (len(token_ids[i]), token_ids[i]))  # copies together
    answers, ended, calls = [None] * len(prompts), [True] * len(prompts), [(0, 0)] * len(prompts)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if seed is not None:
            torch.manual_seed(seed)
        for start in progress(range(0, len(order), batch_size), desc=desc, unit="batch", disable=desc is None):
            batch = order[start:start + batch_size]
            rows = [token_ids[i] for i in batch]
            input_ids, attention_mask = pad_left(rows, tokenizer.pad_token_id), attention_mask_left(rows)
            input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
            if tools is not None:
                rollout = tool_rollout(model, tokenizer, input_ids, attention_mask, max_new_tokens, tools.run,
                                       tools.format, tools.max_calls, tools.timeout, **sampling, eos_token_id=eos_ids,
                                       pad_token_id=tokenizer.pad_token_id, greedy=greedy)
                real = rollout.attention_mask[:, input_ids.shape[1]:].bool()
                for i, row, mask, made in zip(batch, rollout.seq[:, input_ids.shape[1]:], real,
                                              zip(rollout.calls, rollout.successes)):
                    answer_tokens = _cut_at_eos(row[mask].tolist(), eos_ids)
                    answers[i] = tokenizer.decode(answer_tokens, skip_special_tokens=True)
                    ended[i], calls[i] = len(answer_tokens) < int(mask.sum()) or int(mask.sum()) < max_new_tokens, made
                continue
            if native:
                output = sample(model, input_ids, attention_mask, max_new_tokens, **sampling, eos_token_id=eos_ids,
                                pad_token_id=tokenizer.pad_token_id, greedy=greedy)
            else:
                output = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
            for i, new_tokens in zip(batch, output[:, input_ids.shape[1]:].tolist()):
                answer_tokens = _cut_at_eos(new_tokens, eos_ids)
                answers[i] = tokenizer.decode(answer_tokens, skip_special_tokens=True)
                ended[i] = len(answer_tokens) < max_new_tokens
    return (answers, *([ended] if return_ended else []), *([calls] if return_calls else [])) \
        if return_ended or return_calls else answers


def _cut_at_eos(tokens, eos_ids):
    for position, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[:position]
    return tokens
