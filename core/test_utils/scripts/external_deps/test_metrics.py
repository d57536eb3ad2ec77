"""`gather_for_metrics` sees each sample exactly once: acc's version of Accelerate's
test_utils/scripts/external_deps/test_metrics.py.

    python PATH/test_metrics.py                                       # one process
    acc launch --backend ddp --nproc 2 PATH/test_metrics.py           # two (gloo on the CPU)
    debug_launcher(test_metrics.main)

On every device: predictions gathered with `gather_for_metrics` over a prepared loader number exactly the samples
(99 with every split_batches / dispatch_batches combination, 512 when it divides evenly), iterable datasets
(tensors and plain objects) give all 30 samples without acc logging anything (the tensor one dispatched:
a `DataLoaderDispatcher`, or acc's prepared loader in its dispatching mode), and `drop_last` is honoured. On an
accelerator, also the MRPC case: a BERT model's accuracy and F1 through `gather_for_metrics` equal those of the
same model run on the whole validation set in one process; that part needs datasets, evaluate and transformers
(imported only there) and the hub files hf-internal-testing/mrpc-bert-base-cased and nyu-mll/glue.

Accelerate runs the iterable-dataset checks on accelerators only; they are cheap and run everywhere here.
"""

from __future__ import annotations

import logging
import math
import os
from copy import deepcopy
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from acc.accelerator import Accelerator
from acc.contract.enums import DistributedType
from acc.contract.kwargs import DataLoaderConfiguration
from acc.data_loader import DataLoaderDispatcher
from acc.test_utils.testing import reset_state, torch_device
from acc.test_utils.training import RegressionDataset, RegressionModel
from acc.utils import set_seed
from acc.utils.imports import is_torch_xla_available

os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "true"


class ListHandler(logging.Handler):
    """Keeps every record it is given."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.logs: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.logs.append(record)


def get_basic_setup(accelerator: Accelerator, num_samples: int = 82, batch_size: int = 16) -> tuple:
    set_seed(42)
    model = RegressionModel()
    ddp_model = deepcopy(model)
    dataloader = DataLoader(RegressionDataset(length=num_samples), batch_size=batch_size)
    model.to(accelerator.device)
    ddp_model, dataloader = accelerator.prepare(ddp_model, dataloader)
    return model, ddp_model, dataloader


def generate_predictions(model: Any, dataloader: Any, accelerator: Accelerator) -> tuple[torch.Tensor, torch.Tensor]:
    logits, targets = [], []
    for batch in dataloader:
        inputs, target = batch.values()
        with torch.no_grad():
            logit, target = accelerator.gather_for_metrics((model(inputs), target))
        logits.append(logit)
        targets.append(target)
    return torch.cat(logits), torch.cat(targets)


def test_torch_metrics(accelerator: Accelerator, num_samples: int = 82, dispatch_batches: bool = False,
                       split_batches: bool = False, batch_size: int = 16) -> None:
    _, ddp_model, dataloader = get_basic_setup(accelerator, num_samples, batch_size)
    logits, _ = generate_predictions(ddp_model, dataloader, accelerator)
    assert len(logits) == num_samples, f"Unexpected number of inputs:\n    Expected: {num_samples}\n    " \
                                       f"Actual: {len(logits)}"


class _SizedIterable(IterableDataset):
    def __init__(self, data: Any):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Any:
        yield from self.data


def _gather_iterable(data: Any, expect_dispatcher: bool) -> None:
    """All 30 samples of an iterable dataset come back once, and acc logs nothing while gathering them."""
    accelerator = Accelerator()
    prepared = accelerator.prepare(DataLoader(_SizedIterable(data), batch_size=4))
    if expect_dispatcher:  # the main process reads an iterable dataset and dispatches its batches
        dispatches = isinstance(prepared, DataLoaderDispatcher) or getattr(prepared, "dispatch", False) is True
        assert dispatches, f"prepare gave {type(prepared).__name__}, which does not dispatch the batches"
    handler = ListHandler()
    logger = logging.getLogger("acc")
    if accelerator.is_main_process:
        logger.addHandler(handler)
    try:
        gathered = [accelerator.gather_for_metrics(batch) for batch in prepared]
    finally:
        logger.removeHandler(handler)
    assert torch.cat(gathered).size(0) == 30, f"gathered {torch.cat(gathered).size(0)} samples, not 30"
    assert not handler.logs, f"acc logged while gathering: {[r.getMessage() for r in handler.logs]}"


def test_gather_for_metrics_with_iterable_dataset() -> None:
    _gather_iterable(torch.as_tensor(range(30)), expect_dispatcher=True)


def test_gather_for_metrics_with_non_tensor_objects_iterable_dataset() -> None:
    _gather_iterable(list(range(30)), expect_dispatcher=False)


def test_gather_for_metrics_drop_last() -> None:
    """With drop_last, the second batch of every process comes back whole (5 per process)."""
    accelerator = Accelerator()
    per_device = 5
    loader = accelerator.prepare(DataLoader(range(10 * accelerator.num_processes + 1), batch_size=per_device,
                                            drop_last=True))
    batches = iter(loader)
    next(batches)
    gathered = accelerator.gather_for_metrics(next(batches))
    expected = per_device * accelerator.num_processes
    assert gathered.size(0) == expected, f"Expected number of items: {expected}, Actual: {gathered.size(0)}"


# ---------------------------------------------------------------------------------------------- MRPC (accelerators)


def get_dataloader(accelerator: Accelerator, use_longest: bool = False) -> DataLoader:
    from datasets import load_dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("hf-internal-testing/mrpc-bert-base-cased")
    dataset = load_dataset("nyu-mll/glue", "mrpc", split="validation")

    def tokenize(examples: dict) -> Any:
        return tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=None)

    with accelerator.main_process_first():
        tokenized = dataset.map(tokenize, batched=True, remove_columns=["idx", "sentence1", "sentence2"])
    tokenized = tokenized.rename_column("label", "labels")

    def collate(examples: list) -> Any:
        if use_longest:
            return tokenizer.pad(examples, padding="longest", return_tensors="pt")
        return tokenizer.pad(examples, padding="max_length", max_length=128, return_tensors="pt")

    return DataLoader(tokenized, shuffle=False, collate_fn=collate, batch_size=16)


def get_mrpc_setup(dispatch_batches: bool, split_batches: bool) -> tuple[dict, Accelerator]:
    from transformers import AutoModelForSequenceClassification

    config = DataLoaderConfiguration(dispatch_batches=dispatch_batches, split_batches=split_batches)
    accelerator = Accelerator(dataloader_config=config)
    dataloader = get_dataloader(accelerator, not dispatch_batches)
    model = AutoModelForSequenceClassification.from_pretrained("hf-internal-testing/mrpc-bert-base-cased",
                                                               return_dict=True)
    ddp_model, ddp_dataloader = accelerator.prepare(model, dataloader)
    return {"ddp": [ddp_model, ddp_dataloader, torch_device], "no": [model, dataloader, accelerator.device]}, \
        accelerator


def test_mrpc(dispatch_batches: bool = False, split_batches: bool = False) -> None:
    import evaluate

    metric = evaluate.load("glue", "mrpc")
    setup, accelerator = get_mrpc_setup(dispatch_batches, split_batches)
    model, dataloader, device = setup["no"]
    model.to(device)
    model.eval()
    for batch in dataloader:
        batch.to(device)
        with torch.inference_mode():
            predictions = model(**batch).logits.argmax(dim=-1)
        metric.add_batch(predictions=predictions, references=batch["labels"])
    baseline = metric.compute()
    model, dataloader, _ = setup["ddp"]
    model.eval()
    for batch in dataloader:
        with torch.inference_mode():
            predictions = model(**batch).logits.argmax(dim=-1)
        predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
        metric.add_batch(predictions=predictions, references=references)
    distributed = metric.compute()
    for key in ("accuracy", "f1"):
        assert math.isclose(baseline[key], distributed[key]), \
            f"Baseline and Distributed are not the same for key {key}:\n\tBaseline: {baseline[key]}\n\t" \
            f"Distributed: {distributed[key]}\n"


def main() -> None:
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=False, dispatch_batches=False))
    say = accelerator.print
    xla = accelerator.state.distributed_type == DistributedType.XLA
    dispatch_options = [False] if xla else [True, False]  # XLA does not dispatch batches
    if accelerator.device.type != "cpu" and not is_torch_xla_available():
        from datasets.utils import logging as datasets_logging
        from transformers.utils import logging as transformers_logging

        for library in (datasets_logging, transformers_logging):
            (library.set_verbosity_warning if accelerator.is_local_main_process else library.set_verbosity_error)()
        say("**Testing gather_for_metrics**")
        for split_batches in (True, False):
            for dispatch_batches in dispatch_options:
                say(f"With: `split_batches={split_batches}`, `dispatch_batches={dispatch_batches}`")
                test_mrpc(dispatch_batches, split_batches)
                reset_state()
    if not xla:
        say("test_gather_for_metrics_with_iterable_dataset")
        test_gather_for_metrics_with_iterable_dataset()
        say("test gather_for_metrics_with_non_tensor_objects_iterable_dataset")
        test_gather_for_metrics_with_non_tensor_objects_iterable_dataset()
        say("**Test torch metrics**")
        for split_batches in (True, False):
            for dispatch_batches in dispatch_options:
                config = DataLoaderConfiguration(split_batches=split_batches, dispatch_batches=dispatch_batches)
                accelerator = Accelerator(dataloader_config=config)
                say(f"With: `split_batches={split_batches}`, `dispatch_batches={dispatch_batches}`, length=99")
                test_torch_metrics(accelerator, 99)
                reset_state()
    say("**Test last batch is not dropped when perfectly divisible**")
    accelerator = Accelerator()
    test_torch_metrics(accelerator, 512)
    reset_state()
    say("**Test that `drop_last` is taken into account**")
    test_gather_for_metrics_drop_last()
    accelerator.end_training()
    reset_state()


if __name__ == "__main__":
    main()
