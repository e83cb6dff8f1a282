"""When a step stops before its step budget: --early_stopping_patience N (its eval loss, or step 1's checker score
with --early_stopping_metric score, has not improved for N evaluations in a row, as transformers'
EarlyStoppingCallback; a score counts as still improving while the eval loss does, since a score on a few questions
can stay flat over many steps of a task the model rarely solves yet), --max_train_minutes M (a time budget on its
training loop, so that a recipe's step counts adapt to the task and to the machine) and, in step 3 with dynamic
sampling, --stop_after_idle_rounds R (R rounds in a row found no group whose answers' scores differ: the policy
answers every prompt alike, right or wrong, and a group-relative estimator has nothing left to train on) and
--deadline T (step 3: a wall-clock time, train.py's --time-budget, by which the step and what runs after it must
end: training stops when the time left is what they still need, `reserve_s`, which the step keeps up to date).
Checked at the end of an optimizer step (step 3: a PPO round); the state travels in checkpoints, so a resumed run
stops where the uninterrupted one would have by the first rule, and counts the minutes trained before the
interruption in the second."""
import time

import torch

from utils.runtime.dist import all_reduce_sum, print_rank_0


HIGHER_IS_BETTER = ("score",)
"""The evaluation figures early stopping watches that improve upward (the eval loss improves downward)."""


class StopRule:
    """`observe(step, scores)` after each mid-run evaluation; `reason(step, total_steps)`, at a step's end, is None
    to go on or the one line that says why training stops now. Every process reaches the same answer (the eval loss is already
    averaged over them; the clock is the slowest process's)."""

    def __init__(self, patience=0, max_minutes=0.0, metric="loss", state=None, device="cpu", idle_rounds=0,
                 deadline=0.0):
        self.patience, self.max_minutes, self.metric, self.device = patience, max_minutes, metric, device
        self.idle_patience, self.deadline = idle_rounds, deadline
        self.reserve_s = 0.0  # with a deadline: the seconds the step still needs once training stops
        state = state or {}
        self.idle_rounds = state.get("idle_rounds", 0)
        self.best = state.get("best")
        self.best_step = state.get("best_step")
        self.best_loss = state.get("best_loss")  # with a score: the loss of its best evaluation, and the lowest
        self.lowest_loss = state.get("lowest_loss")
        self.bad_evaluations = state.get("bad_evaluations", 0)
        self.trained_before = state.get("trained_s", 0.0)  # the minutes of the run's earlier lives
        self.started = time.monotonic()
        self.stopped = state.get("stopped")  # a run resumed from the checkpoint of its stop has nothing left

    def observe(self, step, scores):
        """A mid-run evaluation's `scores`; True when its metric is the best so far (strictly; a score's tie with
        a lower eval loss is better, any other tie keeps the earlier), which --load_best_model_at_end keeps."""
        if self.metric not in scores:
            return False
        value, loss = scores[self.metric], scores.get("loss")
        if self.metric in HIGHER_IS_BETTER:
            best = self.best is None or value > self.best or (value == self.best and _lower(loss, self.best_loss))
            lower = _lower(loss, self.lowest_loss)
            progress = best or lower
            if lower:
                self.lowest_loss = loss
        else:
            best = progress = self.best is None or value < self.best
        if best:
            self.best, self.best_step, self.best_loss = value, step, loss
        self.bad_evaluations = 0 if progress else self.bad_evaluations + 1
        return best

    def observe_round(self, trained_rows):
        """After each step-3 round: the rollouts it trained on (0: every group's answers scored alike)."""
        self.idle_rounds = self.idle_rounds + 1 if trained_rows == 0 else 0

    def trained_s(self):
        return self.trained_before + time.monotonic() - self.started

    def reason(self, step, total_steps=None):
        """None to go on, else the line (printed here) that says why training stops at `step`; None at the step
        budget's last step (`total_steps`), where training ends anyway."""
        if total_steps is not None and step >= total_steps:
            return None
        if self.patience and self.bad_evaluations >= self.patience:
            loss = f", nor the eval loss (lowest {self.lowest_loss:.4f})" if self.lowest_loss is not None else ""
            why = (f"the eval {self.metric} has not improved for {self.bad_evaluations} evaluations{loss} "
                   f"(best {self.best:.4f} at step {self.best_step}; --early_stopping_patience {self.patience})")
        elif self.idle_patience and self.idle_rounds >= self.idle_patience:
            why = (f"{self.idle_rounds} rounds in a row found no group whose answers' scores differ: every prompt "
                   f"is answered alike, nothing is left to train on (--stop_after_idle_rounds {self.idle_patience})")
        elif self.max_minutes and self._late(self.trained_s() >= self.max_minutes * 60):
            why = f"--max_train_minutes {self.max_minutes:g} is spent"
        elif self.deadline and self._late(time.time() + self.reserve_s >= self.deadline):
            why = (f"--deadline is {max(0.0, self.deadline - time.time()):.0f} s away, and saving and evaluating "
                   f"after training need about {self.reserve_s:.0f} s")
        else:
            return None
        self.stopped = {"step": step, "reason": why}
        print_rank_0(f"stopped at step {step}: {why}")
        return f"stopped at step {step}: {why}"

    def _late(self, late_here):
        # One answer for all, or a process would wait for the others forever: late when any process is.
        return all_reduce_sum(torch.tensor(float(late_here), device=self.device)).item() > 0

    STATE_SHAPE = {"best": (None, 0.0), "best_step": (None, 0), "best_loss": (None, 0.0), "lowest_loss": (None, 0.0),
                   "bad_evaluations": 0, "idle_rounds": 0, "trained_s": 0.0,
                   "stopped": (None, {"step": 0, "reason": ""})}
    """The shape of state_dict() (utils.trainer.checkpoint.json_shape_problem), checked before a resume."""

    def state_dict(self):
        return {"best": self.best, "best_step": self.best_step, "best_loss": self.best_loss,
                "lowest_loss": self.lowest_loss, "bad_evaluations": self.bad_evaluations,
                "idle_rounds": self.idle_rounds, "trained_s": self.trained_s(), "stopped": self.stopped}

    def metrics(self):
        """What metrics.json keeps of it: {"stopped": {"step", "reason"}} when the rule stopped the run."""
        return {"stopped": self.stopped} if self.stopped else {}


def _lower(loss, than):
    """`loss` is below `than` (None, no loss yet: any loss is)."""
    return loss is not None and (than is None or loss < than)


def stop_rule_from_args(args, device, state=None):
    """The rule of a step's flags (a step without --early_stopping_patience has only the time budget; only step 3
    has --stop_after_idle_rounds and --deadline)."""
    return StopRule(getattr(args, "early_stopping_patience", 0), args.max_train_minutes,
                    metric=getattr(args, "early_stopping_metric", "loss"), state=state, device=device,
                    idle_rounds=getattr(args, "stop_after_idle_rounds", 0), deadline=getattr(args, "deadline", 0.0))


class Reserve:
    """What a step with a --deadline still needs once its training stops, in seconds (StopRule.reserve_s): its
    setup's time again (saving its models, and the evaluation after it loading its own, take about as long as
    loading them did), its longest round (the one the check lets start), one more held-out evaluation (the one at
    the stop), and `answers` more answers decoded at the rate its held-out evaluations decode (before the first,
    its rollouts'); where `greedy_answers` of them are greedy and the evaluations timed each decoding, the greedy
    ones at the greedy rate and the rest at the sampled one (greedy answers that loop to the token limit take
    several times a sampled one's time)."""

    def __init__(self, setup_s, answers, greedy_answers=None):
        self.setup_s, self.answers, self.greedy_answers = setup_s, answers, greedy_answers
        self.round_s = self.eval_s = 0.0
        self.rates = {}  # "evaluation" / "rollouts" / a decoding's name: seconds per answer

    def observe_round(self, seconds, generation_s, answers):
        """After a round: its whole time, and its rollouts' generation time and answers."""
        self.round_s = max(self.round_s, seconds)
        self.rates["rollouts"] = generation_s / max(1, answers)

    def observe_evaluation(self, seconds, answers, decodings=None):
        """After a held-out evaluation of `answers` answers; `decodings`: {decoding: (its generation's seconds, its
        answers)}, each decoding's rate then taking its share of the whole evaluation's seconds."""
        self.eval_s = seconds
        self.rates["evaluation"] = seconds / max(1, answers)
        generating = sum(spent for spent, _ in (decodings or {}).values())
        for decoding, (spent, count) in (decodings or {}).items():
            self.rates[decoding] = seconds * spent / generating / max(1, count) if generating > 0 else 0.0

    def seconds(self):
        if self.greedy_answers is not None and {"sampled", "greedy"} <= set(self.rates):
            decoding_s = ((self.answers - self.greedy_answers) * self.rates["sampled"]
                          + self.greedy_answers * self.rates["greedy"])
        else:
            decoding_s = self.answers * self.rates.get("evaluation", self.rates.get("rollouts", 0.0))
        return self.setup_s + self.round_s + self.eval_s + decoding_s
