"""The training loop of the steps that train one engine on batches of a data set (step 2's reward model, DPO):
epochs of micro-batches, a NaN guard, throughput, the loss line and TensorBoard, evaluations and checkpoints."""
import time

from utils.runtime.dist import all_reduce_mean, assert_finite, print_rank_0, to_device
from utils.runtime.monitor import format_scalars
from utils.runtime.progress import progress


def train_loop(engine, position, args, total_steps, device, *, loss_and_stats, throughput, monitor, checkpointer,
               checkpoint_state, run_eval=None, what="the training loss"):
    """Train `engine` until `total_steps` optimizer steps (or args.num_train_epochs) are done.

    loss_and_stats(batch) -> (loss, {name: detached scalar tensor}): one micro-batch's loss and the figures to
    report beside it. Every args.print_interval optimizer steps (and at the last) the loss and stats, averaged
    over ranks, are printed and written to TensorBoard with the learning rate and throughput; every
    args.eval_interval steps (if the step has that flag) `run_eval(when)` runs; `checkpointer` saves with
    `checkpoint_state` when due. A resumed run (position and engine loaded) goes on from where it stopped.
    """
    eval_interval = getattr(args, "eval_interval", 0)
    step = engine.global_steps
    bar = progress(total=total_steps, initial=step, desc="train", unit="step")
    for epoch in position.epochs(args.num_train_epochs):
        for micro_step, batch in position.batches(epoch):
            if step >= total_steps:  # a run resumed from its last checkpoint has nothing left
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
                bar.set_postfix(loss=f"{scalars['loss']:.4f}", refresh=False)
                print_rank_0(f"epoch {epoch + 1} step {step}/{total_steps}: {format_scalars(**scalars)}")
                monitor.write(step, "train", **scalars, lr=engine.lr_scheduler.get_last_lr()[0],
                              **throughput.report())
            if run_eval is not None and eval_interval and step % eval_interval == 0 and step < total_steps:
                run_eval(f"at step {step}")
            checkpointer.save_if_due(step, total_steps, checkpoint_state)
            if step >= total_steps:
                break
        if step >= total_steps:
            break
    bar.close()
    return step
