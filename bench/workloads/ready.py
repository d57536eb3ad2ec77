"""Launch-to-ready: initialise the process group, meet at a barrier, exit (plain torch.distributed)."""

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
