"""Tests of utils/model/reward_model.py: the Bradley-Terry loss on hand-worked values, the end-score position under
every padding, the chosen-then-rejected pair layout, and the save/load round trip of a reward-model folder."""
import json
import math

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

from utils.model.model_utils import REWARD_MODEL_KEY, create_hf_model
from utils.model.reward_model import VALUE_HEAD_FILE, RewardModel
from utils.model.save import save_hf_model, save_safetensors
from utils.rl.losses import pairwise_loss
from utils.rl.tokens import last_token_index
from utils.runtime.errors import ConfigError


def reward_model(small_config, kind="llama", vocab_size=64, seed=0):
    """A small reward model with a random (non-zero) value head, in eval mode."""
    torch.manual_seed(seed)
    model = RewardModel(AutoModel.from_config(small_config(kind, vocab_size=vocab_size)))
    torch.nn.init.normal_(model.v_head.weight, std=1.0)
    return model.eval()


def padded(rows, width, side="right", pad_id=0):
    """(input_ids, attention_mask) of token lists padded to `width` on `side`."""
    ids, mask = [], []
    for row in rows:
        pad = width - len(row)
        ids.append(row + [pad_id] * pad if side == "right" else [pad_id] * pad + row)
        mask.append([1] * len(row) + [0] * pad if side == "right" else [0] * pad + [1] * len(row))
    return torch.tensor(ids), torch.tensor(mask)


# --------------------------------------------------------------------------- the loss


@pytest.mark.parametrize("chosen, rejected, expected", [
    ([2.0], [0.0], math.log(1 + math.exp(-2))),                 # 0.126928
    ([0.0], [0.0], math.log(2)),                                # no preference yet: 0.693147
    ([0.0], [2.0], math.log(1 + math.exp(2))),                  # wrong order: 2.126928
    ([2.0, 0.0], [0.0, 2.0], (0.126928 + 2.126928) / 2),        # the mean over pairs
    ([3.5, -1.0], [1.5, -3.0], 0.126928),                       # only the difference counts
])
def test_pairwise_loss_hand_worked(chosen, rejected, expected):
    loss = pairwise_loss(torch.tensor(chosen), torch.tensor(rejected))
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_pairwise_loss_is_stable_for_large_margins_and_low_precision():
    assert pairwise_loss(torch.tensor([0.0]), torch.tensor([200.0])).item() == pytest.approx(200.0)
    assert pairwise_loss(torch.tensor([200.0]), torch.tensor([0.0])).item() == pytest.approx(0.0, abs=1e-30)
    half = pairwise_loss(torch.tensor([2.0], dtype=torch.bfloat16), torch.tensor([0.0], dtype=torch.bfloat16))
    assert half.dtype == torch.float32 and half.item() == pytest.approx(0.126928, abs=1e-6)


def test_pairwise_loss_gradient_pushes_chosen_up_and_rejected_down():
    chosen, rejected = torch.tensor([2.0], requires_grad=True), torch.tensor([0.0], requires_grad=True)
    pairwise_loss(chosen, rejected).backward()
    # d/dc -log sigmoid(c - r) = -sigmoid(r - c) = -1 / (1 + e^2) = -0.119203
    assert chosen.grad.item() == pytest.approx(-0.119203, abs=1e-6)
    assert rejected.grad.item() == pytest.approx(0.119203, abs=1e-6)


# --------------------------------------------------------------------------- where the score is read


@pytest.mark.parametrize("mask, expected", [
    ([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], [2, 4]),  # right padding, and a full row
    ([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]], [4, 4]),  # left padding
    ([[1, 1, 1]], [2]),                            # no padding
    ([[1, 0, 0, 0]], [0]),                         # a single real token
])
def test_last_token_index(mask, expected):
    assert last_token_index(torch.tensor(mask)).tolist() == expected


def test_last_token_index_keeps_an_eos_that_is_also_the_pad_token():
    """With pad = eos (DS-Chat's set-up) the EOS ending an answer looks like padding by id; the mask says it is
    real, so the score lands on it and not on the token before."""
    eos = 2
    input_ids = torch.tensor([[7, 8, eos, eos, eos], [7, 8, 9, 10, eos]])
    attention_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert last_token_index(attention_mask).tolist() == [2, 4]
    assert input_ids.gather(1, last_token_index(attention_mask).unsqueeze(1)).squeeze(1).tolist() == [eos, eos]


@pytest.mark.parametrize("kind", ["llama", "opt"])
def test_end_score_is_the_value_at_the_last_real_token_whatever_the_padding(small_config, kind):
    model = reward_model(small_config, kind)
    rows = [[5, 6, 7, 8, 2], [9, 10, 2]]
    with torch.no_grad():
        values8, scores8 = model.forward_value(*padded(rows, 8))
        _, scores16 = model.forward_value(*padded(rows, 16))
        _, scores_left = model.forward_value(*padded(rows, 8, side="left"))
        alone = [model.forward_value(*padded([row], len(row)))[1].item() for row in rows]
    assert scores8.tolist() == pytest.approx([values8[0, 4].item(), values8[1, 2].item()], abs=0)
    assert scores16.tolist() == pytest.approx(scores8.tolist(), abs=1e-5)
    assert scores8.tolist() == pytest.approx(alone, abs=1e-5)
    assert scores_left.tolist() == pytest.approx(alone, abs=1e-5)
    assert scores8[0].item() != pytest.approx(values8[0, 5].item(), abs=1e-4)  # a pad position scores otherwise


@pytest.mark.parametrize("kind", ["llama", "opt"])
def test_pair_layout_first_half_chosen_second_half_rejected(small_config, kind):
    model = reward_model(small_config, kind)
    chosen, rejected = [[5, 6, 7, 2], [9, 10, 2]], [[5, 6, 8, 11, 2], [9, 12, 2]]
    with torch.no_grad():
        out = model(*padded(chosen + rejected, 5))
        scores = [model.forward_value(*padded([row], len(row)))[1].item() for row in chosen + rejected]
    assert out["chosen_end_scores"].tolist() == pytest.approx(scores[:2], abs=1e-5)
    assert out["rejected_end_scores"].tolist() == pytest.approx(scores[2:], abs=1e-5)
    expected = pairwise_loss(torch.tensor(scores[:2]), torch.tensor(scores[2:])).item()
    assert out["loss"].item() == pytest.approx(expected, abs=1e-5)


def test_pad_token_ids_do_not_change_the_loss(small_config):
    """The loss reads the end position of each row, which attends to real tokens only: whatever sits in the
    padding cannot change it."""
    model = reward_model(small_config)
    ids, mask = padded([[5, 6, 2], [5, 7, 8, 2]], 6)
    other = ids.clone()
    other[0, 3:] = 33
    with torch.no_grad():
        assert model(ids, mask)["loss"].item() == pytest.approx(model(other, mask)["loss"].item(), abs=1e-6)


# --------------------------------------------------------------------------- saving and loading


@pytest.mark.parametrize("kind", ["llama", "opt"])
def test_save_load_round_trip(small_config, tiny_tokenizer, tmp_path, kind):
    model = reward_model(small_config, kind, vocab_size=len(tiny_tokenizer))
    model.num_padding_at_beginning, model.base_model_name = 1, "some/base"
    save_hf_model(model, tiny_tokenizer, tmp_path / "rm")
    ids, mask = padded([[5, 6, 7, 2], [9, 10, 11, 12, 13, 2]], 6)
    loaded = RewardModel.from_pretrained(tmp_path / "rm", tiny_tokenizer).eval()
    with torch.no_grad():
        before, after = model.forward_value(ids, mask)[0], loaded.forward_value(ids, mask)[0]
    assert torch.equal(before, after)
    assert loaded.num_padding_at_beginning == 1 and loaded.base_model_name == "some/base"

    entry = json.loads((tmp_path / "rm" / "config.json").read_text())[REWARD_MODEL_KEY]
    assert entry == {"value_head": VALUE_HEAD_FILE, "base_model": "some/base", "num_padding_at_beginning": 1}

    backbone = AutoModel.from_pretrained(tmp_path / "rm").eval()  # a plain Hugging Face backbone
    with torch.no_grad():
        hidden = backbone(input_ids=ids[:1, :4]).last_hidden_state
        expected = model.rwtransformer(input_ids=ids[:1, :4]).last_hidden_state
    assert torch.allclose(hidden, expected, atol=1e-6)

    with pytest.raises(ConfigError, match="reward model"):
        create_hf_model(AutoModelForCausalLM, str(tmp_path / "rm"), tiny_tokenizer)


def test_a_base_model_folder_gets_a_new_head(small_config, tiny_tokenizer, tmp_path):
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(small_config("llama", vocab_size=len(tiny_tokenizer))).save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    model = RewardModel.from_pretrained(tmp_path, tiny_tokenizer, num_padding_at_beginning=1)
    assert model.base_model_name == str(tmp_path) and model.num_padding_at_beginning == 1
    assert model.v_head.weight.shape == (1, 32)


def test_a_value_head_of_the_wrong_shape_is_refused(small_config, tiny_tokenizer, tmp_path):
    save_hf_model(reward_model(small_config, vocab_size=len(tiny_tokenizer)), tiny_tokenizer, tmp_path)
    save_safetensors({"weight": torch.zeros(1, 7)}, tmp_path / VALUE_HEAD_FILE)
    with pytest.raises(ConfigError, match="value head of shape"):
        RewardModel.from_pretrained(tmp_path, tiny_tokenizer)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_value_head_takes_the_backbones_dtype(small_config, dtype):
    """Under ZeRO-3 the backbone is partitioned in the training dtype as it loads; DeepSpeed's ZeRO-3 optimizer
    refuses a model of mixed dtypes, so a new head must not be fp32 beside bf16 weights."""
    backbone = AutoModel.from_config(small_config("llama")).to(dtype)
    model = RewardModel(backbone)
    assert {p.dtype for p in model.parameters()} == {dtype}
