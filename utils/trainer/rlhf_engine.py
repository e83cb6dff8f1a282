"""The four (five with EMA) models of PPO as DeepSpeed engines.

    actor      trained; from the step-1 model; a DeepSpeedHybridEngine with --enable_hybrid_engine
    ref        frozen copy of the step-1 model, for the KL penalty (None without a KL term: uses_reference)
    critic     trained; from the step-2 reward model (backbone and value head); GAE only, None for the
               critic-free estimators (--advantage_estimator grpo, rloo, reinforce_pp)
    reward     frozen step-2 reward model; None without --critic_model_name_or_path (a reward function alone)
    actor_ema  optional exponential moving average of the actor (--enable_ema)

Frozen models are built by utils.trainer.frozen (ZeRO-3 when the trained model they shadow is, or offloaded).
Every model is built with dropout off unless asked, so experience and training see the same function.
"""
import contextlib

from utils.model.model_utils import create_hf_model
from utils.model.reward_model import RewardModel
from utils.rl.estimators import uses_critic
from utils.rl.kl import uses_reference
from utils.runtime.dist import print_rank_0
from utils.runtime.ds_utils import get_train_ds_config, merge_user_ds_config
from utils.trainer.engine import init_train_engine, prepare_trainable
from utils.trainer.frozen import frozen_causal_lm, frozen_ds_config, frozen_reward_model


def use_native_generate():
    """The hybrid engine generates with the model's own `generate()`, never with DeepSpeed's inference containers,
    on every device: on a CPU they have no kernels, and on CUDA their injected layers keep the legacy tuple cache
    that transformers 5's decoder layers replaced by Cache objects (DeepSpeed itself already leaves OPT out for this;
    on an H100 its Llama container failed on our LoRA layers, and it gives the kernel no count of key-value heads,
    which grouped-query models such as SmolLM2 have fewer of than query heads: docs/gpu.md). What the hybrid
    engine still does under ZeRO-3, DeepSpeed's gather of every layer for a whole generation, is
    `gathered_for_generation`."""
    from deepspeed.runtime.hybrid_engine import DeepSpeedHybridEngine

    DeepSpeedHybridEngine.populate_all_inference_policies = _no_inference_policies


def _no_inference_policies(hybrid_engine):
    hybrid_engine.inference_policies = {}


@contextlib.contextmanager
def gathered_for_generation(engine):
    """With --enable_hybrid_engine under ZeRO-3, the actor's parameters gathered whole once for a generation (its
    memory for its speed: DeepSpeed's hybrid engine gathers every layer the same way) and its ZeRO-3 module hooks
    taken off meanwhile, so that no forward pass fetches or releases a layer at any token, whichever decoder runs
    (the sampler's Llama decoder on a CPU, the model's own forward on a GPU or for other models, Hugging Face
    `generate`); after it the hooks are put back and the parameters partitioned again. Otherwise nothing."""
    from deepspeed.runtime.hybrid_engine import DeepSpeedHybridEngine

    if not (isinstance(engine, DeepSpeedHybridEngine) and engine.zero_optimization_stage() == 3):
        yield
        return
    with gathered_whole(engine.module), zero3_hooks_off(engine):
        yield


@contextlib.contextmanager
def zero3_hooks_off(engine):
    """A context in which a ZeRO-3 engine's module runs without the hooks that fetch each submodule's parameters
    before its forward and release them after (its parameters must be gathered meanwhile); the hooks are registered
    again after, which also makes DeepSpeed record its fetch order anew at the next forward pass."""
    from deepspeed.runtime.zero.partitioned_param_coordinator import iter_params

    offload = getattr(engine.optimizer, "parameter_offload", engine.optimizer)  # trained, or frozen
    for param in iter_params(offload.module, recurse=True):
        param.ds_active_sub_modules.clear()
    for hook in offload.forward_hooks + offload.backward_hooks:
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []
    try:
        yield
    finally:
        offload._register_deepspeed_module(offload.module)


def gathered_whole(module):
    """A context in which every ZeRO-3 parameter of `module` is gathered whole on every rank, partitioned again
    after (without writing back: nothing may change them)."""
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(module.parameters()))


class DeepSpeedRLHFEngine:

    def __init__(self, actor_path, critic_path, tokenizer, args, actor_steps, critic_steps, world_size):
        """critic_path: the step-2 folder, or None (no reward model, no critic). actor_steps, critic_steps: the
        optimizer steps each trained model will take, the length of its schedule."""
        self.args, self.tokenizer, self.world_size = args, tokenizer, world_size
        self.actor_steps, self.critic_steps = actor_steps, critic_steps
        use_native_generate()
        self.actor = self._init_actor(actor_path)
        self.ref = self._init_frozen_causal_lm(actor_path, "reference") if uses_reference(args) else None
        # The EMA is kept in fp32 whatever the run's dtype: in bf16 an update of (1 - beta) x the difference to the
        # actor (beta 0.992) is mostly under half a unit in the last place of the weight, and rounded away.
        self.actor_ema = (self._init_frozen_causal_lm(actor_path, "actor_ema", lora_from=self.actor.module,
                                                      dtype="fp32") if args.enable_ema else None)
        self.critic = self._init_critic(critic_path) if uses_critic(args) else None
        self.reward = self._init_reward(critic_path) if critic_path else None

    def _train_config(self, stage, offload, hybrid=False):
        """The DeepSpeed config of a trained engine (actor or critic), with the user's --deepspeed_config on top."""
        args = self.args
        config = get_train_ds_config(
            micro_batch_size=args.per_device_training_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps, world_size=self.world_size,
            dtype=args.dtype, stage=stage, offload=offload, enable_hybrid_engine=hybrid,
            inference_tp_size=args.inference_tp_size, release_inference_cache=args.release_inference_cache,
            pin_parameters=not args.unpin_actor_parameters, tp_gather_partition_size=args.tp_gather_partition_size,
            max_out_tokens=args.max_prompt_seq_len + args.max_answer_seq_len)
        return merge_user_ds_config(config, args.deepspeed_config, batch_flag="--per_device_training_batch_size")

    def _frozen_config(self, trained_stage, offload, dtype=None):
        return frozen_ds_config(trained_stage=trained_stage, offload=offload, world_size=self.world_size,
                                micro_batch_size=self.args.per_device_training_batch_size,
                                dtype=dtype or self.args.dtype)

    def _init_actor(self, path):
        from transformers import AutoModelForCausalLM

        args = self.args
        ds_config = self._train_config(args.actor_zero_stage, args.offload, args.enable_hybrid_engine)
        model = create_hf_model(AutoModelForCausalLM, path, self.tokenizer, ds_config, args.actor_dropout,
                                args.trust_remote_code)
        engine = self._train_engine(model, ds_config, "actor", self.actor_steps)
        print_rank_0(f"actor: {type(engine).__name__}, ZeRO-{args.actor_zero_stage}")
        return engine

    def _init_frozen_causal_lm(self, path, what, lora_from=None, dtype=None):
        args = self.args
        ds_config = self._frozen_config(args.actor_zero_stage, args.offload_reference_model, dtype)
        return frozen_causal_lm(path, self.tokenizer, ds_config, what, dropout=args.actor_dropout,
                                trust_remote_code=args.trust_remote_code, lora_from=lora_from,
                                lora_dim=args.actor_lora_dim, lora_module_name=args.actor_lora_module_name)

    def _init_critic(self, path):
        args = self.args
        ds_config = self._train_config(args.critic_zero_stage, args.offload)
        model = RewardModel.from_pretrained(path, self.tokenizer, ds_config, args.critic_dropout,
                                            args.num_padding_at_beginning, args.trust_remote_code)
        engine = self._train_engine(model, ds_config, "critic", self.critic_steps)
        print_rank_0(f"critic: ZeRO-{args.critic_zero_stage}")
        return engine

    def _train_engine(self, model, ds_config, role, num_training_steps):
        """The DeepSpeed engine of a trained model, `role` "actor" or "critic" naming its --<role>_* flags."""
        args = self.args

        def flag(name):
            return getattr(args, f"{role}_{name}")

        prepare_trainable(model, lora_dim=flag("lora_dim"), lora_module_name=flag("lora_module_name"),
                          only_optimize_lora=args.only_optimize_lora,
                          gradient_checkpointing=flag("gradient_checkpointing"))
        return init_train_engine(model, ds_config=ds_config, learning_rate=flag("learning_rate"),
                                 weight_decay=flag("weight_decay"), lora_learning_rate=flag("lora_learning_rate"),
                                 offload=args.offload, lr_scheduler_type=args.lr_scheduler_type,
                                 num_warmup_steps=args.num_warmup_steps, num_training_steps=num_training_steps)

    def _init_reward(self, path):
        args = self.args
        ds_config = self._frozen_config(args.critic_zero_stage, args.offload_reward_model)
        return frozen_reward_model(path, self.tokenizer, ds_config, dropout=args.critic_dropout,
                                   num_padding_at_beginning=args.num_padding_at_beginning,
                                   trust_remote_code=args.trust_remote_code)
