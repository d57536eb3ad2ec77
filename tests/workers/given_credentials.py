"""A run given credentials three ways (script arguments, environment variables, tracker hyper-parameters) that
saves a checkpoint and logs through the jsonl tracker; it records only sha256 digests of what it received.

    HF_TOKEN=... acc launch ... given_credentials.py --out DIR --hf_token T1 --wandb-api-key=T2 T3
"""

import argparse
import hashlib
import os

import torch
from common import dump

from acc import Accelerator, ProjectConfiguration


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--hf_token")
    p.add_argument("--wandb-api-key")
    p.add_argument("positional")
    args = p.parse_args()
    accelerator = Accelerator(log_with="jsonl", project_config=ProjectConfiguration(
        project_dir=os.path.join(args.out, "project"), automatic_checkpoint_naming=True))
    config = dict(vars(args), env_token=os.environ["HF_TOKEN"], lr=0.1)
    accelerator.init_trackers("secrets", config=config)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.randn(2, 4)).pow(2).mean())
    optimizer.step()
    accelerator.log({"loss": 1.0}, step=1)
    accelerator.save_state()
    seen = [args.hf_token, args.wandb_api_key, args.positional, os.environ["HF_TOKEN"], os.environ["WANDB_API_KEY"]]
    dump(args.out, accelerator.process_index, {"digests": [hashlib.sha256(s.encode()).hexdigest() for s in seen]})
    accelerator.end_training()


if __name__ == "__main__":
    main()
