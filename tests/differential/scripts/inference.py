"""Distributed inference the way Accelerate's examples write it: a PartialState, no Accelerator.

    python inference.py --out DIR
"""

import argparse
import json
import os

import torch
from accelerate import PartialState
from accelerate.utils import gather_object


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    state = PartialState(cpu=True)
    prompts = [f"prompt {i}" for i in range(7)]
    with state.split_between_processes(prompts, apply_padding=True) as mine:
        answers = [text.upper() for text in mine]
    with state.split_between_processes(torch.arange(7) * 10) as part:
        numbers = part.tolist()
    gathered = gather_object(answers)
    with state.main_process_first():
        order = "first" if state.is_main_process else "after"

    @state.on_main_process
    def main_only():
        return "main"

    record = {
        "distributed_type": str(state.distributed_type), "num_processes": state.num_processes,
        "process_index": state.process_index, "local_process_index": state.local_process_index,
        "device": str(state.device), "is_main_process": state.is_main_process,
        "is_last_process": state.is_last_process, "use_distributed": state.use_distributed,
        "answers": answers, "numbers": numbers, "gathered": gathered, "order": order, "main_only": main_only(),
        "repr": repr(state),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{state.process_index}.json"), "w") as fp:
        json.dump(record, fp)
    state.wait_for_everyone()


if __name__ == "__main__":
    main()
