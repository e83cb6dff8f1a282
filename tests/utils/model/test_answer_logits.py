"""answer_logits: a group's prompt run once gives the logits and gradients of one full forward pass."""
import pytest
import torch

from utils.model.model_utils import answer_logits, model_forward_kwargs

PAD = 0


def full_forward_logits(model, seq, attention_mask, prompt_len):
    """The reference: [prompts | answers] in one pass, the logits at positions prompt_len - 1 ... T - 2."""
    logits = model(input_ids=seq, use_cache=False, **model_forward_kwargs(model, attention_mask)).logits
    return logits[:, prompt_len - 1:-1]


def grouped_batch(group=3):
    """Two left-padded prompts of different lengths, each repeated `group` times, with answers of different
    lengths (masked after their end): (seq, attention_mask, prompt_len)."""
    prompts = torch.tensor([[PAD, PAD, 5, 6, 7], [8, 9, 10, 11, 12]]).repeat_interleave(group, 0)
    prompt_mask = (prompts != PAD).long()
    torch.manual_seed(0)
    answers = torch.randint(13, 60, (prompts.shape[0], 4))
    answer_mask = torch.ones_like(answers)
    answer_mask[0, 2:] = 0
    answer_mask[4, 1:] = 0
    answers = answers.masked_fill(answer_mask == 0, PAD)
    return torch.cat([prompts, answers], 1), torch.cat([prompt_mask, answer_mask], 1), prompts.shape[1]


@pytest.fixture(params=["llama", "opt"])
def model(request, small_config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    return AutoModelForCausalLM.from_config(small_config(request.param)).eval()  # OPT's dropout off


def test_shared_prompts_give_the_full_passes_logits_and_gradients(model):
    seq, mask, prompt_len = grouped_batch()
    real = mask[:, prompt_len:].bool()  # tokens after an answer's end are never scored

    shared = answer_logits(model, seq, mask, prompt_len)
    shared_grads = torch.autograd.grad(shared[real].logsumexp(-1).sum(), list(model.parameters()))
    full = full_forward_logits(model, seq, mask, prompt_len)
    full_grads = torch.autograd.grad(full[real].logsumexp(-1).sum(), list(model.parameters()))

    assert shared.shape == full.shape == (seq.shape[0], seq.shape[1] - prompt_len, model.config.vocab_size)
    torch.testing.assert_close(shared[real], full[real], atol=1e-5, rtol=0)
    for a, b in zip(shared_grads, full_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_one_token_answers_and_distinct_prompts(model):
    seq, mask, prompt_len = grouped_batch()
    for cut in (seq[:, :prompt_len + 1], seq[::3]):  # one answer token each; no prompt repeated
        cut_mask = mask[:, :cut.shape[1]] if cut.shape[0] == seq.shape[0] else mask[::3]
        torch.testing.assert_close(answer_logits(model, cut, cut_mask, prompt_len),
                                   full_forward_logits(model, cut, cut_mask, prompt_len), atol=1e-5, rtol=0)


def test_gradient_checkpointing_falls_back_to_the_full_pass(small_config):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(small_config("llama"))
    model.gradient_checkpointing_enable()
    model.train()
    seq, mask, prompt_len = grouped_batch()
    real = mask[:, prompt_len:].bool()
    torch.testing.assert_close(answer_logits(model, seq, mask, prompt_len)[real],
                               full_forward_logits(model, seq, mask, prompt_len)[real], atol=1e-5, rtol=0)
