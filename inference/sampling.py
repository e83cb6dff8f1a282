"""Sampling answers with a KV cache, in the layout of Hugging Face `generate`, faster on CPU.

`sample` draws from the same distribution as `generate(do_sample=True, temperature=T, top_p=p)` with every other
logits processor off (`inference.generation.NEUTRAL_PROCESSORS` / `NEUTRAL_SAMPLING`), and returns the same
(B, P + A) layout: the left-padded prompts, then A answer columns, each row padded with `pad_token_id` after its
first EOS, A the number of steps until every row has emitted EOS (or `max_new_tokens`). Where the time goes
instead:

- one uniform number per row and step (inverse-CDF sampling) instead of `torch.multinomial`, which draws an
  exponential for every token of the vocabulary (16 x 49152 of them for SmolLM2: ~40 ms a step on one core);
- the prompt tokens every row starts with (a chat template's system prompt) are run through the model once, for
  one row, and their keys and values copied to all rows: the rows then carry on from that shared prefix;
- a prompt that several rows answer (a group of `--num_samples_per_prompt` answers) is run once, and its keys
  and values copied to each of its rows;
- on a CPU a Llama model (the built-in default's, SmolLM2's), with LoRA layers or without, runs without Hugging
  Face's forward and cache (`inference.llama_decoding`: q/k/v in one matmul, LoRA factors folded into the
  weights, keys and values written in place, attention in float32);
  other models' decoding steps use Hugging Face's "eager" attention (two matmuls and a softmax) instead of
  PyTorch's fused `scaled_dot_product_attention`, whose CPU kernel is slower for a single query, most of all in
  bf16 (`python -m bench --sections sampler` measures the whole sampler against `generate`);
- rows that have emitted EOS are dropped from the batch (and their cache) instead of being carried to the end;
- the model computes the logits of the last position only, and the loop has no logits processors, stopping
  criteria or per-step input preparation beyond one column of mask and positions.

Positions come from the attention mask (position = number of real tokens before it), so a left-padded row is
computed as it would be alone, and as a training forward pass with `utils.model.model_utils.model_forward_kwargs`
computes it: the log-probabilities `sample` can return equal that pass's to float rounding.

Under ZeRO-3 with more than one rank every forward pass gathers parameters from all ranks, so all ranks must run
the same number of them: with `synced=True` a rank whose rows are all finished keeps running (one-token) forward
passes until an all-reduce says every rank is done, like `generate(synced_gpus=True)`.
"""
import torch

from inference.llama_decoding import llama_decoder
from utils.model.model_utils import (cache_kwargs, last_logits_kwargs, new_kv_cache, position_ids_from_mask,
                                     takes_cache)

COMPACT_FRACTION = 8
"""Finished rows are dropped from the batch once they are at least 1/COMPACT_FRACTION of it (copying the cache
costs about one decoding step's cache update, so not for every single row)."""


def supports_native_sampling(model):
    """Whether `sample` can drive `model`: a forward that takes position ids and a cache object."""
    return takes_cache(model)


def shared_prefix_length(input_ids, attention_mask):
    """k: how many leading real tokens every row of a left-padded batch has in common, at most the shortest
    row's length minus one (each row keeps a token of its own, whose logits start the answer)."""
    lengths = attention_mask.sum(1)
    shortest = int(lengths.min())
    if input_ids.shape[0] < 2 or shortest < 2:
        return 0
    first = input_ids.shape[1] - lengths  # first real column of each row
    columns = first.unsqueeze(1) + torch.arange(shortest - 1, device=input_ids.device)
    starts = input_ids.gather(1, columns)  # (B, shortest - 1): each row's first real tokens
    same = (starts == starts[:1]).all(0)
    return int(same.long().cumprod(0).sum())


def split_shared_prefix(input_ids, attention_mask, k, pad_token_id):
    """(prefix (k,), suffix_ids (B, P - k), mask (B, P)) of a left-padded batch whose rows all start with the same
    k real tokens: the suffix is each row after its prefix, left-padded again, and the mask covers the cache
    layout [prefix | suffix], where row b reads (k real tokens, pads, its remaining tokens).

        suffix[b, j] = input_ids[b, j + k] if j >= pads_b else pad,    pads_b = P - sum(attention_mask[b])
    """
    batch, length = input_ids.shape
    pads = length - attention_mask.sum(1, keepdim=True)
    first = int(pads[0])
    prefix = input_ids[0, first:first + k]
    real = torch.arange(length - k, device=input_ids.device).unsqueeze(0) >= pads
    suffix = torch.where(real, input_ids[:, k:], torch.full_like(input_ids[:, k:], pad_token_id))
    mask = torch.cat([attention_mask.new_ones(batch, k), real.to(attention_mask.dtype)], dim=1)
    return prefix, suffix, mask


def nucleus_filter(z, top_p):
    """z with every token outside the nucleus set to -inf, exactly as HF's TopPLogitsWarper: sorted by ascending
    probability, a token goes if the probabilities up to and including its own sum to <= 1 - top_p (the most
    likely token always stays)."""
    sorted_z, order = torch.sort(z, descending=False)
    cumulative = sorted_z.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return z.masked_fill(remove, float("-inf"))


def sample_tokens(z):
    """One token per row from softmax(z), by inverse CDF with one uniform number per row (torch's global RNG):

        token = min{v : sum_{w <= v} p_w > u * sum_w p_w},    p = exp(z - max z),  u ~ U[0, 1)

    The cumulative sums are in float64, so the drawn distribution equals softmax(z) to ~1e-15."""
    p = torch.exp(z - z.max(dim=-1, keepdim=True).values).double()
    cdf = p.cumsum(dim=-1)
    u = torch.rand(z.shape[0], 1, dtype=torch.float64, device=z.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=z.shape[-1] - 1)


def token_logprobs(z, tokens):
    """log softmax(z)[token] of each row: z[token] - logsumexp(z)."""
    return z.gather(1, tokens.unsqueeze(1)).squeeze(1) - torch.logsumexp(z, dim=-1)


@torch.no_grad()
def sample(model, input_ids, attention_mask, max_new_tokens, temperature=1.0, top_p=1.0, eos_token_id=None,
           pad_token_id=0, synced=False, return_logprobs=False, share_prefix=True, greedy=False, stop=None):
    """Sampled continuations of left-padded prompts: seq (B, P + A), and with `return_logprobs` also
    (seq, logprobs (B, A)), logprobs[b, t] = log softmax(logits / temperature)[answer token] (before top-p, as a
    training pass computes it; 0 after the row's EOS).

    `eos_token_id` is an id or a list of ids; `synced` keeps this rank stepping until every rank is done (ZeRO-3
    with more than one rank); `share_prefix` runs the prompt tokens all rows start with once; `greedy` takes each
    step's most likely token instead of drawing one (temperature and top-p then change nothing but the
    log-probs). `stop(rows, tokens, running) -> (b,) bool`, if given, is called after each step with the original
    row of each row of the running batch, their new tokens and which are still running: the rows it returns True
    for end there as at an EOS (a tool call's closing tag: inference/tool_rollout.py).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if not temperature > 0 or not 0 < top_p <= 1:
        raise ValueError(f"temperature must be > 0 and top_p in (0, 1], got {temperature} and {top_p}")
    device = input_ids.device
    batch = input_ids.shape[0]
    eos_ids = torch.tensor([] if eos_token_id is None else
                           [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id),
                           dtype=torch.long, device=device)
    k = shared_prefix_length(input_ids, attention_mask) if share_prefix else 0
    if synced:
        k = _agree_min(k, device)
    prompt_len = input_ids.shape[1]
    decoder = llama_decoder(model, batch, prompt_len + max_new_tokens) or ForwardDecoder(model)
    logits, mask = _prefill(decoder, input_ids, attention_mask, k, pad_token_id, max_new_tokens)
    next_position = attention_mask.sum(1)  # the first answer token's position: the number of prompt tokens

    answers = torch.full((batch, max_new_tokens), pad_token_id, dtype=input_ids.dtype, device=device)
    logprobs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device) if return_logprobs else None
    rows = torch.arange(batch, device=device)  # original row of each row of the running batch
    running = torch.ones(batch, dtype=torch.bool, device=device)  # of the running batch: not finished yet
    steps, done = 0, False
    with decoder:
        for step in range(max_new_tokens):
            if not done:
                z = logits.float()
                if temperature != 1.0:
                    z = z / temperature
                if greedy:
                    tokens = z.argmax(dim=-1)
                else:
                    tokens = sample_tokens(nucleus_filter(z, top_p) if top_p < 1.0 else z)
                answers[rows[running], step] = tokens[running]
                if return_logprobs:
                    logprobs[rows[running], step] = token_logprobs(z, tokens)[running].float()
                running &= ~torch.isin(tokens, eos_ids)
                if stop is not None:
                    running &= ~stop(rows, tokens, running)
                steps = step + 1
                done = not bool(running.any())
            if step == max_new_tokens - 1 or _everyone_done(done, synced, device):
                break
            if done:  # other ranks still sample: take part in their parameter gathering
                model(input_ids=input_ids[:1, -1:], use_cache=False)
                continue
            finished = int((~running).sum())
            if finished and finished * COMPACT_FRACTION >= running.numel():
                keep = running.nonzero().squeeze(1)
                decoder.select(keep)
                rows, tokens, mask, next_position = rows[keep], tokens[keep], mask[keep], next_position[keep]
                running = running[keep]
            logits = decoder.forward(tokens.unsqueeze(1), mask[:, :prompt_len + step + 1],
                                     next_position.unsqueeze(1))
            next_position = next_position + 1

    seq = torch.cat([input_ids, answers[:, :steps]], dim=1)
    return (seq, logprobs[:, :steps]) if return_logprobs else seq


def _prefill(decoder, input_ids, attention_mask, k, pad_token_id, max_new_tokens):
    """(logits of each row's last prompt token (B, V), mask (B, P + max_new_tokens) of the cache's columns): the
    prompts run through the model into the decoder's cache, the shared prefix of k tokens once for all rows when
    k > 0, and each distinct prompt once however many rows it has."""
    rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)
    distinct, copies = torch.unique(rows, dim=0, return_inverse=True)
    if distinct.shape[0] < rows.shape[0]:  # the distinct prompts run, then are copied to their rows below
        length = input_ids.shape[1]
        input_ids, attention_mask = distinct[:, :length], distinct[:, length:].to(attention_mask.dtype)
    else:
        copies = None
    batch = input_ids.shape[0]
    if k:
        prefix, input_ids, attention_mask = split_shared_prefix(input_ids, attention_mask, k, pad_token_id)
        decoder.forward(prefix.unsqueeze(0), attention_mask[:1, :k], torch.arange(k, device=prefix.device).unsqueeze(0))
        decoder.repeat(batch)
    positions = position_ids_from_mask(attention_mask)[:, k:]
    logits = decoder.forward(input_ids, attention_mask, positions)
    mask = torch.cat([attention_mask, attention_mask.new_ones(batch, max_new_tokens)], dim=1)
    if copies is not None:
        decoder.select(copies)
        logits, mask = logits[copies], mask[copies]
    return logits, mask


class ForwardDecoder:
    """The model's own forward with a Hugging Face key/value cache: `forward` runs tokens (B, T) after the columns
    so far and returns the last position's logits (B, V); `select` and `repeat` change the rows. As a context
    (around the decoding steps), on a CPU the model uses Hugging Face's "eager" attention where it would use
    PyTorch's `scaled_dot_product_attention` ("sdpa"): for one query a row, two matmuls and a softmax are faster
    there (the module docstring)."""

    def __init__(self, model):
        self.model, self.cache = model, new_kv_cache(model)
        config = getattr(model, "config", None)
        # the model's device: where its forward runs (the inputs are there too)
        self.switch = (next(model.parameters()).device.type == "cpu"
                       and getattr(config, "_attn_implementation", None) == "sdpa"
                       and hasattr(model, "set_attn_implementation") and model._can_set_attn_implementation())

    def __enter__(self):
        if self.switch:
            self.model.set_attn_implementation("eager")
        return self

    def __exit__(self, *exc):
        if self.switch:
            self.model.set_attn_implementation("sdpa")

    def select(self, rows):
        self.cache.batch_select_indices(rows)

    def repeat(self, copies):
        self.cache.batch_repeat_interleave(copies)

    def forward(self, input_ids, attention_mask, position_ids):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, **cache_kwargs(self.model, self.cache), **last_logits_kwargs(self.model, 1))
        return out.logits[:, -1]


def _everyone_done(done, synced, device):
    """Whether every rank is done (this rank alone unless `synced`)."""
    if not synced:
        return done
    flag = torch.tensor([0.0 if done else 1.0], device=device)
    torch.distributed.all_reduce(flag)
    return flag.item() == 0


def _agree_min(value, device):
    """The smallest `value` over all ranks."""
    flag = torch.tensor([value], dtype=torch.long, device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return int(flag.item())
