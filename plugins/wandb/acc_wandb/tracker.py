"""The `wandb` tracker (Accelerate's WandBTracker): one W&B run per training, `tracker.run` is the wandb Run.

With WANDB_MODE=offline it needs no account: the run is written under <logging_dir>/wandb/offline-run-*/ (or
wandb's default directory when the Accelerator has no project/logging directory) and `wandb sync` uploads it
later. `init_kwargs={"wandb": {...}}` go to `wandb.init` (entity, name, tags, mode, dir, ...). The wandb library
is imported in `start`."""

from __future__ import annotations

import os
from typing import Any

from acc.tracking import NOT_SCALAR, GeneralTracker, hyperparameters, on_main_process, scalar


class WandBTracker(GeneralTracker):
    """Everything wandb.log takes (numbers, strings, wandb.Image, tables, histograms); one-element tensors are
    logged as numbers. Runs on the main process only (one run per training)."""

    name = "wandb"
    requires_logging_directory = False
    accepts_logging_directory = True
    ACC_REQUIRES = ("wandb",)

    def __init__(self, run_name: str, logging_dir: str | os.PathLike | None = None, **kwargs: Any):
        super().__init__()
        self.run_name = run_name
        self.logging_dir = logging_dir
        self.init_kwargs = kwargs
        self.run: Any = None

    @on_main_process
    def start(self) -> None:
        import wandb

        kwargs = dict(self.init_kwargs)
        if self.logging_dir is not None and "dir" not in kwargs:
            os.makedirs(self.logging_dir, exist_ok=True)
            kwargs["dir"] = os.fspath(self.logging_dir)
        self.run = wandb.init(project=self.run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.run.config.update(hyperparameters(values, self.name, json_like=True), allow_val_change=True)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        plain = {}
        for key, value in values.items():
            number = scalar(value)
            plain[key] = value if number is NOT_SCALAR else number
        self.run.log(plain, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Images: name -> a list of arrays or PIL images, each logged as a wandb.Image."""
        import wandb

        self.log({key: [wandb.Image(image) for image in images] for key, images in values.items()}, step=step,
                 **kwargs)

    @on_main_process
    def log_table(self, table_name: str, columns: list[str] | None = None, data: list | None = None,
                  dataframe: Any = None, step: int | None = None, **kwargs: Any) -> None:
        import wandb

        self.log({table_name: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
