"""Tests of the two DeepSpeed shortcuts `init_train_engine` takes on a world of one at ZeRO-0 (bench/ measured
them): no gradient all-reduce when nothing is data-parallel, and no separate inf/NaN scan in bf16, where a
non-finite gradient must still skip the step (through the gradient norm)."""
import pytest
import torch

from utils.runtime.ds_utils import get_train_ds_config
from utils.trainer.engine import init_train_engine


def make_engine(config, stage, dtype):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    ds_config = get_train_ds_config(micro_batch_size=2, gradient_accumulation_steps=1, world_size=1, dtype=dtype,
                                    stage=stage)
    return init_train_engine(LlamaForCausalLM(config), ds_config=ds_config, learning_rate=1e-2, weight_decay=0.0,
                             lora_learning_rate=None, offload=False, lr_scheduler_type="constant",
                             num_warmup_steps=0, num_training_steps=10)


def backward(engine):
    ids = torch.randint(0, 64, (2, 8))
    engine.backward(engine(input_ids=ids, labels=ids, use_cache=False).loss)


@pytest.mark.parametrize("stage, reduces", [(0, False), (2, True)])
def test_allreduce_is_skipped_only_without_data_parallelism_at_zero0(distributed, small_config, one_thread, stage,
                                                                     reduces):
    engine = make_engine(small_config(), stage, "fp32")
    assert engine.enable_backward_allreduce is reduces
    before = [p.detach().clone() for p in engine.module.parameters()]
    backward(engine)
    engine.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, engine.module.parameters()))


def test_bf16_zero0_steps_and_still_skips_a_non_finite_gradient(distributed, small_config, one_thread):
    engine = make_engine(small_config(), 0, "bf16")
    params = list(engine.module.parameters())
    before = [p.detach().clone() for p in params]
    backward(engine)
    params[1].grad.view(-1)[0] = float("inf")
    engine.step()
    assert engine.skipped_steps == 1
    assert all(torch.equal(a, p) for a, p in zip(before, params))
    backward(engine)
    engine.step()
    assert engine.skipped_steps == 1
    assert any(not torch.equal(a, p) for a, p in zip(before, params))
