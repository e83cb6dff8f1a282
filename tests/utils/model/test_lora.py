"""Tests of utils/model/lora.py on small real Llama and OPT models: which layers convert, exactness at conversion,
fusing back into a plain model, freezing, and the refused filter."""
import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from utils.model.lora import (LinearLayerLoRA, convert_linear_layer_to_lora, fuse_lora_state_dict, has_lora,
                              only_optimize_lora_parameters)
from utils.runtime.errors import ConfigError

KINDS = ("llama", "opt")


def build(small_config, kind, seed=0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(small_config(kind)).eval()  # eval: OPT has dropout


def logits(model, input_ids):
    with torch.no_grad():
        return model(input_ids=input_ids).logits


def input_ids():
    return torch.randint(4, 64, (2, 9), generator=torch.Generator().manual_seed(1))


def linear_names(model):
    return {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}


def perturb_lora(model, seed=3):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LinearLayerLoRA):
                module.lora_left_weight.copy_(torch.randn(module.lora_left_weight.shape, generator=generator) * 0.5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("names", ["layers.", "q_proj,v_proj", ["fc1", "down_proj"]])
def test_convert_replaces_exactly_the_matching_linears(small_config, kind, names):
    model = build(small_config, kind)
    parts = names.split(",") if isinstance(names, str) else names
    expected = {name for name in linear_names(model) if any(part in name for part in parts)}
    originals = {name: model.get_submodule(name).weight for name in expected}
    assert not has_lora(model)
    convert_linear_layer_to_lora(model, names, lora_dim=4)
    converted = {name for name, module in model.named_modules() if isinstance(module, LinearLayerLoRA)}
    assert converted == expected and converted  # "fc1" is OPT's, "down_proj" Llama's
    assert has_lora(model)
    assert isinstance(model.get_submodule("lm_head"), nn.Linear)  # outside the decoder layers: untouched
    for name in converted:
        layer = model.get_submodule(name)
        assert layer.weight is originals[name]  # the same frozen Parameter (ZeRO partitions it as before)
        assert not layer.weight.requires_grad
        assert layer.lora_right_weight.shape == (layer.weight.shape[1], 4)
        assert layer.lora_left_weight.shape == (4, layer.weight.shape[0])
        assert torch.count_nonzero(layer.lora_left_weight) == 0
        assert torch.count_nonzero(layer.lora_right_weight) > 0


@pytest.mark.parametrize("kind", KINDS)
def test_fresh_lora_model_computes_what_the_model_did(small_config, kind):
    model = build(small_config, kind)
    before = logits(model, input_ids())
    convert_linear_layer_to_lora(model, "layers.", lora_dim=8, lora_scaling=2.0)
    assert torch.equal(logits(model, input_ids()), before)


@pytest.mark.parametrize("kind", KINDS)
def test_fused_state_dict_loads_into_a_plain_model(small_config, kind):
    model = build(small_config, kind)
    before = logits(model, input_ids())
    convert_linear_layer_to_lora(model, "layers.", lora_dim=4, lora_scaling=3.0)
    perturb_lora(model)
    lora_logits = logits(model, input_ids())
    assert not torch.allclose(lora_logits, before, atol=1e-3)  # the factors do change the model
    fused = fuse_lora_state_dict(model, model.state_dict())
    assert not [key for key in fused if "lora" in key]
    plain = build(small_config, kind, seed=99)
    plain.load_state_dict(fused, strict=True)
    torch.testing.assert_close(logits(plain, input_ids()), lora_logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_only_optimize_lora_parameters(small_config, kind):
    model = build(small_config, kind)
    convert_linear_layer_to_lora(model, "layers.", lora_dim=4)
    only_optimize_lora_parameters(model)
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    layers = [name for name, module in model.named_modules() if isinstance(module, LinearLayerLoRA)]
    assert trainable == {f"{name}.{factor}" for name in layers for factor in ("lora_right_weight",
                                                                               "lora_left_weight")}
    assert len(layers) == len([n for n in linear_names(build(small_config, kind)) if "layers." in n])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("names", ["no_such_module", "embed_tokens", " , "])
def test_a_filter_matching_no_linear_is_refused(small_config, kind, names):
    model = build(small_config, kind)
    with pytest.raises(ConfigError, match="--lora_module_name"):
        convert_linear_layer_to_lora(model, names, lora_dim=4)
    assert not has_lora(model)


def test_only_optimize_lora_keeps_the_parameters_a_model_marks_always_trainable(small_config):
    from transformers import AutoModel

    from utils.model.reward_model import RewardModel

    model = RewardModel(AutoModel.from_config(small_config("llama")))
    convert_linear_layer_to_lora(model, "layers.", 4)
    only_optimize_lora_parameters(model)
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    assert "v_head.weight" in trainable
    assert trainable - {"v_head.weight"} and all("lora_" in name for name in trainable - {"v_head.weight"})
    assert not model.rwtransformer.embed_tokens.weight.requires_grad
