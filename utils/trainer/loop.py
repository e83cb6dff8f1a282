"""The training loop of the steps that train one engine on batches of a data set (step 1's causal LM, step 2's
reward model, DPO) and what surrounds it: the data loaders, the position in the data, checkpoints, the monitor
and throughput, evaluations, and the save at the end."""
import time

import torch

from utils.data.data_utils import create_prompt_dataset, data_bound, data_metrics, fit_auto_lengths, make_dataloader
from utils.model.model_utils import check_fits_context, count_parameters, load_tokenizer
from utils.model.card import model_card
from utils.model.save import save_engine_model
from utils.rl.reward_fns import call_reward_fn, load_reward_fn
from utils.runtime.args import column_keys, training_flags
from utils.runtime.dist import all_reduce_mean, assert_finite, print_rank_0, to_device
from utils.runtime.progress import eval_batches, progress
from utils.trainer.best import BestWeights
from utils.trainer.checkpoint import Checkpointer, TrainingPosition, claim_output_dir
from utils.trainer.engine import eager, step_budget, train_engine_from_args, write_metrics
from utils.trainer.monitor import Monitor, Throughput, format_scalars
from utils.trainer.stopping import StopRule, stop_rule_from_args


def step_data(args, phase, inputs, unpaired=False):
    """(tokenizer, train_dataset, eval_dataset) of a step: --max_seq_len checked against the model's context,
    --output_dir claimed for this run (`inputs`: {flag: folder} of the models it reads; the tokenizer and the
    context are --model_name_or_path's), and phase `phase` of --data_split
    tokenized within --max_seq_len (`auto`: a percentile of the sample lengths, measured once the data is built
    unbounded, then built again within it); `unpaired`: as KTO's labelled answers; with --train_every_turn (step
    1), each earlier assistant turn of a conversation a sample too; with --answer_filter_fn,
    only the rows whose chosen answers it gives full marks (judged_rows). The datasets carry their rows read and
    kept (`counts`)."""
    model_path = inputs["--model_name_or_path"]
    check_fits_context(model_path, {"--max_seq_len": args.max_seq_len}, args.trust_remote_code)
    claim_output_dir(args, inputs=inputs)
    tokenizer = load_tokenizer(model_path, args.trust_remote_code)
    judge = answer_judge(args)
    def build(max_seq_len):
        return create_prompt_dataset(args.data_path, args.data_split, args.data_output_path, phase, args.seed,
                                     tokenizer, max_seq_len, unpaired=unpaired, columns=column_keys(args),
                                     judge=judge, every_turn=getattr(args, "train_every_turn", False))

    train_dataset, eval_dataset = build(data_bound(args.max_seq_len))
    fit_auto_lengths(args, args.data_path, tokenizer, train_dataset, eval_dataset, rebuild=build)
    return tokenizer, train_dataset, eval_dataset


def answer_judge(args):
    """--answer_filter_fn's reward function as scores(prompts, answers), each call checked (call_reward_fn);
    None without the flag. A (prompt, answer) is scored once: step_data builds its data twice where a length is
    `auto`, and a user's judge may be slow."""
    spec = getattr(args, "answer_filter_fn", None)
    if not spec:
        return None
    flag = "--answer_filter_fn"
    reward_fn = load_reward_fn(spec, args, flag)
    scored = {}

    def judge(prompts, answers):
        new = list(dict.fromkeys(pair for pair in zip(prompts, answers) if pair not in scored))
        if new:
            scores = call_reward_fn(reward_fn, spec, [prompt for prompt, _ in new], [answer for _, answer in new], flag)
            scored.update(zip(new, scores.tolist()))
        return [scored[pair] for pair in zip(prompts, answers)]
    return judge


def make_loaders(args, train_dataset, eval_dataset, collator):
    """(train_loader, eval_loader): the train split shuffled by --seed, the eval split in order, at the step's
    per-device batch sizes."""
    return (make_dataloader(train_dataset, collator, args.per_device_train_batch_size, True, args.seed),
            make_dataloader(eval_dataset, collator, args.per_device_eval_batch_size, False))


def step_engine(model, ds_config, args, train_loader, eval_loader, world_size, what, rows="samples"):
    """(engine, total_steps): the DeepSpeed engine of `model` with an LR schedule as long as the run's optimizer
    steps, and one line saying what trains (`what`), how, and on how many `rows` (a WARNING line before it when
    the epochs cap --max_steps: step_budget)."""
    budget, warning = step_budget(len(train_loader), args.gradient_accumulation_steps, args.num_train_epochs,
                                  args.max_steps)
    total_steps = budget["total_steps"]
    if warning:
        print_rank_0(warning)
    engine = train_engine_from_args(model, ds_config, args, total_steps)
    print_rank_0(f"{what}: {count_parameters(model) / 1e6:.2f}M parameters, {args.dtype}, ZeRO-{args.zero_stage}, "
                 f"{world_size} process(es); {len(train_loader.dataset)} train / {len(eval_loader.dataset)} eval "
                 f"{rows}; {total_steps} optimizer steps")
    return engine, total_steps


class LoopState:
    """What a step keeps around its loop: where it is in the data (`position`), the `checkpointer` (resumed from
    with --resume: then `resumed` holds the checkpoint's state, else None), the `monitor` (TensorBoard under
    `run_name`, the history in --output_dir), and the `throughput` meter. `flags` are the flags that shape training
    (`step` names the step), recorded with each checkpoint and saved with the model. `stop` is its StopRule
    (utils/trainer/stopping.py: early stopping, the time budget); `best`, with --load_best_model_at_end, the
    weights of the evaluation it found best (else None). `counts` are what save_run
    adds to metrics.json: the rows each split read and kept (data_metrics), the rows an evaluation scores, and the
    step budget (step_budget)."""

    def __init__(self, args, engine, train_loader, world_size, *, step, run_name):
        self.flags = training_flags(args, step=step)
        self.counts = run_counts(args, train_loader, world_size)
        self.position = TrainingPosition(train_loader)
        self.best = BestWeights(engine) if getattr(args, "load_best_model_at_end", False) else None
        self.checkpointer = Checkpointer(args.output_dir, args.save_steps, args.save_total_limit, {"model": engine},
                                         self.position, flags=self.flags, tensors={"best": self.best})
        shape = {"metrics": {"*": (None, 0.0)}, "stop": StopRule.STATE_SHAPE,
                 **({"best": BestWeights.STATE_SHAPE} if self.best is not None else {})}
        self.resumed = self.checkpointer.resume(shape) if args.resume else None
        if self.best is not None and self.resumed:
            self.best.load_state_dict(self.resumed["best"])
        self.monitor = Monitor(args, run_name, args.output_dir, resumed=self.resumed is not None)
        self.stop = stop_rule_from_args(args, engine.device, state=(self.resumed or {}).get("stop"))
        self.throughput = Throughput(engine.module.config, world_size, args.gradient_checkpointing, args.lora_dim)

    def train(self, engine, args, total_steps, device, *, evaluate, loss_and_stats, what="the training loss",
              eval_each_epoch=False):
        """The step's training between its evaluations; its metrics. `evaluate()` ({name: float}, run eager under
        --compile, printed and written to TensorBoard) runs before training (`<name>_before`; a resumed run keeps
        its checkpoint's), every --eval_interval steps (the stop rule sees it) and after training (`<name>_after`);
        with `eval_each_epoch` and no --eval_interval, after each epoch instead. `loss_and_stats` and `what` are
        train_loop's."""
        def run_eval(when):
            with eager():
                scores = evaluate()
            print_rank_0(f"eval {when}: {format_scalars(**scores)}")
            self.monitor.write(engine.global_steps, "eval", **scores)
            return scores

        def after(when):
            metrics.update({f"{name}_after": value for name, value in run_eval(when).items()})

        metrics = (self.resumed["metrics"] if self.resumed else
                   {f"{name}_before": value for name, value in run_eval("before training").items()})
        each_epoch = eval_each_epoch and not args.eval_interval
        step = train_loop(engine, self, args, total_steps, device, loss_and_stats=loss_and_stats,
                          checkpoint_state={"metrics": metrics}, run_eval=run_eval, what=what,
                          epoch_end=(lambda epoch: after(f"after epoch {epoch + 1}/{args.num_train_epochs}"))
                          if each_epoch else None)
        if each_epoch:
            return metrics
        scores = run_eval("after training")
        if self.best is not None:
            scores = self.load_best(step, scores)
        metrics.update({f"{name}_after": value for name, value in scores.items()})
        return metrics

    def load_best(self, step, scores):
        """With --load_best_model_at_end, after training (`scores`: the evaluation of the weights it ended with, at
        `step`): the weights of the best evaluation put back where an earlier one was better; the scores of the
        weights to be saved. metrics.json says which were ("saved_best")."""
        stop, best = self.stop, self.best
        saved_step, saved = step, scores  # the weights as they are, unless an earlier evaluation was better
        if not stop.observe(step, scores) and best.step not in (None, step):
            best.restore()
            print_rank_0(f"--load_best_model_at_end: the model of step {best.step} is saved (eval {stop.metric} "
                         f"{best.score:.4f}, against {scores[stop.metric]:.4f} at step {step})")
            saved_step, saved = best.step, best.scores
        self.counts["saved_best"] = {"step": saved_step, "last_step": step, "metric": stop.metric,
                                     "value": saved.get(stop.metric)}
        return saved


def evaluate_mean(engine, eval_loader, device, eval_iters, loss_and_stats, rows):
    """The loss and stats of `loss_and_stats(batch)` averaged over the eval split (or its first `eval_iters`
    batches; 0: all), each batch weighing as its `rows(batch)` (pairs, answers), over all ranks; in eval mode under
    no_grad, `engine` back in train mode after. {name: float}."""
    engine.eval()
    sums, count = {}, torch.zeros((), device=device)
    with torch.no_grad():
        for batch in eval_batches(eval_loader, eval_iters):
            batch = to_device(batch, device)
            loss, stats = loss_and_stats(batch)
            weight = rows(batch)
            for name, value in {"loss": loss, **stats}.items():
                sums[name] = sums.get(name, 0.0) + value.float() * weight
            count += weight
    names = sorted(sums)
    totals = torch.stack([sums[name] for name in names] + [count])
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals)
    engine.train()
    return {name: (totals[i] / totals[-1].clamp(min=1)).item() for i, name in enumerate(names)}


def run_counts(args, train_loader, world_size):
    """What a step's metrics.json says of its data and length: the rows each split read and kept (the counts the
    train dataset carries; none for a dataset made otherwise), "eval_rows_scored" (the eval rows an evaluation
    scores: all, or the first --eval_iters batches' worth), and step_budget's counts."""
    counts = data_metrics(getattr(train_loader.dataset, "counts", None))
    if "eval_rows_kept" in counts:
        eval_iters = getattr(args, "eval_iters", 0)
        scored = eval_iters * args.per_device_eval_batch_size * world_size if eval_iters else counts["eval_rows_kept"]
        counts["eval_rows_scored"] = min(scored, counts["eval_rows_kept"])
    budget, _ = step_budget(len(train_loader), args.gradient_accumulation_steps, args.num_train_epochs,
                            args.max_steps)
    return {**counts, **budget}


def train_loop(engine, state, args, total_steps, device, *, loss_and_stats, checkpoint_state, run_eval=None,
               what="the training loss", epoch_end=None):
    """Train `engine` until `total_steps` optimizer steps (or args.num_train_epochs) are done, from and with what
    `state` (a LoopState) keeps: the position in the data, the throughput meter, the monitor, the checkpointer and
    the stop rule.

    loss_and_stats(batch) -> (loss, {name: detached scalar tensor}): one micro-batch's loss and the figures to
    report beside it. Every args.print_interval optimizer steps (and at the last) the loss and stats, averaged
    over ranks, are printed and written to TensorBoard with the learning rate and throughput; every
    args.eval_interval steps (if the step has that flag) `run_eval(when)` runs and `stop` (a StopRule) sees its
    scores; training ends early where `stop` says so (a checkpoint then, with --save_steps); `checkpointer` saves
    with `checkpoint_state` (and the rule's state) when due; after each epoch (the last one too, however short) `epoch_end(epoch)` runs. A
    resumed run (position and engine loaded) goes on from where it stopped, its progress bar too.
    """
    position, throughput, monitor, checkpointer, stop = (state.position, state.throughput, state.monitor,
                                                         state.checkpointer, state.stop)
    eval_interval = getattr(args, "eval_interval", 0)
    step = engine.global_steps
    bar = progress(total=total_steps, initial=step, desc="train", unit="step")
    for epoch in position.epochs(args.num_train_epochs):
        for micro_step, batch in position.batches(epoch):
            if step >= total_steps or stop.stopped:  # a run resumed from its last checkpoint has nothing left
                break
            batch = to_device(batch, device)
            step_start = time.perf_counter()
            loss, stats = loss_and_stats(batch)
            assert_finite(loss, what)
            engine.backward(loss)
            engine.step()
            throughput.add_batch(time.perf_counter() - step_start, batch)
            if (micro_step + 1) % args.gradient_accumulation_steps != 0:
                continue
            step = engine.global_steps
            bar.update(1)
            if step % args.print_interval == 0 or step == total_steps:
                scalars = {name: all_reduce_mean(value.detach().float()).item()
                           for name, value in {"loss": loss, **stats}.items()}
                lr = engine.lr_scheduler.get_last_lr()[0]
                bar.set_postfix(loss=f"{scalars['loss']:.4f}", refresh=False)
                print_rank_0(f"epoch {epoch + 1} step {step}/{total_steps}: {format_scalars(**scalars, lr=lr)}")
                monitor.write(step, "train", **scalars, lr=lr, **throughput.report())
            if run_eval is not None and eval_interval and step % eval_interval == 0 and step < total_steps:
                scores = run_eval(f"at step {step}")
                if stop.observe(step, scores) and state.best is not None:
                    state.best.keep(step, scores[stop.metric], scores)
            reason = stop.reason(step, total_steps)
            best = {"best": state.best.state_dict()} if state.best is not None else {}
            checkpointer.save_if_due(step, step if reason else total_steps,
                                     {**checkpoint_state, "stop": stop.state_dict(), **best})
            if step >= total_steps or reason:
                break
        if epoch_end is not None:
            epoch_end(epoch)
        if step >= total_steps or stop.stopped:
            break
    bar.close()
    return step


def save_run(engine, tokenizer, args, metrics, state, start_time):
    """The end of a step: the run's totals and counts (LoopState.counts) added to `metrics`, the monitor closed,
    the model saved as a Hugging Face folder in --output_dir with its training flags and model card, metrics.json
    beside it, and then the run's history."""
    metrics.update(state.counts, **state.stop.metrics(), optimizer_steps=engine.global_steps,
                   parameters=count_parameters(engine.module), wall_time_s=time.time() - start_time)
    state.monitor.close()
    save_engine_model(engine, tokenizer, args.output_dir, settings=state.flags, card=model_card(state.flags, metrics))
    write_metrics(args.output_dir, metrics)
    state.monitor.publish()
    scalars = {name: value for name, value in metrics.items() if not isinstance(value, dict)}
    print_rank_0(f"saved {args.output_dir}; {format_scalars(**scalars)}")
