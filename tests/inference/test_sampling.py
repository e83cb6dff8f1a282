"""Tests of inference/sampling.py: the distribution it draws from (against softmax and HF's top-p warper), the
layout it returns (against HF `generate`), and its log-probs (against a training forward pass), on a small random
Llama with the tiny tokenizer (grouped-query attention; weights large enough that greedy answers vary from row to
row and token to token, where the untrained built-in model repeats one token)."""
import pytest
import torch
from transformers import GenerationConfig, LlamaForCausalLM
from transformers.generation.logits_process import TopPLogitsWarper

from inference import llama_decoding
from inference.generation import NEUTRAL_PROCESSORS, tokenize_prompts
from inference.sampling import (nucleus_filter, sample, sample_tokens, shared_prefix_length, split_shared_prefix,
                                supports_native_sampling)
from utils.data.data_utils import attention_mask_left, pad_left
from utils.model.model_utils import model_forward_kwargs
from utils.rl.tokens import logprobs_from_logits

pytestmark = pytest.mark.usefixtures("one_thread")

SYSTEM = "You are a careful assistant. Answer in one word."
QUESTIONS = ["What is 7 + 12?", 'Reverse the word "cat".', "hi", 'Say "apple" in uppercase, please, now.',
             "Which city is the capital of France?", "2 + 2?"]
EOS_EVERY = 9
"""A row stops at any token id divisible by EOS_EVERY (and the tokenizer's EOS): the untrained model then ends
its rows after a few tokens each, at different steps, as a trained one does."""


@pytest.fixture(scope="module", params=["llama", "mistral"])
def varied(request, tiny_tokenizer):
    """(model, tokenizer): a Llama, whose decoding steps `inference.llama_decoding` computes, and a Mistral of the
    same shape, which steps through its own forward."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM),
                                 "mistral": (MistralConfig, MistralForCausalLM)}[request.param]
    torch.manual_seed(0)
    config = config_class(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2,
                          tie_word_embeddings=False, pad_token_id=tiny_tokenizer.pad_token_id)
    return model_class(config).eval(), tiny_tokenizer


def prompt_batch(tokenizer, system=SYSTEM):
    texts = [f"{system} Human: {question} Assistant:" for question in QUESTIONS]
    rows = tokenize_prompts(tokenizer, texts)
    input_ids, attention_mask = pad_left(rows, tokenizer.pad_token_id), attention_mask_left(rows)
    assert len(set(attention_mask.sum(1).tolist())) > 3  # really left-padded
    return input_ids, attention_mask


def stop_ids(tokenizer):
    return sorted({tokenizer.eos_token_id, *range(0, len(tokenizer), EOS_EVERY)})


def action_mask(answers, eos_ids):
    """1 up to and including each row's first stop token."""
    stops = torch.isin(answers, torch.tensor(eos_ids)).long()
    return ((stops.cumsum(1) - stops) == 0).long()


def hf_greedy(model, tokenizer, input_ids, attention_mask, eos_ids, max_new_tokens):
    config = GenerationConfig(**NEUTRAL_PROCESSORS, do_sample=False, max_new_tokens=max_new_tokens,
                              eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)


def test_the_tiny_model_is_supported(tiny):
    assert supports_native_sampling(tiny[0])


def test_rollout_logprobs_of_the_tiny_model_equal_a_training_forward_pass(tiny):
    check_logprobs(*tiny, temperature=1.0, top_p=1.0)


def test_shared_prefix_length_counts_real_tokens_and_leaves_each_row_one():
    pad = 0
    input_ids = torch.tensor([[pad, pad, 5, 6, 7, 8], [5, 6, 7, 9, 9, 9], [pad, 5, 6, 7, 8, 1]])
    mask = (input_ids != pad).long()
    assert shared_prefix_length(input_ids, mask) == 3
    short = torch.tensor([[pad, 5, 6, 7], [5, 6, 7, 9]])
    assert shared_prefix_length(short, (short != pad).long()) == 2  # the first row keeps a token of its own
    other = torch.tensor([[5, 6], [6, 6]])
    assert shared_prefix_length(other, torch.ones_like(other)) == 0  # no common first token
    assert shared_prefix_length(input_ids[:1], mask[:1]) == 0  # one row: nothing to share

    prefix, suffix, layout_mask = split_shared_prefix(input_ids, mask, 3, pad)
    assert prefix.tolist() == [5, 6, 7]
    assert suffix.tolist() == [[pad, pad, 8], [9, 9, 9], [pad, 8, 1]]
    assert layout_mask.tolist() == [[1, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 1, 1]]


def test_sample_tokens_draws_from_the_softmax():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0, 0.5], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                           [-5.0, 9.0, 8.5, -float("inf"), 1.0, 8.0]])
    draws = 40000
    tokens = sample_tokens(logits.repeat_interleave(draws, 0)).view(3, draws)
    for row, expected in zip(tokens, logits.softmax(-1)):
        frequency = torch.bincount(row, minlength=6).double() / draws
        sigma = (expected.double() * (1 - expected.double()) / draws).sqrt()
        assert ((frequency - expected.double()).abs() <= 5 * sigma + 1e-9).all(), (frequency, expected)
    assert not (tokens[2] == 3).any()  # probability 0 exactly: never drawn


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99, 1.0])
def test_nucleus_filter_is_hfs_top_p_warper(top_p):
    torch.manual_seed(1)
    z = torch.randn(8, 50)
    z[0, :10] = 1.5  # ties at the nucleus edge
    assert torch.equal(nucleus_filter(z, top_p), TopPLogitsWarper(top_p)(None, z))


def test_sampling_with_top_p_draws_from_the_nucleus_only():
    torch.manual_seed(2)
    z = torch.randn(1, 30) * 2
    kept = nucleus_filter(z, 0.7)
    tokens = sample_tokens(kept.repeat(20000, 1))
    assert set(tokens.tolist()) == set(torch.nonzero(kept[0] > -float("inf")).squeeze(1).tolist())


@pytest.mark.parametrize("share_prefix", [True, False])
def test_near_zero_temperature_returns_exactly_what_greedy_generate_returns(varied, share_prefix):
    """Same layout as `generate`: prompts, answers, pads after each row's first stop token, and as many columns
    as the longest answer (every row stopped before max_new_tokens here)."""
    model, tokenizer = varied
    input_ids, attention_mask = prompt_batch(tokenizer)
    free = hf_greedy(model, tokenizer, input_ids, attention_mask, [tokenizer.eos_token_id], 24)[:, input_ids.shape[1]:]
    eos_ids = sorted({tokenizer.eos_token_id, *(int(free[row, 2 * row + 1]) for row in range(len(free)))})
    expected = hf_greedy(model, tokenizer, input_ids, attention_mask, eos_ids, 24)
    ours = sample(model, input_ids, attention_mask, 24, temperature=1e-4, eos_token_id=eos_ids,
                  pad_token_id=tokenizer.pad_token_id, share_prefix=share_prefix)
    assert torch.equal(ours, expected)
    answers = ours[:, input_ids.shape[1]:]
    lengths = action_mask(answers, eos_ids).sum(1)
    assert answers.shape[1] == lengths.max() < 24 and len(set(lengths.tolist())) > 1  # rows stopped apart


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_rollout_logprobs_equal_a_training_forward_pass(varied, temperature, top_p):
    check_logprobs(*varied, temperature, top_p)


def test_a_group_of_answers_to_one_prompt_runs_the_prompt_once(varied, monkeypatch):
    """Rows of one prompt (step 3's --num_samples_per_prompt): the prompt runs for one row of each group, and the
    answers' log-probs still equal a training pass's."""
    model, tokenizer = varied
    batches = []  # the token batches embedded: (rows, tokens) of a forward pass, (tokens,) of the Llama decoder
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda module, args: batches.append(args[0].shape))
    embed = llama_decoding._embed  # the Llama decoder reads the table without calling the module
    monkeypatch.setattr(llama_decoding, "_embed", lambda table, ids: batches.append(ids.shape) or embed(table, ids))
    try:
        answers = check_logprobs(model, tokenizer, temperature=1.0, top_p=1.0, group=4)
    finally:
        hook.remove()
    input_ids, attention_mask = prompt_batch(tokenizer)
    k = shared_prefix_length(input_ids, attention_mask)
    prefix, prompts = batches[:2]
    assert prefix.numel() == k  # the shared prefix once, for one row
    if isinstance(model, LlamaForCausalLM):  # the decoder embeds the real tokens only, not the left padding
        assert prompts.numel() == int(attention_mask.sum()) - k * len(QUESTIONS)  # not 4 x as many
    else:
        assert prompts[0] == len(QUESTIONS)  # rows, not 4 x len(QUESTIONS)
    assert batches[2].numel() == 4 * len(QUESTIONS)  # then every row decodes
    groups = answers.view(len(QUESTIONS), 4, -1)
    assert any(len({tuple(row) for row in group.tolist()}) > 1 for group in groups)  # a group's answers differ


def test_a_llama_skips_its_forward_and_other_models_decode_with_eager_attention_on_a_cpu(varied):
    """A Llama runs through `inference.llama_decoding` (never its forward); another model's prompts run through
    its forward with its own attention, the decoding steps with "eager" attention, and it is left as it was."""
    model, tokenizer = varied
    assert model.config._attn_implementation == "sdpa"
    seen = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["input_ids"].shape[1], module.config._attn_implementation)),
        with_kwargs=True)
    try:
        input_ids, attention_mask = prompt_batch(tokenizer)
        sample(model, input_ids, attention_mask, 6, eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    finally:
        hook.remove()
    if type(model).__name__ == "LlamaForCausalLM":
        assert seen == []
    else:
        assert {implementation for length, implementation in seen if length > 1} == {"sdpa"}  # the prompt
        assert [implementation for length, implementation in seen if length == 1] == ["eager"] * 5
    assert model.config._attn_implementation == "sdpa"


def check_logprobs(model, tokenizer, temperature, top_p, group=1):
    """log pi(a_t | s_t) as sampling computed it, against step 3's training pass over the finished sequences
    (the whole sequence at once, positions from the mask, `utils.rl.tokens.logprobs_from_logits`), each prompt
    answered `group` times. Returns the answers."""
    input_ids, attention_mask = prompt_batch(tokenizer)
    input_ids, attention_mask = input_ids.repeat_interleave(group, 0), attention_mask.repeat_interleave(group, 0)
    eos_ids = stop_ids(tokenizer)
    torch.manual_seed(3)
    seq, logprobs = sample(model, input_ids, attention_mask, 12, temperature=temperature, top_p=top_p,
                           eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, return_logprobs=True)
    prompt_len = input_ids.shape[1]
    answers = seq[:, prompt_len:]
    mask = action_mask(answers, eos_ids)
    assert logprobs.shape == answers.shape and len(set(mask.sum(1).tolist())) > 1
    with torch.no_grad():
        logits = model(input_ids=seq, use_cache=False,
                       **model_forward_kwargs(model, torch.cat([attention_mask, mask], 1))).logits
    expected = logprobs_from_logits(logits[:, prompt_len - 1:-1], answers, temperature)
    assert (expected - logprobs).abs().mul(mask).max() < 1e-5
    assert (logprobs * (1 - mask)).abs().max() == 0  # nothing after a row's stop token
    return answers


def test_seeded_sampling_is_reproducible_and_the_shared_prefix_changes_nothing(varied):
    model, tokenizer = varied
    input_ids, attention_mask = prompt_batch(tokenizer)
    assert shared_prefix_length(input_ids, attention_mask) > 8  # the system prompt and " Human:"
    runs = []
    for share_prefix in (True, True, False):
        torch.manual_seed(4)
        runs.append(sample(model, input_ids, attention_mask, 12, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, share_prefix=share_prefix, return_logprobs=True))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert torch.equal(runs[0][0], runs[2][0])
    assert torch.allclose(runs[0][1], runs[2][1], atol=1e-5)


def test_stops_at_once_when_every_row_emits_eos_and_runs_to_max_new_tokens_without_eos(varied):
    model, tokenizer = varied
    input_ids, attention_mask = prompt_batch(tokenizer)
    every_token = list(range(len(tokenizer)))
    seq = sample(model, input_ids, attention_mask, 10, eos_token_id=every_token, pad_token_id=tokenizer.pad_token_id)
    assert seq.shape[1] == input_ids.shape[1] + 1
    seq = sample(model, input_ids, attention_mask, 10, eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    assert seq.shape[1] == input_ids.shape[1] + 10
    assert torch.equal(seq[:, :input_ids.shape[1]], input_ids)


def test_bad_settings_are_refused(varied):
    model, tokenizer = varied
    input_ids, attention_mask = prompt_batch(tokenizer)
    for kwargs in (dict(max_new_tokens=0), dict(max_new_tokens=4, temperature=0.0), dict(max_new_tokens=4, top_p=0)):
        with pytest.raises(ValueError):
            sample(model, input_ids, attention_mask, **kwargs)


SYNCED_RANK = """
import json, sys
import deepspeed, torch
from transformers import AutoModelForCausalLM
from inference.sampling import sample
from utils.runtime.ds_utils import get_eval_ds_config
from utils.model.model_utils import load_tokenizer
from utils.runtime.dist import init_distributed

rank, world_size, _, _ = init_distributed()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
engine, *_ = deepspeed.initialize(model=model, config=get_eval_ds_config(micro_batch_size=1, world_size=world_size,
                                                                         dtype="fp32", stage=3))
partitioned = any(p.numel() == 0 and p.ds_numel > 0 for p in engine.module.parameters() if hasattr(p, "ds_id"))
forwards = []
engine.module.register_forward_hook(lambda *args: forwards.append(1))
tokenizer = load_tokenizer(sys.argv[1])
texts = ["Human: hi Assistant:", "Human: what is 2 + 3 ? Assistant:"] if rank == 0 else ["hi", "what is 2 + 3"]
batch = tokenizer(texts, padding=True, return_tensors="pt")
torch.manual_seed(rank)
seq = sample(engine.module, batch["input_ids"], batch["attention_mask"], 6, pad_token_id=tokenizer.pad_token_id,
             eos_token_id=list(range(len(tokenizer))) if rank == 0 else None, synced=True)
print("RESULT " + json.dumps({"rank": rank, "answer_columns": seq.shape[1] - batch["input_ids"].shape[1],
                              "forwards": len(forwards), "partitioned": partitioned}), flush=True)
"""


@pytest.mark.e2e
def test_zero3_ranks_keep_stepping_until_every_rank_is_done(step3_model_dirs, tmp_path):
    """Two ZeRO-3 ranks, one done after one token (every token is an EOS for it), one sampling six; the first
    keeps running forward passes (its parameter gathers) until the second is done, otherwise both would hang.
    Rank 0's prompts share a prefix and rank 1's do not: the ranks agree to run the prompts the same way."""
    import json
    import subprocess
    import sys

    from processes import REPO, subprocess_env

    script = tmp_path / "synced_rank.py"
    script.write_text(SYNCED_RANK)
    env = subprocess_env()
    ranks = []
    for rank in range(2):
        rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
        ranks.append(subprocess.Popen([sys.executable, str(script), str(step3_model_dirs[0])], cwd=REPO,
                                      env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = {}
    for process in ranks:
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output[-3000:]
        result = json.loads(next(line for line in output.splitlines() if line.startswith("RESULT "))[7:])
        results[result["rank"]] = result
    assert results[0]["partitioned"] and results[1]["partitioned"]
    assert results[0]["answer_columns"] == 1 and results[1]["answer_columns"] == 6
    assert results[0]["forwards"] == results[1]["forwards"]
