"""Tests of --load_best_model_at_end's BestWeights (utils/trainer/best.py) on real DeepSpeed engines in this
process (a world of one) at ZeRO-0 and ZeRO-3: the weights of the best score are the ones put back (a tie or a NaN
keeps the earlier), and they travel through a checkpoint and its resume."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from utils.runtime.ds_utils import get_train_ds_config
from utils.trainer.best import BestWeights
from utils.trainer.checkpoint import Checkpointer, TrainingPosition
from utils.trainer.engine import init_train_engine
from utils.data.data_utils import DataCollatorSFT, ListDataset, make_dataloader


@pytest.fixture()
def make_engine(distributed, small_config):
    def make(stage):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(small_config("llama"))
        config = get_train_ds_config(micro_batch_size=2, gradient_accumulation_steps=1, world_size=1, dtype="fp32",
                                     stage=stage)
        return init_train_engine(model, ds_config=config, learning_rate=5e-2, weight_decay=0.0,
                                 lora_learning_rate=None, offload=False, lr_scheduler_type="constant",
                                 num_warmup_steps=0, num_training_steps=20)

    return make


BATCH = {"input_ids": torch.tensor([[4, 5, 6, 7], [8, 9, 10, 11]]), "labels": torch.tensor([[4, 5, 6, 7],
                                                                                           [8, 9, 10, 11]])}


def train_step(engine):
    loss = engine(**BATCH, use_cache=False).loss
    engine.backward(loss)
    engine.step()


def whole(engine):
    """{name: full parameter} (gathered under ZeRO-3)."""
    import deepspeed

    out = {}
    for name, param in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([param], enabled=hasattr(param, "ds_id")):
            out[name] = param.detach().clone()
    return out


def same(a, b):
    return all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.parametrize("stage", [0, 3])
def test_the_best_scores_weights_are_put_back_and_a_tie_or_nan_keeps_the_earlier(make_engine, stage):
    engine = make_engine(stage)
    best = BestWeights(engine)
    snapshots = []
    for step, score in enumerate([0.2, 0.5, 0.5, float("nan"), 0.3]):
        if step:
            train_step(engine)
        snapshots.append(whole(engine))
        assert best.observe(step, score) == (step in (0, 1))
    assert best.state_dict() == {"step": 1, "score": 0.5, "scores": None}
    assert not same(snapshots[1], snapshots[4])  # training moved the weights after the best
    best.restore()
    assert same(whole(engine), snapshots[1])
    if stage == 3:  # partitioned again, and training goes on from the restored weights
        assert all(param.numel() == 0 for param in engine.module.parameters() if param.ds_numel > 64)
    train_step(engine)
    assert not same(whole(engine), snapshots[1])


def test_the_kept_weights_travel_through_a_checkpoint(make_engine, tmp_path):
    engine = make_engine(0)
    loader = make_dataloader(ListDataset([{"input_ids": [4, 5, 6], "labels": [4, 5, 6]}] * 4), DataCollatorSFT(0), 2,
                             True, 0)
    best = BestWeights(engine)
    best.observe(0, 0.4)
    kept = whole(engine)
    train_step(engine)
    Checkpointer(tmp_path, 1, 2, {"model": engine}, TrainingPosition(loader), tensors={"best": best}).save(
        1, {"best": best.state_dict()})

    other = make_engine(0)
    train_step(other)
    train_step(other)  # elsewhere than either
    resumed_best = BestWeights(other)
    state = Checkpointer(tmp_path, 1, 2, {"model": other}, TrainingPosition(loader),
                         tensors={"best": resumed_best}).resume()
    resumed_best.load_state_dict(state["best"])
    assert resumed_best.state_dict() == {"step": 0, "score": 0.4, "scores": None}
    resumed_best.restore()
    assert same(whole(other), kept)
