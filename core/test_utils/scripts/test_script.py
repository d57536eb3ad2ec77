"""acc's end-to-end check of a run: acc's version of Accelerate's test_utils/scripts/test_script.py.

    python PATH/test_script.py                                        # one process
    acc launch --backend ddp --nproc 2 PATH/test_script.py            # two (gloo on the CPU)
    debug_launcher(test_script.main)                                  # two CPU processes, from Python

It checks the process views (main_process_first, the on_*_process decorators), split_between_processes on lists,
dicts, tensors and `datasets.Dataset`, RNG synchronisation, prepared data loaders (sharded and dispatched, split or
not, shuffled or not, a custom batch sampler kept, the seedable sampler), that training on N processes gives the
weights of one process with N times the batch (also with split batches, bf16 and fp16), the breakpoint trigger,
and that an Accelerator used after `AcceleratorState._reset_state()` fails with an error saying so.

The loader checks call `acc.data_loader.prepare_data_loader` and `Accelerator.prepare` where Accelerate's call
them.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from copy import deepcopy
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from acc.accelerator import Accelerator
from acc.contract.enums import DistributedType
from acc.contract.kwargs import DataLoaderConfiguration
from acc.data_loader import SeedableRandomSampler, prepare_data_loader
from acc.state import AcceleratorState
from acc.test_utils.testing import are_the_same_tensors
from acc.test_utils.training import RegressionDataset, RegressionModel
from acc.utils import set_seed
from acc.utils.imports import (
    is_bf16_available,
    is_cuda_available,
    is_datasets_available,
    is_fp16_available,
    is_hpu_available,
    is_mps_available,
)
from acc.utils.operations import gather, gather_object, synchronize_rng_states

ATOL = RTOL = 1e-3 if is_hpu_available() else 1e-6


def _say(state: Any, text: str) -> None:
    if state.process_index == 0:
        print(text)


# ---------------------------------------------------------------------------------------------- processes


def print_main(state: Any) -> None:
    print(f"Printing from the main process {state.process_index}")


def print_local_main(state: Any) -> None:
    print(f"Printing from the local main process {state.local_process_index}")


def print_last(state: Any) -> None:
    print(f"Printing from the last process {state.process_index}")


def print_on(state: Any, process_idx: int) -> None:
    print(f"Printing from process {process_idx}: {state.process_index}")


def _printed(call: Any, *args: Any) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        call(*args)
    return out.getvalue().rstrip()


def process_execution_check() -> None:
    """The main process runs the main_process_first block before the others; the decorators run where they say."""
    accelerator = Accelerator()
    n = accelerator.num_processes
    path = Path("check_main_process_first.txt")
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            time.sleep(0.1)  # the main process is the slowest: the others must still wait for it
            line = "Currently in the main process\n"
        else:
            line = "Now on another process\n"
        with open(path, "a+") as handle:
            handle.write(line)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        text = path.read_text()
        path.unlink()
        assert text.startswith("Currently in the main process\n"), f"Main process was not first: {text!r}"
        assert text.count("Now on another process\n") == n - 1, f"{n} processes wrote {text!r}"
        if n > 1:
            assert text.endswith("Now on another process\n"), f"Main process was not first: {text!r}"
    accelerator.wait_for_everyone()

    state = accelerator.state
    expected = {
        "on_main_process": (accelerator.is_main_process, "Printing from the main process 0"),
        "on_local_main_process": (accelerator.is_local_main_process, "Printing from the local main process 0"),
        "on_last_process": (accelerator.is_last_process, f"Printing from the last process {n - 1}"),
    }
    functions = {"on_main_process": print_main, "on_local_main_process": print_local_main,
                 "on_last_process": print_last}
    for name, (runs_here, text) in expected.items():
        result = _printed(getattr(accelerator, name)(functions[name]), state)
        want = text if runs_here else ""
        assert result == want, f"{name}: printed {result!r}, expected {want!r}"
    for index in range(n):
        result = _printed(accelerator.on_process(print_on, process_index=index), state, index)
        want = f"Printing from process {index}: {accelerator.process_index}" if accelerator.process_index == index \
            else ""
        assert result == want, f"on_process({index}): printed {result!r}, expected {want!r}"


def init_state_check() -> None:
    """AcceleratorState can be made again, and prints."""
    state = AcceleratorState()
    if state.local_process_index == 0:
        print("Testing, testing. 1, 2, 3.")
    print(state)


# ---------------------------------------------------------------------------------------------- splitting


def _gathered_in_order(state: Any, results: Any, length: int, as_cpu: bool = False) -> list:
    mine = [r.to("cpu") if as_cpu else r for r in results]
    state.wait_for_everyone()
    return gather_object(mine)[:length]


def test_split_between_processes_list() -> None:
    state = AcceleratorState()
    n = state.num_processes
    with state.split_between_processes(list(range(2 * n))) as results:
        assert len(results) == 2, f"process {state.process_index} got {len(results)} items, not 2"
    state.wait_for_everyone()
    for data in (list(range(2 * n - 1)), list(range(2 * n))):
        with state.split_between_processes(data, apply_padding=True) as results:
            share = math.ceil(len(data) / n)
            assert len(results) == share, f"process {state.process_index} got {len(results)} items, not {share}"
            output = _gathered_in_order(state, results, len(data))
        assert output == data, f"Gathered results is incorrect. Expected: {data}; Got: {output}"


def test_split_between_processes_nested_dict() -> None:
    state = AcceleratorState()
    n, index = state.num_processes, state.process_index
    if n not in (1, 2, 4):
        state.wait_for_everyone()
        return
    data = {"a": [1, 2, 3, 4, 5, 6, 7, 8], "b": list("abcdefgh"), "c": torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])}
    original = deepcopy(data)
    share = 8 // n
    with state.split_between_processes(data) as results:
        if index == 0 or n == 2 or index == 3:
            part = slice(index * share, (index + 1) * share)
            assert results["a"] == original["a"][part], f"process {index}: a = {results['a']}"
            assert results["b"] == original["b"][part], f"process {index}: b = {results['b']}"
            assert torch.allclose(results["c"], original["c"][part]), f"process {index}: c = {results['c']}"
    state.wait_for_everyone()


def test_split_between_processes_tensor() -> None:
    state = AcceleratorState()
    n, device = state.num_processes, state.device
    if n > 1:
        data = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]]).to(device)
        with state.split_between_processes(data) as results:
            expected = data[:1] if state.process_index == 0 else data[1:2]
            torch.testing.assert_close(results, expected)
        state.wait_for_everyone()
    for data in (torch.tensor([[i] for i in range(2 * n)]).to(device),
                 torch.tensor([[i] for i in range(2 * n - 1)]).to(device)):
        expected = [torch.tensor(row) for row in data.tolist()]
        with state.split_between_processes(data, apply_padding=True) as results:
            share = math.ceil(len(data) / n)
            assert len(results) == share, f"process {state.process_index} got {len(results)} rows, not {share}"
            output = _gathered_in_order(state, results, len(data), as_cpu=True)
        assert all(torch.equal(a, b) for a, b in zip(expected, output)) and len(output) == len(expected), \
            f"Gathered results is incorrect. Expected: {expected}; Got: {output}"


def test_split_between_processes_evenly() -> None:
    state = AcceleratorState()
    n = state.num_processes
    if n in (1, 2, 4, 8):
        data = list(range(17))
        base, extra = divmod(len(data), n)
        with state.split_between_processes(data) as results:
            want = base + 1 if state.process_index < extra else base
            assert len(results) == want, f"process {state.process_index} got {len(results)} items, not {want}"
    state.wait_for_everyone()


def test_split_between_processes_dataset(datasets_Dataset: Any) -> None:
    state = AcceleratorState()
    n = state.num_processes
    rows = datasets_Dataset.from_list
    with state.split_between_processes(rows([{"k": v} for v in range(2 * n)]), apply_padding=False) as results:
        assert len(results) == 2, f"process {state.process_index} got {len(results)} rows, not 2"
    with state.split_between_processes(rows([{"k": v} for v in range(2 * n - 1)]), apply_padding=False) as results:
        want = 1 if state.is_last_process else 2
        assert len(results) == want, f"process {state.process_index} got {len(results)} rows, not {want}"
    state.wait_for_everyone()
    for data in (rows([{"k": v} for v in range(2 * n - 1)]), rows([{"k": v} for v in range(2 * n)])):
        with state.split_between_processes(data, apply_padding=True) as results:
            want = len(data) if n == 1 else 2
            assert len(results) == want, f"process {state.process_index} got {len(results)} rows, not {want}"
            mine = list(results)
        state.wait_for_everyone()
        output = [r["k"] for r in gather_object(mine)[: len(data)]]
        assert output == data["k"], f"Gathered results is incorrect. Expected: {data['k']}; Got: {output}"


# ---------------------------------------------------------------------------------------------- RNG and data


def rng_sync_check() -> None:
    state = AcceleratorState()
    synchronize_rng_states(["torch"])
    assert are_the_same_tensors(torch.get_rng_state()), "RNG states improperly synchronized on CPU."
    if state.distributed_type == DistributedType.MULTI_GPU:
        synchronize_rng_states(["cuda"])
        assert are_the_same_tensors(torch.cuda.get_rng_state()), "RNG states improperly synchronized on GPU."
    elif state.distributed_type == DistributedType.MULTI_XPU:
        synchronize_rng_states(["xpu"])
        assert are_the_same_tensors(torch.xpu.get_rng_state()), "RNG states improperly synchronized on XPU."
    generator = torch.Generator()
    synchronize_rng_states(["generator"], generator=generator)
    assert are_the_same_tensors(generator.get_state()), "RNG states improperly synchronized in generator."
    _say(state, "All rng are properly synched.")


def prepare_loader(loader: DataLoader, **settings: Any) -> Any:
    """`loader` prepared for this process with `prepare_data_loader(..., put_on_device=True, **settings)`."""
    state = AcceleratorState()
    return prepare_data_loader(loader, state.device, state.num_processes, state.process_index, put_on_device=True,
                               **settings)


def _all_batches(loader: Any) -> torch.Tensor:
    return torch.cat([gather(batch) for batch in loader]).cpu()


def _check_loaders(state: Any, dispatch: bool) -> None:
    length = 32 * state.num_processes
    kind = "central " if dispatch else ""
    config = {"dispatch_batches": True} if dispatch else {}
    for split in (False, True):
        result = _all_batches(prepare_loader(DataLoader(range(length), batch_size=8), split_batches=split, **config))
        assert torch.equal(result, torch.arange(length).long()), \
            f"Wrong non-shuffled {kind}dataloader result (split_batches={split}): {result.tolist()}"
    _say(state, f"Non-shuffled {kind}dataloader passing.")
    for split in (False, True):
        loader = DataLoader(range(length), batch_size=8, shuffle=True)
        result = sorted(_all_batches(prepare_loader(loader, split_batches=split, **config)).tolist())
        assert result == list(range(length)), f"Wrong shuffled {kind}dataloader result (split_batches={split})"
    _say(state, f"Shuffled {kind}dataloader passing.")


def dl_preparation_check() -> None:
    """Every sample once, in order when not shuffled, with whole or split batches."""
    _check_loaders(AcceleratorState(), dispatch=False)


def central_dl_preparation_check() -> None:
    """The same, with the main process reading and dispatching the batches."""
    _check_loaders(AcceleratorState(), dispatch=True)


class _ListDataset(Dataset):
    def __init__(self, data: Any):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        return self.data[index]


class _CustomBatchSampler:
    """Batches of a numpy permutation, split into len() nearly equal parts."""

    def __init__(self, dataset_length: int, batch_size: int, shuffle: bool = True):
        self.batch_size = batch_size
        self.data_index = np.arange(dataset_length)
        self.shuffle = shuffle

    def __iter__(self) -> Any:
        index = np.random.permutation(self.data_index) if self.shuffle else self.data_index
        yield from np.array_split(index, len(self))

    def __len__(self) -> int:
        return math.ceil(len(self.data_index) / self.batch_size)


def custom_sampler_check() -> None:
    """A custom batch sampler is still the one that draws the batches after prepare."""
    state = AcceleratorState()
    dataset = _ListDataset(range(32 * state.num_processes))
    loader = DataLoader(dataset, batch_sampler=_CustomBatchSampler(len(dataset), batch_size=8))
    loader = prepare_data_loader(loader, state.device, state.num_processes, state.process_index)
    kept = getattr(loader.batch_sampler, "batch_sampler", loader.batch_sampler)
    assert isinstance(kept, _CustomBatchSampler), f"Custom sampler was changed after prepare: {type(kept)}"


def _accelerator_prepared(loader: DataLoader, **config: Any) -> Any:
    return Accelerator(dataloader_config=DataLoaderConfiguration(**config)).prepare(loader)


def _three_epochs(loader: Any) -> torch.Tensor:
    return torch.cat([batch["x"] for _ in range(3) for batch in loader])


def check_seedable_sampler() -> None:
    """With use_seedable_sampler, the same seed and epoch give the same items."""
    set_seed(42)
    loader = DataLoader(RegressionDataset(length=10, seed=42), batch_size=2, shuffle=True)
    prepared = _accelerator_prepared(loader, use_seedable_sampler=True)
    first = _three_epochs(prepared)
    set_seed(42)
    prepared.set_epoch(0)
    again = _three_epochs(prepared)
    assert torch.allclose(first, again), "Did not obtain the same items with the same seed and epoch."


def check_seedable_sampler_in_batch_sampler_shard() -> None:
    """The sampler inside the process's batch sampler is the seedable one."""
    set_seed(42)
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    assert accelerator.num_processes > 1, "This check requires more than one process."
    prepared = prepare_data_loader(dataloader=DataLoader(list(range(10)), batch_size=1, shuffle=True),
                                   use_seedable_sampler=True)
    sampler = prepared.batch_sampler.batch_sampler.sampler
    assert isinstance(sampler, SeedableRandomSampler), f"Sampler in the batch sampler shard is {type(sampler)}"


def check_seedable_sampler_with_data_seed() -> None:
    """Another data_seed gives other items."""
    set_seed(42)
    loader = DataLoader(RegressionDataset(length=10, seed=42), batch_size=2, shuffle=True)
    config = DataLoaderConfiguration(use_seedable_sampler=True, data_seed=42)
    first = _three_epochs(Accelerator(dataloader_config=config).prepare(loader))
    config.data_seed = 43
    other = _three_epochs(Accelerator(dataloader_config=config).prepare(loader))
    assert not torch.allclose(first, other), "Obtained the same items with different data seed."


# ---------------------------------------------------------------------------------------------- training


def generate_baseline_dataloader(train_set: Any, generator: torch.Generator, batch_size: int,
                                 use_seedable_sampler: bool = False) -> DataLoader:
    if use_seedable_sampler:
        sampler = SeedableRandomSampler(generator=generator, data_source=train_set, num_samples=len(train_set))
        return DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    return DataLoader(train_set, batch_size=batch_size, shuffle=True, generator=generator)


def _train(model: Any, optimizer: Any, loader: Any, backward: Any) -> None:
    for _ in range(3):
        for batch in loader:
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            backward(loss)
            optimizer.step()


def mock_training(length: int, batch_size: int, generator: torch.Generator,
                  use_seedable_sampler: bool = False) -> tuple[Any, RegressionModel]:
    """The reference: one process, plain torch, batches of `batch_size`."""
    set_seed(42)
    generator.manual_seed(42)
    train_set = RegressionDataset(length=length, seed=42)
    model = RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, optimizer, generate_baseline_dataloader(train_set, generator, batch_size, use_seedable_sampler),
           lambda loss: loss.backward())
    return train_set, model


def _accelerated_training(reference: RegressionModel, train_set: Any, generator: torch.Generator, batch_size: int,
                          what: str, **accelerator_kwargs: Any) -> Accelerator:
    seedable = accelerator_kwargs["dataloader_config"].use_seedable_sampler
    accelerator = Accelerator(**accelerator_kwargs)
    loader = generate_baseline_dataloader(train_set, generator, batch_size, seedable)
    model = RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader, model, optimizer = accelerator.prepare(loader, model, optimizer)
    set_seed(42)
    generator.manual_seed(42)
    _train(model, optimizer, loader, accelerator.backward)
    model = accelerator.unwrap_model(model).cpu()
    for name in ("a", "b"):
        torch.testing.assert_close(getattr(reference, name), getattr(model, name), atol=ATOL, rtol=RTOL,
                                   msg=lambda msg: f"{what}: not the weights of one process ({name}).\n{msg}")
    return accelerator


def training_check(use_seedable_sampler: bool = False) -> None:
    """N processes with batch B (or split batches of N*B) train the weights one process gets with N*B."""
    state = AcceleratorState()
    generator = torch.Generator()
    batch_size = 8
    n = state.num_processes
    train_set, reference = mock_training(batch_size * 4 * n, batch_size * n, generator, use_seedable_sampler)
    assert are_the_same_tensors(reference.a) and are_the_same_tensors(reference.b), \
        "Did not obtain the same model on both processes."
    config = DataLoaderConfiguration(use_seedable_sampler=use_seedable_sampler)
    accelerator = _accelerated_training(reference, train_set, generator, batch_size, "batches of B",
                                        dataloader_config=config)
    accelerator.print("Training yielded the same results on one CPU or distributed setup with no batch split.")
    split = DataLoaderConfiguration(split_batches=True, use_seedable_sampler=use_seedable_sampler)
    accelerator = _accelerated_training(reference, train_set, generator, batch_size * n, "split batches",
                                        dataloader_config=split)
    accelerator.print("Training yielded the same results on one CPU or distributed setup with batch split.")

    if is_cuda_available() or is_mps_available():
        print("Keep fp32 wrapper check.")
        accelerator = Accelerator(mixed_precision="fp16")
        model = accelerator.prepare(torch.nn.Linear(2, 4))
        wrapped = accelerator.unwrap_model(model, keep_fp32_wrapper=True)
        output = wrapped(torch.Tensor([1, 2]).to(dtype=torch.float16, device=accelerator.device))
        assert output.dtype == torch.float32, f"the fp32 wrapper returned {output.dtype}"
    if is_bf16_available():
        print("BF16 training check.")
        _accelerated_training(reference, train_set, generator, batch_size, "bf16", mixed_precision="bf16",
                              dataloader_config=config)
    if is_fp16_available() and not is_hpu_available():
        print("FP16 training check.")
        _accelerated_training(reference, train_set, generator, batch_size, "fp16", mixed_precision="fp16",
                              dataloader_config=config)


def test_trigger() -> None:
    """A trigger set on the main process is seen by every process once, then cleared."""
    accelerator = Accelerator()
    assert accelerator.check_trigger() is False, "the trigger starts set"
    if accelerator.is_main_process:
        accelerator.set_trigger()
    assert accelerator.check_trigger() is True, "the main process's trigger was not seen everywhere"
    assert accelerator.check_trigger() is False, "the trigger was not cleared after it was seen"


def test_reinstantiated_state() -> None:
    """After `AcceleratorState._reset_state()`, preparing with an Accelerator made before it is an AttributeError
    that says the state was reset."""
    AcceleratorState._reset_state()
    accelerator = Accelerator()
    AcceleratorState._reset_state()
    try:
        accelerator.prepare(torch.nn.Linear(1, 1))
    except AttributeError as exc:
        message = str(exc.args[0])
    else:
        raise AssertionError("prepare() after AcceleratorState._reset_state() raised no AttributeError")
    assert "`AcceleratorState` object has no attribute" in message, message
    assert "This happens if `AcceleratorState._reset_state()`" in message, message


def main() -> None:
    accelerator = Accelerator()
    state = accelerator.state
    if state.local_process_index == 0:
        print("**Initialization**")
    init_state_check()
    state.wait_for_everyone()
    per_node = torch.cuda.device_count() if state.distributed_type == DistributedType.MULTI_GPU else \
        state.num_processes
    if per_node == state.num_processes:  # one machine only
        for title, check in (("process execution", process_execution_check),
                             ("split between processes as a list", test_split_between_processes_list),
                             ("split between processes as a dict", test_split_between_processes_nested_dict),
                             ("split between processes as a tensor", test_split_between_processes_tensor),
                             ("split between processes evenly", test_split_between_processes_evenly)):
            _say(state, f"\n**Test {title}**")
            check()
        _say(state, "\n**Test split between processes as a datasets.Dataset**")
        if is_datasets_available():
            from datasets import Dataset as datasets_Dataset

            test_split_between_processes_dataset(datasets_Dataset)
        else:
            _say(state, "Skipped because Hugging Face datasets is not available")
    _say(state, "\n**Test random number generator synchronization**")
    rng_sync_check()
    _say(state, "\n**DataLoader integration test**")
    dl_preparation_check()
    if state.distributed_type != DistributedType.XLA:
        central_dl_preparation_check()
        custom_sampler_check()
        check_seedable_sampler()
    if state.num_processes > 1:
        check_seedable_sampler_in_batch_sampler_shard()
    if state.distributed_type != DistributedType.DEEPSPEED:  # DeepSpeed does not train exactly as one CPU does
        _say(state, "\n**Training integration test**")
        training_check(use_seedable_sampler=False)
        training_check(use_seedable_sampler=True)
        _say(state, "\n**Breakpoint trigger test**")
        test_trigger()
    # the last checks run even when one fails (each fails alike on every process, so the processes stay in step),
    # and the script fails naming each that failed
    last = [("seedable sampler with another data_seed", check_seedable_sampler_with_data_seed)]
    if state.distributed_type == DistributedType.XLA:
        last = []
    last.append(("reinstantiated state", test_reinstantiated_state))
    failed = []
    for title, check in last:
        _say(state, f"\n**Test {title}**")
        try:
            check()
        except AssertionError as exc:
            failed.append(f"{title}: {exc}")
    if failed:
        raise AssertionError("failed checks:\n  " + "\n  ".join(failed))
    state.destroy_process_group()  # the last check reset the state: the forgotten run ends at exit


if __name__ == "__main__":
    main()
