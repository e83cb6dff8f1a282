"""--load_best_model_at_end: a model's weights at its best evaluation, put back before the final save (as the
Hugging Face Trainer's flag of that name does): step 3's actor at its best validation score, so that RL which never
beats the model it started from returns that model rather than a worse one; steps 1 and 2's, DPO's and KTO's model
at its best eval loss (step 1's score), rather than as it was --early_stopping_patience evaluations later."""
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
        self.step, self.score, self.scores, self.tensors = None, None, None, {}

    def observe(self, step, score):
        """Keep the weights as they are now when `score` (a number, higher is better) beats the best so far;
        True when it did."""
        if self.score is not None and not score > self.score:  # NaN never beats anything
            return False
        self.keep(step, score)
        return True

    def keep(self, step, score, scores=None):
        """Keep the weights as they are now, the best so far by the caller's rule: `score` its figure, `scores`
        the evaluation's (what the step reports after training where these weights are the ones saved)."""
        release_prefetched(self.engine)
        tensors = {}
        for name, param in self.params.items():
            with _gathered(param):
                tensors[name] = param.detach().to("cpu", copy=True)
        self.step, self.score, self.scores, self.tensors = step, float(score), scores, tensors

    def restore(self):
        """Put the kept weights back into the model (under ZeRO-3 into every rank's partition)."""
        release_prefetched(self.engine)
        with torch.no_grad():
            for name, param in self.params.items():
                with _gathered(param, modifier_rank=0):
                    param.copy_(self.tensors[name].to(param.device, param.dtype))

    STATE_SHAPE = {"step": (None, 0), "score": (None, 0.0), "scores": (None, {})}
    """The shape of state_dict() (utils.trainer.checkpoint.json_shape_problem), checked before a resume."""

    def state_dict(self):
        return {"step": self.step, "score": self.score, "scores": self.scores}

    def load_state_dict(self, state):
        self.step, self.score, self.scores = state["step"], state["score"], state.get("scores")

    def state_tensors(self):
        """The kept weights, for a checkpoint (utils.trainer.checkpoint saves them as safetensors)."""
        return self.tensors

    def load_state_tensors(self, tensors):
        if not tensors:  # a checkpoint written before the first evaluation: nothing kept yet
            self.tensors = {}
            return
        missing = sorted(set(self.params) - set(tensors))
        if missing:
            raise ValueError(f"the kept best weights lack {missing[:3]}")
        self.tensors = {name: tensors[name] for name in self.params}


def _gathered(param, modifier_rank=None):
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=modifier_rank, enabled=hasattr(param, "ds_id"))
