"""DDP communication hooks chosen with `DistributedDataParallelKwargs(comm_hook=..., comm_wrapper=...,
comm_state_option=...)`: acc's version of Accelerate's test_utils/scripts/test_ddp_comm_hook.py.

    acc launch --backend ddp --nproc 2 PATH/test_ddp_comm_hook.py     # two processes (gloo on the CPU)
    python PATH/test_ddp_comm_hook.py                                 # one process: no DDP, no hook

For each hook (fp16 and bf16 compression, PowerSGD and batched PowerSGD, with an fp16 or bf16 wrapper, with a
PowerSGD state option) the prepared model's gradients equal (to 1e-2) those of a plain torch DDP model without a
hook, and the hook is registered on the prepared model (torch's bf16 hook and wrapper, which need NCCL or XCCL, are skipped on gloo). On one process there is nothing to communicate: the
prepared model's gradients equal the unwrapped model's exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from acc.accelerator import Accelerator
from acc.contract.enums import DDPCommunicationHookType
from acc.contract.kwargs import DistributedDataParallelKwargs
from acc.state import PartialState
from acc.utils.imports import is_hpu_available

H = DDPCommunicationHookType
CASES = [
    (H.NO, H.NO, {}), (H.FP16, H.NO, {}), (H.BF16, H.NO, {}), (H.POWER_SGD, H.NO, {}), (H.POWER_SGD, H.FP16, {}),
    (H.POWER_SGD, H.BF16, {}), (H.POWER_SGD, H.NO, {"matrix_approximation_rank": 2}), (H.BATCHED_POWER_SGD, H.NO, {}),
    (H.BATCHED_POWER_SGD, H.FP16, {}), (H.BATCHED_POWER_SGD, H.BF16, {}),
]


class MockModel(torch.nn.Module):
    """One 40x20 parameter; the output depends on the rank, so each process's gradient differs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.p = torch.nn.Parameter(torch.randn(40, 20))

    def forward(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        return self.p * (x ** (1 + rank))


def _run_and_get_grads(model: torch.nn.Module, rank: int) -> torch.Tensor:
    torch.manual_seed(2024)
    model(torch.randn(40, 20), rank).mean().backward()
    return next(model.parameters()).grad


def _reference(accelerator: Accelerator) -> torch.nn.Module:
    model = MockModel().to(accelerator.device)
    if accelerator.num_processes == 1:
        return model
    on_device = accelerator.device.type != "cpu"
    index = accelerator.local_process_index
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=[index] if on_device else None,
                                                     output_device=index if on_device else None)


def test_ddp_comm_hook(comm_hook: Any, comm_wrapper: Any, comm_state_option: dict) -> None:
    kwargs = DistributedDataParallelKwargs(comm_hook=comm_hook, comm_wrapper=comm_wrapper,
                                           comm_state_option=comm_state_option)
    accelerator = Accelerator(kwargs_handlers=[kwargs])
    model = accelerator.prepare(MockModel())
    if accelerator.num_processes > 1 and comm_hook != H.NO and hasattr(model, "_comm_hooks"):
        assert model._comm_hooks, f"no communication hook registered on the prepared model for {comm_hook}"
    hook_grads = _run_and_get_grads(model, accelerator.local_process_index)
    reference_grads = _run_and_get_grads(_reference(accelerator), accelerator.local_process_index)
    if accelerator.num_processes == 1:
        torch.testing.assert_close(hook_grads, reference_grads, rtol=0, atol=0)
    else:
        torch.testing.assert_close(hook_grads, reference_grads, rtol=1e-2, atol=1e-2)


def main() -> None:
    state = PartialState()
    for comm_hook, comm_wrapper, comm_state_option in CASES:
        if is_hpu_available() and {comm_hook, comm_wrapper} & {H.FP16, H.BF16}:
            print(f"Skipping test DDP comm hook: {comm_hook}, comm wrapper: {comm_wrapper} on HPU")
            continue
        if H.BF16 in (comm_hook, comm_wrapper) and state.num_processes > 1 and state.backend not in ("nccl", "xccl"):
            # torch's bf16 hook and wrapper refuse other process-group backends (gloo) when they are registered
            print(f"Skipping test DDP comm hook: {comm_hook}, comm wrapper: {comm_wrapper} on the {state.backend} "
                  "process group (torch's bf16 compression needs NCCL or XCCL)")
            continue
        print(f"Test DDP comm hook: {comm_hook}, comm wrapper: {comm_wrapper}")
        test_ddp_comm_hook(comm_hook, comm_wrapper, comm_state_option)
    state.destroy_process_group()


if __name__ == "__main__":
    main()
