"""Which of inductor's modules a ZeRO engine's prepare loaded; each rank writes them.

    acc launch --backend deepspeed --zero-stage N engine_imports.py --out DIR
"""

import argparse
import sys

import torch
from common import dump

from acc import Accelerator

# loaded by torch.compile's decoration, never by an eager step (torch._dynamo itself comes with any optimizer)
COMPILER_MODULES = ("torch._inductor.compile_fx", "torch._functorch.aot_autograd", "networkx")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for (x,) in loader:
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    dump(args.out, accelerator.process_index, {
        "loaded": [m for m in COMPILER_MODULES if m in sys.modules],
        "muon_imported": "deepspeed.runtime.zero.muon.muon_optimizer" in sys.modules,
    })
    accelerator.end_training()


if __name__ == "__main__":
    main()
