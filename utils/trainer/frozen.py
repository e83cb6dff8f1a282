"""Frozen models: the reference policy (KL penalty, DPO), a reward model, and the EMA of a trained policy.

A frozen model is a DeepSpeed inference-only engine: no optimizer, every parameter with requires_grad=False,
eval mode (dropout off). It uses ZeRO-3 when the trained model it shadows does (so it is partitioned like it)
or when it is offloaded to the CPU; ZeRO-0 otherwise.
"""
import deepspeed
import torch

from utils.model.lora import convert_linear_layer_to_lora
from utils.model.model_utils import create_hf_model, resolve_model_path
from utils.model.reward_model import RewardModel
from utils.runtime.args import ArgumentParser, add_offload_reference_model_arg, add_step_args
from utils.runtime.dist import print_rank_0
from utils.runtime.ds_utils import get_eval_ds_config
from utils.runtime.errors import ConfigError


def frozen_ds_config(*, trained_stage, offload, micro_batch_size, world_size, dtype):
    """The DeepSpeed config of a model frozen beside one trained at ZeRO `trained_stage`."""
    stage = 3 if trained_stage == 3 or offload else 0
    return get_eval_ds_config(micro_batch_size=micro_batch_size, world_size=world_size, dtype=dtype, stage=stage,
                              offload=offload)


def init_frozen(model, ds_config, what):
    """Wrap `model` as a frozen DeepSpeed engine (no gradients, eval mode)."""
    for param in model.parameters():
        param.requires_grad = False
    engine, *_ = deepspeed.initialize(model=model, config=ds_config)
    engine.eval()
    print_rank_0(f"{what}: frozen, ZeRO-{ds_config['zero_optimization']['stage']}")
    return engine


def frozen_causal_lm(path, tokenizer, ds_config, what, *, dropout=0.0, trust_remote_code=False, lora_from=None,
                     lora_dim=0, lora_module_name="layers."):
    """A frozen causal LM (reference, EMA). With `lora_from` (the trained policy, for its EMA) and lora_dim > 0 it
    takes that model's LoRA layers and factors, so parameters pair up one to one."""
    from transformers import AutoModelForCausalLM

    model = create_hf_model(AutoModelForCausalLM, path, tokenizer, ds_config, dropout, trust_remote_code)
    if lora_from is not None and lora_dim > 0:
        convert_linear_layer_to_lora(model, lora_module_name, lora_dim)
        copy_lora_factors(lora_from, model)
    return init_frozen(model, ds_config, what)


def reference_stage_parser(description):
    """The parser of a preference stage trained against a frozen reference (DPO, KTO): a step's flags (learning
    rate 1e-4, --eval_interval), the reference's (read by resolve_reference_path and load_reference), and dropout
    off by default; the caller adds its loss's group and parses (parse_step_args)."""
    parser = ArgumentParser(description=description)
    groups = add_step_args(parser, default_lr=1e-4, eval_interval=True)
    groups["model"].add_argument("--ref_model_name_or_path", type=str, default=None,
                                 help="The frozen reference (default: --model_name_or_path, the weights training "
                                      "starts from).")
    add_offload_reference_model_arg(groups["deepspeed"])
    parser.set_defaults(dropout=0.0)  # policy and reference must compute the same function at step 0
    return parser


def add_beta_arg(group, help):
    """--beta, the scale of a preference stage's log-ratio to its reference (DPO, KTO; `help` says what it is in
    the stage's losses)."""
    group.add_argument("--beta", type=float, default=0.1, help=help)


def resolve_reference_path(args, model_path):
    """The folder of a preference stage's frozen reference (DPO, KTO): --ref_model_name_or_path, or by default
    `model_path`, the policy's own start; its vocabulary checked against the policy's."""
    if args.ref_model_name_or_path is None:
        return model_path
    try:
        ref_path = resolve_model_path(args.ref_model_name_or_path)
    except ConfigError as err:
        raise ConfigError(f"--ref_model_name_or_path: {err}") from None
    from transformers import AutoConfig

    sizes = [AutoConfig.from_pretrained(path, trust_remote_code=args.trust_remote_code).vocab_size
             for path in (model_path, ref_path)]
    if sizes[0] != sizes[1]:
        raise ConfigError(f"--ref_model_name_or_path {args.ref_model_name_or_path} has a vocabulary of {sizes[1]} "
                          f"tokens, the model {args.model_name_or_path} one of {sizes[0]}: they must share a "
                          "tokenizer")
    return ref_path


def load_reference(ref_path, tokenizer, args, world_size):
    """A preference stage's frozen reference (DPO, KTO), from its flags: ZeRO-3 when the policy is (--zero_stage)
    or when offloaded (--offload_reference_model), ZeRO-0 otherwise."""
    ds_config = frozen_ds_config(trained_stage=args.zero_stage, offload=args.offload_reference_model,
                                 micro_batch_size=args.per_device_train_batch_size, world_size=world_size,
                                 dtype=args.dtype)
    return frozen_causal_lm(ref_path, tokenizer, ds_config, "reference", dropout=args.dropout,
                            trust_remote_code=args.trust_remote_code)


def frozen_reward_model(path, tokenizer, ds_config, *, dropout=0.0, num_padding_at_beginning=0,
                        trust_remote_code=False):
    """A frozen step-2 reward model (backbone and value head)."""
    model = RewardModel.from_pretrained(path, tokenizer, ds_config, dropout, num_padding_at_beginning,
                                        trust_remote_code)
    return init_frozen(model, ds_config, "reward")


def copy_lora_factors(source, target):
    """Start the EMA's LoRA factors from the policy's (they are random at conversion). The policy is already a
    DeepSpeed engine: under ZeRO-3 its factors are partitioned (empty on this rank) unless small, so each is
    gathered for the copy (and the target too, with `modifier_rank=0`, should it be partitioned already)."""
    source_params = dict(source.named_parameters())
    with torch.no_grad():
        for name, param in target.named_parameters():
            if "lora_" in name:
                source_param = source_params[name]
                to_gather = [p for p in (source_param, param) if hasattr(p, "ds_id")]
                with deepspeed.zero.GatheredParameters(to_gather, modifier_rank=0, enabled=bool(to_gather)):
                    param.copy_(source_param.detach())


def moving_average(model, model_ema, beta=0.992):
    """ema <- beta * ema + (1 - beta) * model, parameter by parameter.

    ZeRO-3 partitioned parameters (of either model) are gathered first, with `modifier_rank=0`, so the update
    is written back to every partition when the gather ends (without it the update is lost on re-partition)."""
    with torch.no_grad():
        for param, param_ema in zip(model.parameters(), model_ema.parameters()):
            to_gather = [p for p in (param, param_ema) if hasattr(p, "ds_id")]
            with deepspeed.zero.GatheredParameters(to_gather, modifier_rank=0, enabled=bool(to_gather)):
                param_ema.data.copy_(torch.lerp(param.data.to(param_ema.dtype), param_ema.data, beta))
