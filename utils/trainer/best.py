"""--load_best_model_at_end: the actor's weights at its best validation score, put back before the final save (as
the Hugging Face Trainer's flag of that name does), so that RL which never beats the model it started from returns
that model rather than a worse one."""
import torch

from utils.model.save import release_prefetched


class BestWeights:
    """The trainable parameters of a DeepSpeed engine's model (all that training changes: the LoRA factors under
    --only_optimize_lora) as they were at the best score seen so far, whole (gathered under ZeRO-3) in CPU memory.
    A later score must be strictly higher to replace them, so a tie keeps the earlier weights: with an evaluation
    before training, the starting model. Every rank must call `observe` and `restore` (ZeRO-3 gathers)."""

    def __init__(self, engine):
        self.engine = engine
        self.params = {name: param for name, param in engine.module.named_parameters() if param.requires_grad}
        self.step, self.score, self.tensors = None, None, {}

    def observe(self, step, score):
        """Keep the weights as they are now when `score` (a number, higher is better) beats the best so far;
        True when it did."""
        if self.score is not None and not score > self.score:  # NaN never beats anything
            return False
        release_prefetched(self.engine)
        tensors = {}
        for name, param in self.params.items():
            with _gathered(param):
                tensors[name] = param.detach().to("cpu", copy=True)
        self.step, self.score, self.tensors = step, float(score), tensors
        return True

    def restore(self):
        """Put the kept weights back into the model (under ZeRO-3 into every rank's partition)."""
        release_prefetched(self.engine)
        with torch.no_grad():
            for name, param in self.params.items():
                with _gathered(param, modifier_rank=0):
                    param.copy_(self.tensors[name].to(param.device, param.dtype))

    def state_dict(self):
        return {"step": self.step, "score": self.score}

    def load_state_dict(self, state):
        self.step, self.score = state["step"], state["score"]

    def state_tensors(self):
        """The kept weights, for a checkpoint (utils.trainer.checkpoint saves them as safetensors)."""
        return self.tensors

    def load_state_tensors(self, tensors):
        missing = sorted(set(self.params) - set(tensors))
        if missing:
            raise ValueError(f"the kept best weights lack {missing[:3]}")
        self.tensors = {name: tensors[name] for name in self.params}


def _gathered(param, modifier_rank=None):
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=modifier_rank, enabled=hasattr(param, "ds_id"))
