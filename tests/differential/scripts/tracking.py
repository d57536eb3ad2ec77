"""Experiment tracking the way Accelerate's documentation writes a custom tracker: a GeneralTracker subclass
passed in log_with, init_trackers with a config, log at every step with log_kwargs, get_tracker, trackers,
end_training. Each rank records what its tracker received.

    python tracking.py --out DIR [--mode object|none|all]
"""

import argparse
import json
import os

from accelerate import Accelerator
from accelerate.tracking import GeneralTracker, on_main_process


class Recorder(GeneralTracker):
    name = "recorder"
    requires_logging_directory = False

    def __init__(self, run_name):
        super().__init__()
        self.run_name = run_name
        self.calls = []

    @on_main_process
    def start(self):
        self.calls.append(["start", self.run_name])

    @property
    def tracker(self):
        return self.calls

    @on_main_process
    def store_init_configuration(self, values):
        self.calls.append(["config", values])

    @on_main_process
    def log(self, values, step=None, **kwargs):
        self.calls.append(["log", step, values, kwargs])

    @on_main_process
    def finish(self):
        self.calls.append(["finish"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", default="object", choices=("object", "none", "all"))
    args = p.parse_args()
    recorder = Recorder("run-name")
    log_with = {"object": [recorder], "none": None, "all": ["all", recorder]}[args.mode]
    accelerator = Accelerator(cpu=True, log_with=log_with)
    accelerator.init_trackers("project", config={"lr": 0.1, "batch_size": 4, "name": "x"},
                              init_kwargs={"recorder": {"unused": True}})
    for step in range(3):
        accelerator.log({"loss": 1.0 / (step + 1), "phase": f"s{step}"}, step=step,
                        log_kwargs={"recorder": {"commit": step % 2 == 0}})
    accelerator.log({"loss": 0.0})
    trackers = [t.name for t in accelerator.trackers]
    blank = accelerator.get_tracker("recorder")
    unwrapped = accelerator.get_tracker("recorder", unwrap=True)
    accelerator.end_training()
    record = {"calls": recorder.calls, "trackers": trackers, "get_tracker": type(blank).__name__,
              "unwrap_is_the_calls": unwrapped is recorder.calls}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{accelerator.process_index}.json"), "w") as fp:
        json.dump(record, fp)


if __name__ == "__main__":
    main()
