"""diffusers' pipeline offloading on a tiny pipeline built locally (no downloads): a DDPM pipeline's images with
`enable_model_cpu_offload()` and with `enable_sequential_cpu_offload()` against the plain pipeline's, same seed
(JSON, --out). Imports only diffusers and torch: it runs on Hugging Face Accelerate and on acc's drop-in alike."""

import argparse
import json

import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel


def pipeline():
    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                       norm_num_groups=4)
    return DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=10))


def images(pipe):
    out = pipe(batch_size=2, num_inference_steps=3, generator=torch.Generator().manual_seed(1), output_type="np")
    return torch.from_numpy(out.images)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu", help="the execution device of the offloading hooks")
    args = parser.parse_args()
    plain = images(pipeline())
    results = {}
    for mode in ("enable_model_cpu_offload", "enable_sequential_cpu_offload"):
        pipe = pipeline()
        try:
            getattr(pipe, mode)(device=args.device)
            got = images(pipe)
        except Exception as exc:  # noqa: BLE001 - recorded: the test says which side failed and how
            results[mode] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
            continue
        results[mode] = {"max_difference": (got - plain).abs().max().item(), "images": got.flatten().tolist()}
    with open(args.out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
