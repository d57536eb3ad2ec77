"""The free collectives of `acc.utils` (gather, gather_object, broadcast, pad_across_processes, reduce) give
Accelerate's results on this run's processes: acc's version of Accelerate's test_utils/scripts/test_ops.py.

    python -m acc.test_utils.scripts.test_ops                          # one process
    acc launch --backend ddp --nproc 2 -m acc.test_utils.scripts.test_ops

Accelerate's debug-mode checks of mismatched shapes in pad_across_processes, reduce and broadcast
(ACCELERATE_DEBUG_MODE) are not here: acc has no debug mode; what acc checks always is that gather refuses tensors
whose dims other than the first differ across processes, with the shapes named (checked below).
`copy_tensor_to_devices` (multi-GPU and XLA only) is not in acc.
"""

from __future__ import annotations

import torch

from acc.contract.enums import DistributedType
from acc.state import PartialState
from acc.test_utils.testing import assert_exception
from acc.utils.operations import broadcast, gather, gather_object, pad_across_processes, reduce


def create_tensor(state: PartialState) -> torch.Tensor:
    """[1, ..., n] + n * rank on each of n processes: together 1 .. n*n."""
    n = state.num_processes
    return (torch.arange(n) + 1.0 + n * state.process_index).to(state.device)


def test_gather(state: PartialState) -> None:
    gathered = gather(create_tensor(state))
    expected = list(range(1, state.num_processes ** 2 + 1))
    assert gathered.tolist() == expected, f"gather gave {gathered.tolist()}, expected {expected}"


def test_gather_object(state: PartialState) -> None:
    if state.distributed_type == DistributedType.XLA:  # objects are not gathered on XLA
        return
    gathered = gather_object([state.process_index])
    assert gathered == list(range(state.num_processes)), \
        f"gather_object gave {gathered}, expected {list(range(state.num_processes))}"


def test_gather_non_contiguous(state: PartialState) -> None:
    if state.distributed_type == DistributedType.XLA:  # XLA tensors always say they are contiguous
        return
    transposed = torch.arange(12, device=state.device).view(4, 3).t()
    assert not transposed.is_contiguous()
    gathered = gather(transposed)
    expected = torch.cat([transposed.cpu()] * state.num_processes)
    assert torch.equal(gathered.cpu(), expected), f"gather of a transposed tensor gave {gathered}"


def test_broadcast(state: PartialState) -> None:
    result = broadcast(create_tensor(state))
    n = state.num_processes
    assert result.shape == torch.Size([n]), f"broadcast changed the shape to {result.shape}"
    assert result.tolist() == list(range(1, n + 1)), f"broadcast gave {result.tolist()}, not process 0's values"


def test_pad_across_processes(state: PartialState) -> None:
    n = state.num_processes
    size = n + 1 if state.is_main_process else n  # the main process has one element more
    padded = pad_across_processes(torch.arange(size).to(state.device))
    assert padded.shape == torch.Size([n + 1]), f"padded to {padded.shape}, expected {n + 1} elements"
    if not state.is_main_process:
        assert padded.tolist() == list(range(n)) + [0], f"padding gave {padded.tolist()}"


def _check_reduce(state: PartialState, reduction: str, expected: list[float]) -> None:
    if state.num_processes != 2:  # the expected values are those of two processes
        return
    reduced = reduce(create_tensor(state), reduction)
    truth = torch.tensor(expected).to(state.device)
    assert torch.allclose(reduced, truth), f"reduce(..., {reduction!r}) gave {reduced}, expected {truth}"


def test_reduce_sum(state: PartialState) -> None:
    _check_reduce(state, "sum", [4.0, 6.0])


def test_reduce_mean(state: PartialState) -> None:
    _check_reduce(state, "mean", [2.0, 3.0])


def test_reduce_max(state: PartialState) -> None:
    _check_reduce(state, "max", [3.0, 4.0])


def test_op_checker(state: PartialState) -> None:
    """gather of tensors whose second dim differs across processes is an error naming the shapes (acc's check,
    always on; Accelerate checks in its debug mode)."""
    if state.distributed_type in (DistributedType.NO, DistributedType.XLA) or state.num_processes == 1:
        return
    width = 5 + state.process_index
    data = {"tensor": torch.arange(float(width)).reshape(1, width).to(state.device)}
    with assert_exception(ValueError, "across processes"):
        gather(data)


def main() -> None:
    state = PartialState()
    state.print(f"State: {state}")
    for name, check in (("gather", test_gather), ("gather_object", test_gather_object),
                        ("gather non-contiguous", test_gather_non_contiguous), ("broadcast", test_broadcast),
                        ("pad_across_processes", test_pad_across_processes), ("reduce_sum", test_reduce_sum),
                        ("reduce_mean", test_reduce_mean), ("reduce_max", test_reduce_max),
                        ("op_checker", test_op_checker)):
        state.print(f"testing {name}")
        check(state)
    state.wait_for_everyone()
    state.destroy_process_group()


if __name__ == "__main__":
    main()
