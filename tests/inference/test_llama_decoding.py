"""Tests of inference/llama_decoding.py: its forward (prompts with a shared prefix, then one token a row) against
the model's own forward with a Hugging Face cache (left-padded rows, grouped-query attention, biases, rows
repeated and dropped on the way), and which models get it."""
import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from inference.llama_decoding import LlamaDecoder, llama_decoder
from inference.sampling import ForwardDecoder, _prefill, shared_prefix_length
from utils.model.lora import convert_linear_layer_to_lora

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=0.2, tie_word_embeddings=False, pad_token_id=0)
STEPS = 6


def llama(dtype=torch.float32, **overrides):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**SHAPE, **overrides})).to(dtype).eval()


def left_padded_prompts():
    """Five rows of 2-9 tokens, the first three in common, the last row a copy of the first."""
    torch.manual_seed(1)
    input_ids = torch.randint(1, SHAPE["vocab_size"], (5, 9))
    lengths = torch.tensor([9, 4, 7, 5, 9])
    mask = (torch.arange(9) >= 9 - lengths.unsqueeze(1)).long()
    input_ids[4] = input_ids[0]
    input_ids[torch.arange(5), 9 - lengths] = 7  # a shared prefix of one token...
    input_ids[torch.arange(5), 10 - lengths] = 8  # ...and two
    input_ids = input_ids * mask
    assert shared_prefix_length(input_ids, mask) == 2
    return input_ids, mask


def run(decoder, share_prefix=True):
    """The logits of the prompts' last tokens, then of STEPS decoding steps with greedy tokens, rows 1 and 3
    dropped after the second step."""
    input_ids, attention_mask = left_padded_prompts()
    k = shared_prefix_length(input_ids, attention_mask) if share_prefix else 0
    with torch.no_grad():
        logits, mask = _prefill(decoder, input_ids, attention_mask, k, 0, STEPS)
    positions, out = attention_mask.sum(1), [logits]
    with decoder:
        for step in range(STEPS):
            if step == 2:
                keep = torch.tensor([0, 2, 4])
                decoder.select(keep)
                logits, positions, mask = logits[keep], positions[keep], mask[keep]
            with torch.no_grad():
                logits = decoder.forward(logits.float().argmax(-1, keepdim=True), mask[:, :9 + step + 1],
                                         positions.unsqueeze(1))
            out.append(logits)
            positions = positions + 1
    return out


VARIANTS = {
    "plain": {},
    "biases": dict(attention_bias=True, mlp_bias=True),
    "head_dim 24 of hidden 64 / 4 heads": dict(head_dim=24),
    "tied embeddings": dict(tie_word_embeddings=True),
    "multi-head (4 kv heads)": dict(num_key_value_heads=4),
    "llama3 rope scaling": dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8,
                                                 "rope_theta": 10000.0}),
    "dynamic rope past 8 positions": dict(max_position_embeddings=8,
                                          rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("share_prefix", [True, False])
def test_the_decoder_computes_the_models_forward(variant, share_prefix):
    model = llama(**VARIANTS[variant])
    with torch.no_grad():  # nonzero biases, or adding them changes nothing
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0, 0.5)
    reference = copy.deepcopy(model)  # a dynamic rope keeps state from call to call: each run starts afresh
    decoder = llama_decoder(model, 5, 9 + STEPS)
    assert isinstance(decoder, LlamaDecoder)
    ours, theirs = run(decoder, share_prefix), run(ForwardDecoder(reference), share_prefix)
    for lean_logits, logits in zip(ours, theirs, strict=True):
        assert lean_logits.shape == logits.shape
        assert (lean_logits - logits).abs().max() < 1e-5 * logits.abs().max()
    assert ours[-1].shape[0] == 3  # the rows kept
    assert not torch.equal(ours[1][0], ours[1][1])  # rows differ: a mixed-up row would show


@pytest.mark.parametrize("targets", ["layers.", "layers.,lm_head"])
def test_lora_layers_are_folded_and_compute_the_lora_models_forward(targets):
    """A LoRA model (factors trained away from zero) decodes with each layer's factors folded into its weight: the
    logits are the LoRA model's own, to rounding, and the model is left as it was."""
    model = convert_linear_layer_to_lora(llama(), targets, 4).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_left_weight" in name:
                param.normal_(0, 0.5)
    before = {name: param.clone() for name, param in model.state_dict().items()}
    decoder = llama_decoder(model, 5, 9 + STEPS)
    assert isinstance(decoder, LlamaDecoder)
    ours, theirs = run(decoder), run(ForwardDecoder(model))
    plain = run(llama_decoder(llama(), 5, 9 + STEPS))
    for lean_logits, logits, plain_logits in zip(ours, theirs, plain, strict=True):
        assert (lean_logits - logits).abs().max() < 1e-5 * logits.abs().max()
        assert (plain_logits - logits).abs().max() > 1e-2 * logits.abs().max()  # the factors matter
    assert all(torch.equal(param, before[name]) for name, param in model.state_dict().items())


def test_in_bf16_the_logits_differ_from_the_forwards_by_rounding_only():
    """Attention in float32 instead of bf16 (the module docstring): the logits move by bf16 rounding, no more."""
    model = llama(torch.bfloat16)
    for lean_logits, logits in zip(run(llama_decoder(model, 5, 9 + STEPS)), run(ForwardDecoder(model))):
        assert (lean_logits.float() - logits.float()).abs().max() < 0.03 * logits.float().abs().max()


def test_only_a_plain_llama_in_eval_mode_gets_the_decoder():
    assert isinstance(llama_decoder(llama(), 5, 8), LlamaDecoder)
    assert llama_decoder(llama().train(), 5, 8) is None  # dropout would apply
    zero3 = llama()
    param = next(zero3.parameters())
    param.ds_id, param.ds_numel = 0, param.numel()  # as ZeRO-3 marks its parameters: here gathered whole
    assert isinstance(llama_decoder(zero3, 5, 8), LlamaDecoder)
    param.ds_numel += 1  # partitioned: its hooks must fetch it at each forward
    assert llama_decoder(zero3, 5, 8) is None
    assert llama_decoder(llama(), 10 ** 6, 10 ** 4) is None  # buffers past MAX_BUFFER_BYTES
    torch.manual_seed(0)
    assert llama_decoder(MistralForCausalLM(MistralConfig(**SHAPE)).eval(), 5, 8) is None  # another architecture


def test_a_mask_that_does_not_cover_the_columns_is_refused():
    decoder = llama_decoder(llama(), 2, 8)
    with pytest.raises(ValueError, match="covers 4 columns, not the 0 so far"):
        decoder.forward(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.long),
                        torch.arange(3).repeat(2, 1))
