"""Accelerate's `accelerate.test_utils.training`, for acc: the tiny regression problem acc's test scripts train
(`RegressionDataset`: y = a*x + b plus noise; `RegressionModel`: two scalar parameters) and the MRPC data loaders
that Accelerate's examples use under test (`mocked_dataloaders`, which need datasets and transformers).

The dataset draws its samples with numpy's default generator in the same order as Accelerate's, so a seed gives
the same numbers on both.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from acc.contract.enums import DistributedType

MRPC_FILES = {"train": "tests/test_samples/MRPC/train.csv", "validation": "tests/test_samples/MRPC/dev.csv"}


class RegressionDataset:
    """`length` samples {"x": float32, "y": float32} with y = a*x + b + N(0, 0.1) noise, x ~ N(0, 1); `seed`
    seeds numpy's generator (None: fresh entropy)."""

    def __init__(self, a: float = 2, b: float = 3, length: int = 64, seed: int | None = None):
        import numpy as np

        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        noise = rng.normal(scale=0.1, size=(length,)).astype(np.float32)
        self.y = a * self.x + b + noise

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": self.x[index], "y": self.y[index]}


class RegressionModel(torch.nn.Module):
    """y = a*x + b with scalar parameters `a` and `b` (float32); prints the dtypes at its first forward.
    `double_output` is accepted for Accelerate's signature and changes nothing, as there."""

    def __init__(self, a: float = 0, b: float = 0, double_output: bool = False):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())
        self.first_batch = True

    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor:
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        return x * self.a + self.b


def _tokenized_mrpc(tokenize: Any, accelerator: Any) -> Any:
    """The MRPC sample CSVs mapped through `tokenize`, the main process first."""
    from datasets import load_dataset

    raw = load_dataset("csv", data_files=MRPC_FILES)
    with accelerator.main_process_first():
        return raw.map(tokenize, batched=True, remove_columns=["sentence1", "sentence2", "label"])


def mocked_dataloaders(accelerator: Any, batch_size: int = 16) -> tuple[DataLoader, DataLoader]:
    """(train, validation) loaders over the MRPC sample CSVs in tests/test_samples/MRPC (relative to the working
    directory), tokenized with bert-base-cased, batches of 2 and 1; for the examples' TESTING_MOCKED_DATALOADERS
    mode. `batch_size` is accepted and not used, as in Accelerate."""
    from datasets import load_dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("bert-base-cased")
    raw = load_dataset("csv", data_files=MRPC_FILES)
    label_ids = {label: i for i, label in enumerate(raw["train"].unique("label"))}

    def tokenize(examples: dict) -> Any:
        encoded = tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=None,
                            padding="max_length")
        if "label" in examples:
            encoded["labels"] = [label_ids[label] for label in examples["label"]]
        return encoded

    tokenized = raw.map(tokenize, batched=True, remove_columns=["sentence1", "sentence2", "label"])

    def collate(examples: list) -> Any:
        if accelerator.distributed_type == DistributedType.XLA:  # fixed shapes on TPUs
            return tokenizer.pad(examples, padding="max_length", max_length=128, return_tensors="pt")
        return tokenizer.pad(examples, padding="longest", return_tensors="pt")

    return (DataLoader(tokenized["train"], shuffle=True, collate_fn=collate, batch_size=2),
            DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate, batch_size=1))


def mocked_dataloaders_for_autoregressive_models(accelerator: Any, batch_size: int = 16) -> tuple[DataLoader, DataLoader]:
    """(train, validation) loaders of next-token batches over the first sentences of the MRPC sample CSVs, tokenized
    with SmolLM-360M's tokenizer (pad = eos), labels shifted by one with padding as -100; batches of 2 and 1."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM-360M")
    tokenizer.pad_token = tokenizer.eos_token

    def tokenize(examples: dict) -> Any:
        return tokenizer(examples["sentence1"], truncation=True, max_length=None, return_attention_mask=False)

    tokenized = _tokenized_mrpc(tokenize, accelerator)

    def collate(examples: list) -> Any:
        if accelerator.distributed_type == DistributedType.XLA:
            longest = 128
        else:
            longest = max(len(example["input_ids"]) for example in examples)
        multiple = {"fp8": 16, "no": None}.get(accelerator.mixed_precision, 8)
        batch = tokenizer.pad(examples, padding="max_length", max_length=longest + 1, pad_to_multiple_of=multiple,
                              return_tensors="pt")
        ids = batch["input_ids"]
        batch["labels"] = torch.where(ids[:, 1:] == tokenizer.pad_token_id, -100, ids[:, 1:])
        batch["input_ids"] = ids[:, :-1]
        if "attention_mask" in batch:
            batch["attention_mask"] = batch["attention_mask"][:, :-1]
        return batch

    return (DataLoader(tokenized["train"], shuffle=False, collate_fn=collate, batch_size=2),
            DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate, batch_size=1))


__all__ = ["RegressionDataset", "RegressionModel", "mocked_dataloaders",
           "mocked_dataloaders_for_autoregressive_models"]
