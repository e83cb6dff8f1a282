"""linear_logprobs and linear_nll: the output layer and the labels' log-probs a chunk at a time give the values and
gradients of the plain computation on the full logits (`logprobs_from_logits`, `entropy_from_logits`,
`cross_entropy`)."""
import math

import pytest
import torch

import utils.rl.head_logprobs as head
from utils.rl.head_logprobs import linear_logprobs, linear_nll
from utils.rl.tokens import entropy_from_logits, logprobs_from_logits


@pytest.fixture(params=[3, 10 ** 9], ids=["chunks of 1-2 rows", "one chunk"])
def chunking(request, monkeypatch):
    monkeypatch.setattr(head, "CHUNK_ELEMENTS", request.param)


def inputs(rows=7, hidden_size=5, vocab_size=3, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, hidden_size, generator=generator, dtype=dtype).requires_grad_()
    weight = torch.randn(vocab_size, hidden_size, generator=generator, dtype=dtype).requires_grad_()
    labels = torch.randint(0, vocab_size, (rows,), generator=generator)
    return hidden, weight, labels


def gradients(output, *tensors, seed=1):
    """d (output . r) / d tensors for a random r: a gradient that weighs every row differently."""
    r = torch.randn(output.shape, generator=torch.Generator().manual_seed(seed), dtype=output.dtype)
    return torch.autograd.grad((output * r).sum(), tensors)


def test_a_hand_worked_row():
    # weight = identity, so the logits are the hidden state: z = (0, ln 2, ln 3) at T = 1, p = (1, 2, 3) / 6;
    # log p(label 2) = ln 3 - ln 6 = -ln 2; H = -sum p ln p = ln 6 - (2 ln 2 + 3 ln 3) / 6.
    hidden = torch.tensor([[0.0, math.log(2), math.log(3)]], dtype=torch.float64)
    logprobs, entropy = linear_logprobs(hidden, torch.eye(3, dtype=torch.float64), torch.tensor([2]),
                                        with_entropy=True)
    assert logprobs.item() == pytest.approx(-math.log(2))
    assert entropy.item() == pytest.approx(math.log(6) - (2 * math.log(2) + 3 * math.log(3)) / 6)
    assert linear_nll(hidden, torch.eye(3, dtype=torch.float64), torch.tensor([2])).item() == pytest.approx(math.log(2))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_gradients_equal_the_full_logits(chunking, temperature):
    hidden, weight, labels = inputs()

    def fused():
        return linear_logprobs(hidden, weight, labels, temperature, with_entropy=True)

    def full():
        logits = (hidden @ weight.t()).unsqueeze(0)
        return (logprobs_from_logits(logits, labels.unsqueeze(0), temperature)[0],
                entropy_from_logits(logits, temperature)[0])

    for actual, wanted in zip(fused(), full()):
        torch.testing.assert_close(actual, wanted)
    # The gradients of the log-probs, of the entropy (an entropy bonus), and of both in one backward pass.
    for loss in (lambda logprobs, entropy: logprobs, lambda logprobs, entropy: entropy,
                 lambda logprobs, entropy: logprobs * 0.3 - entropy * 0.05):
        for actual, wanted in zip(gradients(loss(*fused()), hidden, weight), gradients(loss(*full()), hidden, weight)):
            torch.testing.assert_close(actual, wanted)


@pytest.mark.parametrize("scale", [1.0, 0.37])  # what the backward pass is given (0.37: a loss scaled, say)
def test_nll_and_its_gradients_equal_cross_entropy(chunking, scale):
    hidden, weight, labels = inputs(rows=9, vocab_size=4)
    loss = linear_nll(hidden, weight, labels)
    expected = torch.nn.functional.cross_entropy(hidden @ weight.t(), labels)
    torch.testing.assert_close(loss, expected)
    actual = torch.autograd.grad(loss * scale, (hidden, weight))
    for got, wanted in zip(actual, torch.autograd.grad(expected * scale, (hidden, weight))):
        torch.testing.assert_close(got, wanted)


def test_bf16_weights_round_as_the_plain_path():
    hidden, weight, labels = inputs(rows=6, hidden_size=16, vocab_size=11, dtype=torch.bfloat16)
    logprobs, _ = linear_logprobs(hidden, weight, labels)
    expected = logprobs_from_logits((hidden @ weight.t()).unsqueeze(0), labels.unsqueeze(0))[0]
    assert logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs, expected)
    for actual, wanted in zip(gradients(logprobs, hidden, weight), gradients(expected, hidden, weight)):
        assert actual.dtype == torch.bfloat16
        torch.testing.assert_close(actual, wanted, atol=2e-2, rtol=2e-2)


def test_no_rows_and_no_gradient_mode():
    hidden, weight, labels = inputs(rows=0)
    logprobs, entropy = linear_logprobs(hidden, weight, labels, with_entropy=True)
    assert logprobs.shape == entropy.shape == (0,)
    loss = linear_nll(hidden, weight, labels)
    assert loss.item() == 0.0
    assert all((g == 0).all() for g in torch.autograd.grad(loss, (hidden, weight)))
    hidden, weight, labels = inputs()
    with torch.no_grad():
        assert not linear_nll(hidden, weight, labels).requires_grad


def test_shapes_are_checked():
    hidden, weight, labels = inputs()
    with pytest.raises(ValueError, match="labels"):
        linear_logprobs(hidden, weight, labels[:-1])
    with pytest.raises(ValueError, match="weight"):
        linear_nll(hidden, weight.t(), labels)
    with pytest.raises(ValueError, match="temperature"):
        linear_logprobs(hidden, weight, labels, temperature=0.0)
