"""LoRA (Hu et al., 2021) as DeepSpeed-Chat does it: named `nn.Linear` layers gain two low-rank factors, the
frozen weight stays where it was (so ZeRO partitions it as before), and saving fuses the factors back.

    y = x W^T + b + (dropout(x) R L) * scaling,   R: (in, r), L: (r, out), scaling = lora_scaling / r

R starts Kaiming-uniform and L at zero, so a freshly converted model computes exactly what it did before.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from utils.runtime.errors import ConfigError


class LinearLayerLoRA(nn.Module):
    """A linear layer whose frozen `weight` (and `bias`) are those of the layer it replaces."""

    def __init__(self, linear, lora_dim, lora_scaling=1.0, lora_dropout=0.0):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        out_features, in_features = getattr(self.weight, "ds_shape", self.weight.shape)
        factory = {"dtype": self.weight.dtype, "device": self.weight.device}
        self.lora_right_weight = nn.Parameter(torch.empty(in_features, lora_dim, **factory))
        self.lora_left_weight = nn.Parameter(torch.zeros(lora_dim, out_features, **factory))
        nn.init.kaiming_uniform_(self.lora_right_weight, a=math.sqrt(5))
        self.lora_scaling = lora_scaling / lora_dim
        self.lora_dropout = nn.Dropout(lora_dropout) if lora_dropout > 0 else nn.Identity()
        self.weight.requires_grad = False

    def forward(self, x):
        base = F.linear(x, self.weight, self.bias)
        return base + (self.lora_dropout(x) @ self.lora_right_weight @ self.lora_left_weight) * self.lora_scaling


def convert_linear_layer_to_lora(model, module_names, lora_dim, lora_scaling=1.0, lora_dropout=0.0):
    """Replace every `nn.Linear` whose qualified name contains one of `module_names` (a comma-separated string
    or a list) by a `LinearLayerLoRA`. Returns the model; refuses a filter that matches nothing."""
    if isinstance(module_names, str):
        module_names = [name.strip() for name in module_names.split(",") if name.strip()]
    targets = [name for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and any(part in name for part in module_names)]
    if not targets:
        raise ConfigError(f"--lora_module_name {','.join(module_names)!r} matches no linear layer of the model "
                          "(Llama and OPT decoders use 'layers.')")
    for name in targets:
        parent_name, _, child_name = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child_name, LinearLayerLoRA(getattr(parent, child_name), lora_dim, lora_scaling,
                                                    lora_dropout))
    return model


def only_optimize_lora_parameters(model):
    """Freeze everything but the LoRA factors and the parameters a model names in `always_trainable` (name
    prefixes: a reward model's new value head must learn even when its backbone is frozen)."""
    keep = tuple(getattr(model, "always_trainable", ()))
    for name, param in model.named_parameters():
        param.requires_grad = "lora_right_weight" in name or "lora_left_weight" in name or name.startswith(keep)
    return model


def has_lora(model):
    return any(isinstance(module, LinearLayerLoRA) for module in model.modules())


def fold(weight, right, left, scaling):
    """The weight of the plain linear layer a LoRA layer computes (without dropout): W + scaling * (R L)^T, in
    float32, back to W's dtype; (R L)^T is computed as L^T R^T, in W's layout, in the same fused op as the sum
    (about 4x faster than adding a transposed product, which the decoder pays once a sampling call)."""
    return torch.addmm(weight.float(), left.float().t(), right.float().t(), alpha=scaling).to(weight.dtype)


def effective_weight(linear):
    """(weight, bias) of the plain linear layer `linear` computes in eval mode: its own for an `nn.Linear`, the
    factors folded in (a new tensor) for a `LinearLayerLoRA`."""
    if isinstance(linear, LinearLayerLoRA):
        return fold(linear.weight, linear.lora_right_weight, linear.lora_left_weight, linear.lora_scaling), linear.bias
    return linear.weight, linear.bias


def fuse_lora_state_dict(model, state_dict):
    """Return a copy of a full (gathered) `state_dict` of `model` with each LoRA layer's factors folded into its
    weight (`fold`) and the factor entries removed: the state dict of the plain model."""
    fused = dict(state_dict)
    for name, module in model.named_modules():
        if not isinstance(module, LinearLayerLoRA):
            continue
        prefix = f"{name}." if name else ""
        right, left = fused.pop(prefix + "lora_right_weight"), fused.pop(prefix + "lora_left_weight")
        fused[prefix + "weight"] = fold(fused[prefix + "weight"], right, left, module.lora_scaling)
    return fused
