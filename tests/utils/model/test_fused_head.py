"""The fused output layer (utils/model/model_utils.py with utils/rl/head_logprobs.py): step 1's loss, step 3's
answer log-probs and DPO's sequence log-probs equal those of the model's full logits (`plain_output_layer`),
values and gradients, on Llama (a group's prompt shared) and OPT, padded and packed."""
import pytest
import torch

import utils.rl.head_logprobs as head_logprobs
from utils.model.model_utils import (answer_logprobs, answer_sequence_logprobs, causal_lm_loss, final_hidden_states,
                                     fused_output_layer, plain_output_layer)

PAD = 0


@pytest.fixture(params=["llama", "opt"])
def model(request, small_config, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(head_logprobs, "CHUNK_ELEMENTS", 200)  # several chunks of rows
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(small_config(request.param)).eval()  # OPT's dropout off
    assert fused_output_layer(model) is model.get_output_embeddings()
    return model


def both_ways(model, compute):
    """(fused, plain): each output of `compute()` with the gradient of its random projection for every weight."""
    results = []
    for context in (torch.enable_grad, plain_output_layer):
        with context():
            outputs = compute()
            model.zero_grad()
            torch.manual_seed(2)
            sum(((out * torch.randn_like(out)).sum() for out in outputs if out is not None)).backward()
            results.append(([out.detach() for out in outputs if out is not None],
                            {name: p.grad.clone() for name, p in model.named_parameters()}))
    return results


def assert_same(model, compute):
    (fused, fused_grads), (plain, plain_grads) = both_ways(model, compute)
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for name in plain_grads:
        torch.testing.assert_close(fused_grads[name], plain_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def grouped_batch(group=2):
    prompts = torch.tensor([[PAD, PAD, 5, 6, 7], [8, 9, 10, 11, 12]]).repeat_interleave(group, 0)
    torch.manual_seed(0)
    answers = torch.randint(13, 60, (prompts.shape[0], 4))
    answer_mask = torch.ones_like(answers)
    answer_mask[0, 2:] = 0
    answers = answers.masked_fill(answer_mask == 0, PAD)
    return torch.cat([prompts, answers], 1), torch.cat([(prompts != PAD).long(), answer_mask], 1), prompts.shape[1]


@pytest.mark.parametrize("with_entropy, entropy_grad", [(False, False), (True, False), (True, True)])
def test_answer_logprobs_equal_the_full_logits(model, with_entropy, entropy_grad):
    """The entropy too, with its gradient where asked (an entropy bonus) and without it where not."""
    seq, mask, prompt_len = grouped_batch()
    assert_same(model, lambda: answer_logprobs(model, seq, mask, prompt_len, 0.8, with_entropy, entropy_grad))
    if with_entropy:
        _, entropy = answer_logprobs(model, seq, mask, prompt_len, 0.8, with_entropy, entropy_grad)
        assert entropy.requires_grad == entropy_grad


def test_sequence_logprobs_equal_the_full_logits(model):
    seq, mask, prompt_len = grouped_batch()
    answer_mask = torch.zeros(seq.shape[0], seq.shape[1] - 1)
    answer_mask[:, prompt_len - 1:] = mask[:, prompt_len:]
    assert_same(model, lambda: (answer_sequence_logprobs(model, seq, mask, answer_mask),))


def test_step1_loss_equals_hugging_faces(model):
    seq, mask, prompt_len = grouped_batch()
    labels = seq.masked_fill(mask == 0, -100)
    labels[:, :prompt_len] = -100
    batch = {"input_ids": seq, "attention_mask": mask, "labels": labels}
    assert_same(model, lambda: (causal_lm_loss(model, batch),))
    with plain_output_layer():
        assert causal_lm_loss(model, batch).item() == pytest.approx(model(**batch).loss.item())


def test_step1_loss_of_a_packed_batch(small_config):
    from transformers import AutoModelForCausalLM

    from utils.data.packing import DataCollatorPackedSFT

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(small_config("llama")).eval()
    samples = [{"input_ids": ids, "labels": [-100] * 2 + ids[2:]} for ids in ([5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16])]
    batch = DataCollatorPackedSFT(PAD, 8)(samples)
    assert_same(model, lambda: (causal_lm_loss(model, batch),))


def test_models_it_must_not_fuse(small_config):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(small_config("llama", vocab_size=64))
    model.lm_head = torch.nn.Linear(32, 64, bias=True)  # a bias after the hidden states: the plain path
    assert fused_output_layer(model) is None
    with plain_output_layer():
        assert fused_output_layer(AutoModelForCausalLM.from_config(small_config("llama"))) is None


def test_the_output_layer_returns_its_inputs_within_the_context(small_config):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(small_config("llama")).eval()
    ids = torch.tensor([[5, 6, 7]])
    with final_hidden_states(model.lm_head):
        hidden = model(input_ids=ids).logits
    assert hidden.shape == (1, 3, 32)
    torch.testing.assert_close(model.lm_head(hidden), model(input_ids=ids).logits)
