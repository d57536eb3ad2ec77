"""Gradient synchronisation: acc's version of Accelerate's test_utils/scripts/test_sync.py.

    python PATH/test_sync.py                                          # one process
    acc launch --backend ddp --nproc 2 PATH/test_sync.py              # two (gloo on the CPU)
    debug_launcher(test_sync.main)

A model trained by hand on the gathered batch is the reference; the prepared copy, fed this process's part, must
have the reference's gradients exactly where the gradients are synchronised and different ones where they stay
local: `no_sync` (a no-op on one process), `trigger_sync_in_backward` after several forwards, and `accumulate`
with a GradientAccumulationPlugin (split or dispatched batches, `sync_each_batch`), also with an optimizer and an
LR scheduler (same learning rate as the reference at every step). The data loaders tell `gradient_state` which
of them is active and when it ends, also when one loop breaks into another.

The `accumulate` variants run where Accelerate runs them (multi-GPU and the like) and also on several CPU
processes, where acc synchronises the same way.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import torch
import torch.nn.functional as F
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader

from acc.accelerator import Accelerator
from acc.contract.enums import DistributedType
from acc.contract.kwargs import DataLoaderConfiguration, GradientAccumulationPlugin
from acc.test_utils.training import RegressionDataset, RegressionModel
from acc.utils import set_seed

# the data-parallel run types (those of them acc's DistributedType names)
DATA_PARALLEL = {getattr(DistributedType, name) for name in ("MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
                                                              "MULTI_MUSA", "MULTI_HPU", "MULTI_NEURON", "MULTI_CPU")
                 if hasattr(DistributedType, name)}


def _grads_equal(a: torch.nn.Module, b: torch.nn.Module, **tolerance: Any) -> list[bool]:
    return [bool(torch.allclose(p.grad, q.grad, **tolerance))
            for p, q in zip(a.parameters(), b.parameters()) if p.requires_grad]


def check_model_parameters(model_a: torch.nn.Module, model_b: torch.nn.Module, did_step: bool, iteration: int,
                           **tolerance: Any) -> None:
    """Gradients agree (within `tolerance`) when `did_step`, and differ (exactly compared) otherwise."""
    if did_step:
        assert all(_grads_equal(model_a, model_b, **tolerance)), \
            f"Gradients not in sync when they should be at iteration {iteration}"
    else:
        assert not any(_grads_equal(model_a, model_b)), \
            f"Gradients in sync when they should not be at iteration {iteration}"


def step_model(model: torch.nn.Module, input: torch.Tensor, target: torch.Tensor, accelerator: Accelerator,
               do_backward: bool = True) -> None:
    """One forward and backward; with `do_backward=False` a plain backward of the loss divided by the
    accumulation steps (the reference's accumulation)."""
    model.train()
    output = model(input)
    loss = F.mse_loss(output, target.to(output.device))
    if do_backward:
        accelerator.backward(loss)
    else:
        (loss / accelerator.gradient_accumulation_steps).backward()


def get_training_setup(accelerator: Accelerator, sched: bool = False) -> tuple:
    """A reference model on the device and its prepared copy with a loader of 80 samples in batches of 16; with
    `sched`, an AdamW and a LambdaLR for each (the prepared ones prepared)."""
    set_seed(42)
    model = RegressionModel()
    ddp_model = deepcopy(model)
    dataloader = DataLoader(RegressionDataset(length=80), batch_size=16)
    model.to(accelerator.device)
    if not sched:
        ddp_model, dataloader = accelerator.prepare(ddp_model, dataloader)
        return model, ddp_model, dataloader
    opt = AdamW(params=model.parameters(), lr=1e-3)
    ddp_opt = AdamW(params=ddp_model.parameters(), lr=1e-3)
    scheduler = LambdaLR(opt, lr_lambda=lambda epoch: epoch ** 0.65)
    ddp_sched = LambdaLR(ddp_opt, lr_lambda=lambda epoch: epoch ** 0.65)
    ddp_model, ddp_opt, ddp_sched, dataloader = accelerator.prepare(ddp_model, ddp_opt, ddp_sched, dataloader)
    return model, opt, scheduler, dataloader, ddp_model, ddp_opt, ddp_sched


def _gathered(accelerator: Accelerator, ddp_input: torch.Tensor, ddp_target: torch.Tensor) -> tuple:
    full_input, full_target = accelerator.gather((ddp_input, ddp_target))
    return full_input.to(accelerator.device), full_target.to(accelerator.device)


def _no_sync_steps(accelerator: Accelerator, expect_sync_inside: bool) -> None:
    model, ddp_model, dataloader = get_training_setup(accelerator)
    ddp_input, ddp_target = next(iter(dataloader)).values()
    for iteration in range(3):
        step_model(model, *_gathered(accelerator, ddp_input, ddp_target), accelerator)
        if iteration % 2 == 0:
            with accelerator.no_sync(ddp_model):  # local gradients only
                step_model(ddp_model, ddp_input, ddp_target, accelerator)
        else:
            step_model(ddp_model, ddp_input, ddp_target, accelerator)
        check_model_parameters(model, ddp_model, expect_sync_inside or iteration % 2 == 1, iteration)
        torch.manual_seed(1337 + iteration)
        ddp_input = ddp_input[torch.randperm(len(ddp_input))]


def test_noop_sync(accelerator: Accelerator) -> None:
    """On one process `no_sync` changes nothing: the gradients always equal the reference's."""
    _no_sync_steps(accelerator, expect_sync_inside=True)


def test_distributed_sync(accelerator: Accelerator) -> None:
    """On several processes the gradients equal the reference's only outside `no_sync`."""
    _no_sync_steps(accelerator, expect_sync_inside=False)


def test_distributed_sync_multiple_fwd(accelerator: Accelerator) -> None:
    """Forwards under `no_sync`, then backwards: local until the last, which `trigger_sync_in_backward` syncs."""
    model, ddp_model, dataloader = get_training_setup(accelerator)
    losses = []
    num_iterations = 3
    for _ in range(num_iterations):
        ddp_input, ddp_target = next(iter(dataloader)).values()
        step_model(model, *_gathered(accelerator, ddp_input, ddp_target), accelerator)
        with accelerator.no_sync(ddp_model):
            ddp_output = ddp_model(ddp_input)
            losses.append(F.mse_loss(ddp_output, ddp_target.to(ddp_output.device)))
    for iteration, loss in enumerate(losses):
        if iteration < num_iterations - 1:
            accelerator.backward(loss)
            check_model_parameters(model, ddp_model, False, iteration)
        else:
            with accelerator.trigger_sync_in_backward(ddp_model):
                accelerator.backward(loss)
            check_model_parameters(model, ddp_model, True, iteration)


def _accumulating_accelerator(split_batches: bool, dispatch_batches: bool, sync_each_batch: bool) -> Accelerator:
    return Accelerator(
        dataloader_config=DataLoaderConfiguration(split_batches=split_batches, dispatch_batches=dispatch_batches),
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2, sync_each_batch=sync_each_batch))


def test_gradient_accumulation(split_batches: bool = False, dispatch_batches: bool = False,
                               sync_each_batch: bool = False) -> None:
    """Under `accumulate` (2 steps) the gradients are synchronised every second batch, at the last batch, or on
    every batch with `sync_each_batch`."""
    accelerator = _accumulating_accelerator(split_batches, dispatch_batches, sync_each_batch)
    model, ddp_model, dataloader = get_training_setup(accelerator)
    for iteration, batch in enumerate(dataloader):
        ddp_input, ddp_target = batch.values()
        step_model(model, *_gathered(accelerator, ddp_input, ddp_target), accelerator, False)
        with accelerator.accumulate(ddp_model):
            step_model(ddp_model, ddp_input, ddp_target, accelerator)
        synced = (iteration + 1) % 2 == 0 or iteration == len(dataloader) - 1 or sync_each_batch
        check_model_parameters(model, ddp_model, synced, iteration)


def test_gradient_accumulation_with_opt_and_scheduler(split_batches: bool = False, dispatch_batches: bool = False,
                                                      sync_each_batch: bool = False) -> None:
    """`accumulate` with an optimizer and a scheduler: the prepared scheduler steps as the reference does
    (num_processes times per optimizer step, once with split batches), so the learning rates agree at every
    batch; on several processes the gradients agree (rtol 1e-2) where they are synchronised."""
    accelerator = _accumulating_accelerator(split_batches, dispatch_batches, sync_each_batch)
    model, opt, scheduler, dataloader, ddp_model, ddp_opt, ddp_sched = get_training_setup(accelerator, True)
    for iteration, batch in enumerate(dataloader):
        ddp_input, ddp_target = batch.values()
        model.train()
        ddp_model.train()
        step_model(model, *_gathered(accelerator, ddp_input, ddp_target), accelerator, False)
        opt.step()
        did_step = (iteration + 1) % 2 == 0 or iteration + 1 == len(dataloader)
        if did_step:
            for _ in range(1 if split_batches else accelerator.num_processes):
                scheduler.step()
        with accelerator.accumulate(ddp_model):
            step_model(ddp_model, ddp_input, ddp_target, accelerator)
            ddp_opt.step()
            ddp_sched.step()
        lr, ddp_lr = opt.param_groups[0]["lr"], ddp_opt.param_groups[0]["lr"]
        assert lr == ddp_lr, f"Learning rates found in each optimizer did not align\nopt: {lr}\nDDP opt: {ddp_lr}\n"
        if accelerator.num_processes > 1:
            check_model_parameters(model, ddp_model, did_step or sync_each_batch, iteration, rtol=1e-2)
        if did_step:
            opt.zero_grad()
        ddp_opt.zero_grad()
        torch.manual_seed(1337 + iteration)


def test_dataloader_break() -> None:
    """`gradient_state` follows the loader being iterated, also a second one started inside the first."""
    accelerator = Accelerator()
    first, second = accelerator.prepare(DataLoader(RegressionDataset(length=80), batch_size=16),
                                        DataLoader(RegressionDataset(length=96), batch_size=16))
    state = accelerator.gradient_state
    assert state.active_dataloader is None, "a loader is active before any is iterated"
    for iteration, _ in enumerate(first):
        assert id(state.active_dataloader) == id(first), "the first loader is not the active one"
        if iteration < len(first) - 1:
            assert not state.end_of_dataloader, f"end_of_dataloader at batch {iteration} of {len(first)}"
            if iteration == 1:
                for batch_num, _ in enumerate(second):
                    assert id(state.active_dataloader) == id(second), "the inner loader is not the active one"
                    ended = batch_num == len(second) - 1
                    assert state.end_of_dataloader == ended, \
                        f"end_of_dataloader is {state.end_of_dataloader} at inner batch {batch_num}"
        else:
            assert state.end_of_dataloader, "end_of_dataloader not set at the last batch"
    assert state.active_dataloader is None, "a loader is still active after the loops"


def _variants(skip_default: bool = False) -> list[tuple[bool, bool, bool]]:
    return [(split, dispatch, each) for split in (True, False) for dispatch in (True, False) for each in (True, False)
            if not (skip_default and not (split or dispatch or each))]


def main() -> None:
    accelerator = Accelerator()
    state = accelerator.state
    say = accelerator.print
    if state.distributed_type != DistributedType.XLA:
        say("**Test `accumulate` gradient accumulation with dataloader break**")
        test_dataloader_break()
    # one process (also a data-parallel backend on one process, e.g. debug_launcher(main, num_processes=1)): no_sync
    # has nothing to hold back; the checks of local gradients need two processes or more
    distributed = state.distributed_type in DATA_PARALLEL and state.num_processes > 1
    if not distributed:
        say("**Test NOOP `no_sync` context manager**")
        test_noop_sync(accelerator)
    if distributed:
        say("**Test Distributed `no_sync` context manager**")
        test_distributed_sync(accelerator)
        say("**Test Distributed `no_sync` context manager with multiple forwards**")
        test_distributed_sync_multiple_fwd(accelerator)
        for split, dispatch, each in _variants():
            say(f"**Test `accumulate` gradient accumulation, `split_batches={split}` and "
                f"`dispatch_batches={dispatch}` and `sync_each_batch={each}`**")
            test_gradient_accumulation(split, dispatch, each)
    say("**Test `accumulate` gradient accumulation with optimizer and scheduler, `split_batches=False`, "
        "`dispatch_batches=False`, `sync_each_batch=False`**")
    test_gradient_accumulation_with_opt_and_scheduler()
    if distributed:
        for split, dispatch, each in _variants(skip_default=True):
            say(f"**Test `accumulate` gradient accumulation with optimizer and scheduler, `split_batches={split}` "
                f"and `dispatch_batches={dispatch}` and `sync_each_batch={each}`**")
            test_gradient_accumulation_with_opt_and_scheduler(split, dispatch, each)
    state.destroy_process_group()


if __name__ == "__main__":
    main()
