"""A Llama model's forward for sampling on a CPU, in fewer and cheaper operations than its Hugging Face forward.

`inference.sampling.sample` asks `llama_decoder` for a decoder: for a `LlamaForCausalLM` of transformers' own
classes in eval mode on a CPU (its linear layers plain or LoRA, no ZeRO-3 partitioned parameters) a
`LlamaDecoder`, which computes what the model's forward computes, for the prompts and then one token a row:

    h = embed(tokens)
    for each layer:  x = rms(h);  q, k, v = x W_qkv;  q, k = rope(q), rope(k)  (cos, sin from the model's rotary_emb)
                     h = h + softmax(q K^T * scaling + mask) V W_o              (K, V: every column so far)
                     x = rms(h);  h = h + (act(x W_gate) * x W_up) W_down
    logits = lm_head(rms(h))  (the last position only)

with q, k and v one matmul (their weights concatenated once a rollout), each LoRA layer's factors folded into its
weight once a rollout (W + scaling (R L)^T: one matmul a layer instead of three), the prompts' left padding left out
of everything but attention (norms, projections and the MLP run on real tokens only), cos and sin looked up in a
table of positions, keys and values written into buffers allocated for the whole answer (no cache growing by
concatenation), and attention in float32: in bf16 the many small batched matmuls of attention are about twice as
slow on a CPU, and PyTorch's fused attention kernel is slower still for a few queries a row; float32 is also what
the softmax computes in. Anything else (another architecture, ZeRO-3, a GPU) gets None, and `sample` runs the
model's own forward with a Hugging Face cache.
In float32 the logits equal the forward's to rounding (tests/inference/test_llama_decoding.py).
"""
import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama import modeling_llama as llama

from utils.model.lora import LinearLayerLoRA, effective_weight

LINEARS = (nn.Linear, LinearLayerLoRA)
"""The linear layers the decoder computes (exactly these classes)."""
MAX_BUFFER_BYTES = 4 << 30
"""Above this size of key/value buffers (float32, whole answer, all rows) the model's own bf16 cache, grown as
needed, is kept instead."""


def llama_decoder(model, rows, capacity):
    """A `LlamaDecoder` of `model` for `rows` rows with room for `capacity` columns (prompt and answer), or None
    when `model` is not a plain Llama in eval mode on a CPU, or its buffers would pass MAX_BUFFER_BYTES."""
    model = getattr(model, "module", model)
    if not _plain_llama(model) or model.training or model.lm_head.weight.device.type != "cpu":
        return None
    layers, head_dim = model.model.layers, model.model.layers[0].self_attn.head_dim
    if 2 * len(layers) * rows * model.config.num_key_value_heads * capacity * head_dim * 4 > MAX_BUFFER_BYTES:
        return None
    return LlamaDecoder(model, capacity)


def _plain_llama(model):
    """Whether `model` is transformers' own Llama (these exact classes, not a subclass or remote code with the same
    names), with linear layers plain or LoRA and parameters in place: ZeRO-3's only while gathered whole (not
    partitioned, for its hooks to fetch at each forward)."""
    if type(model) is not llama.LlamaForCausalLM or type(model.lm_head) not in LINEARS:
        return False
    if any(hasattr(param, "ds_id") and param.numel() != param.ds_numel for param in model.parameters()):
        return False
    inner = model.model
    if type(inner) is not llama.LlamaModel or type(inner.norm) is not llama.LlamaRMSNorm \
            or type(inner.embed_tokens) is not nn.Embedding or inner.embed_tokens.max_norm is not None \
            or not 0 < len(inner.layers) == model.config.num_hidden_layers:
        return False
    for layer in inner.layers:
        attention, mlp = layer.self_attn, layer.mlp
        parts = {layer: llama.LlamaDecoderLayer, attention: llama.LlamaAttention, mlp: llama.LlamaMLP,
                 layer.input_layernorm: llama.LlamaRMSNorm, layer.post_attention_layernorm: llama.LlamaRMSNorm}
        linears = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj, mlp.gate_proj,
                   mlp.up_proj, mlp.down_proj)
        if any(type(part) is not kind for part, kind in parts.items()) or any(type(linear) not in LINEARS
                                                                               for linear in linears):
            return False
    return True


def _concat(*linears):
    """(weight, bias) of one linear layer computing all of `linears` (plain or LoRA) side by side."""
    weights, biases = zip(*map(effective_weight, linears))
    weight = torch.cat(weights)
    if all(bias is None for bias in biases):
        return weight, None
    return weight, torch.cat([bias if bias is not None else weight.new_zeros(part.shape[0])
                              for part, bias in zip(weights, biases)])


def _embed(embedding, ids):
    """The rows of `embedding`'s table for `ids`, read from the table itself: calling the module would run ZeRO-3's
    hooks, which partition again what step 3 gathered for the generation (the output layer's weight too, where it
    is the same tensor)."""
    return F.embedding(ids, embedding.weight)


def _rms(x, norm):
    """LlamaRMSNorm: x / sqrt(mean(x^2) + eps) in float32, back to x's dtype, times the weight."""
    return norm.weight * F.rms_norm(x.float(), x.shape[-1:], eps=norm.variance_epsilon).to(x.dtype)


def _rope(x, cos, signed_sin):
    """x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1) for x = (x1, x2), as x * cos + (x2, x1) *
    (-sin1, sin2): x (B, T, heads, head_dim), cos and signed_sin (B, T, 1, head_dim)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def _signed(cos, sin, head_dim):
    """cos and sin (B, T, head_dim) as `_rope` takes them: (B, T, 1, head_dim), the first half of sin negated."""
    half = head_dim // 2
    return cos.unsqueeze(2), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(2)


class LlamaDecoder:
    """A Llama model with its keys and values: `forward` runs tokens after the columns so far, `select` and
    `repeat` change the rows. Used as a context (nothing to set up)."""

    @torch.no_grad()
    def __init__(self, model, capacity):
        config = model.config
        self.model, self.capacity = model, capacity
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = model.model.layers[0].self_attn.head_dim  # as the attention layers compute it
        self.layers = []
        for layer in model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            self.layers.append((layer.input_layernorm, _concat(attention.q_proj, attention.k_proj, attention.v_proj),
                                effective_weight(attention.o_proj), attention.scaling, layer.post_attention_layernorm,
                                effective_weight(mlp.gate_proj), effective_weight(mlp.up_proj), mlp.act_fn,
                                effective_weight(mlp.down_proj)))
        self.head = effective_weight(model.lm_head)
        self.keys = self.values = None  # per layer (B, kv_heads, capacity, head_dim), float32, from the first call
        self.length = 0  # the columns filled so far
        self.rotary_table = None  # (cos, signed sin) of positions 0 .. capacity - 1, from the first call

    def _rotary(self, h, position_ids):
        """(cos, signed sin) (B, T, 1, head_dim) of the positions, for `_rope`: looked up in a table of every
        position the buffers hold, computed once (the same float operations a position at a time), unless the
        rope's frequencies change with the positions (dynamic and long rope), then from the model's rotary_emb."""
        rotary = self.model.model.rotary_emb
        if "dynamic" in rotary.rope_type or rotary.rope_type == "longrope":
            return _signed(*rotary(h, position_ids), self.head_dim)
        if self.rotary_table is None:
            self.rotary_table = _signed(*rotary(h, torch.arange(self.capacity).unsqueeze(0)), self.head_dim)
        return tuple(part[0, position_ids] for part in self.rotary_table)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def select(self, rows):
        """Keep the rows `rows` (indices, in that order, repeats allowed)."""
        def gather(buffer):  # the filled columns, by index_select into the new buffer: ~5x faster than indexing
            new = buffer.new_empty((len(rows), *buffer.shape[1:]))
            torch.index_select(buffer[:, :, :self.length], 0, rows, out=new[:, :, :self.length])
            return new

        self.keys = [gather(keys) for keys in self.keys]
        self.values = [gather(values) for values in self.values]

    def repeat(self, copies):
        """Each row `copies` times in a row."""
        self.select(torch.arange(self.keys[0].shape[0]).repeat_interleave(copies))

    @torch.no_grad()
    def forward(self, input_ids, attention_mask, position_ids):
        """The logits (B, V) of the last of T new tokens a row: input_ids and position_ids (B, T), attention_mask
        (B, length + T) over every column so far (0: padding)."""
        batch, new = input_ids.shape
        heads, kv_heads, head_dim, start = self.heads, self.kv_heads, self.head_dim, self.length
        end = start + new
        if attention_mask.shape[1] != end or end > self.capacity:
            raise ValueError(f"attention_mask covers {attention_mask.shape[1]} columns, not the {start} so far + {new} "
                             f"new ones (room for {self.capacity})")
        if self.keys is None:
            shape = (batch, kv_heads, self.capacity, head_dim)
            self.keys = [torch.empty(shape, dtype=torch.float32) for _ in self.layers]
            self.values = [torch.empty(shape, dtype=torch.float32) for _ in self.layers]
        # column c is visible to the new token t when it is not padding and c <= start + t
        visible = attention_mask[:, None, :end].bool()
        if new > 1:
            visible = visible & (torch.arange(end) <= start + torch.arange(new)[:, None])
        bias = torch.where(visible, 0.0, torch.finfo(torch.float32).min)
        group = heads // kv_heads  # query head j * group + i reads key/value head j, as Hugging Face's repeat_kv
        bias = bias.repeat(1, group, 1).unsqueeze(1).expand(batch, kv_heads, group * new, end) \
            .reshape(batch * kv_heads, group * new, end)  # as the queries below
        # Left-padded prompts: the padding positions skip everything but attention (whose layout keeps them, as
        # zeros), so norms, projections and the MLP run on the real tokens only (`packed`: their indices).
        packed = None
        if new > 1:
            real = attention_mask[:, start:end].bool()
            if bool(real[:, -1].all()) and not bool(real.all()):
                packed = real.flatten().nonzero().squeeze(1)

        inner = self.model.model
        h = _embed(inner.embed_tokens, input_ids.flatten() if packed is None else input_ids.flatten()[packed])
        cos, signed_sin = self._rotary(h, position_ids)
        width = (heads + 2 * kv_heads) * head_dim
        padded = None if packed is None else h.new_zeros(batch * new, width)  # rows of padding stay 0
        for index, (norm1, qkv, out, scaling, norm2, gate, up, act, down) in enumerate(self.layers):
            y = F.linear(_rms(h, norm1), *qkv)
            if packed is not None:
                y = padded.index_copy_(0, packed, y)
            y = y.view(batch, new, heads + 2 * kv_heads, head_dim)
            q_and_k = _rope(y[:, :, :heads + kv_heads], cos, signed_sin)
            self.keys[index][:, :, start:end] = q_and_k[:, :, heads:].transpose(1, 2)
            self.values[index][:, :, start:end] = y[:, :, heads + kv_heads:].transpose(1, 2)
            keys = self.keys[index][:, :, :end].reshape(batch * kv_heads, end, head_dim)
            values = self.values[index][:, :, :end].reshape(batch * kv_heads, end, head_dim)
            q = q_and_k[:, :, :heads].float().transpose(1, 2).reshape(batch * kv_heads, group * new, head_dim)
            weights = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=scaling).softmax(dim=-1)
            attended = torch.bmm(weights, values).view(batch, heads, new, head_dim).transpose(1, 2)
            attended = attended.reshape(batch * new, heads * head_dim)
            if packed is not None:
                attended = attended[packed]
            h = h + F.linear(attended.to(h.dtype), *out)
            x = _rms(h, norm2)
            h = h + F.linear(act(F.linear(x, *gate)) * F.linear(x, *up), *down)
        self.length = end
        last = h.view(batch, new, -1)[:, -1] if packed is None else h[real.sum(1).cumsum(0) - 1]
        return F.linear(_rms(last, inner.norm), *self.head)
