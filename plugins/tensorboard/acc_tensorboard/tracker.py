"""The `tensorboard` tracker: event files under <logging_dir>/<project_name>, written by torch's SummaryWriter
(Accelerate's TensorBoardTracker: `tracker.writer` is the SummaryWriter). The tensorboard library is imported in
`start`, when the tracker is chosen and runs."""

from __future__ import annotations

import os
from typing import Any

from acc.tracking import GeneralTracker, Unstorable, hyperparameters, on_main_process, split_values


class TensorBoardTracker(GeneralTracker):
    """Scalars (`add_scalar`), strings (`add_text`), dicts of numbers as 'name/key' scalars, hyper-parameters in the
    same event file (the HParams plugin reads them). `init_kwargs={"tensorboard": {...}}` go to SummaryWriter."""

    name = "tensorboard"
    requires_logging_directory = True
    ACC_REQUIRES = ("tensorboard",)

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs: Any):
        super().__init__()
        self.run_name = run_name
        self.logging_dir_param = logging_dir
        self.logging_dir = os.path.join(logging_dir, run_name)
        self.init_kwargs = kwargs
        self.writer: Any = None
        self._unstorable = Unstorable(self.name, "numbers, strings and dicts of numbers")

    @on_main_process
    def start(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(self.logging_dir, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        from torch.utils.tensorboard.summary import hparams

        experiment, start, end = hparams(hyperparameters(values, self.name), metric_dict={})
        file_writer = self.writer._get_file_writer()
        for summary in (experiment, start, end):
            file_writer.add_summary(summary)
        self.writer.flush()

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        numbers, texts = split_values(values, self._unstorable)
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, global_step=step, **kwargs)
        for key, value in texts.items():
            self.writer.add_text(key, value, global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def log_images(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Images: name -> a batch (N, C, H, W) array or tensor (`SummaryWriter.add_images`)."""
        for key, value in values.items():
            self.writer.add_images(key, value, global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()
