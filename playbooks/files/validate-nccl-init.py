"""Initialise NCCL on every visible GPU and all-reduce once, so NCCL logs which settings it took.

Run by playbooks/validate.yml (check nccl_init) with the service environment's python, NCCL_DEBUG=INFO and
an otherwise empty environment: every "NCCL_* set by environment" line NCCL prints then comes from the
environment's own hook or /etc/nccl.conf, not from the caller.

One process per visible GPU (world size = torch.cuda.device_count()). Rank 0 prints, after a correct all-reduce,
one line for plugins/filter/nccl_init.py: "validate-nccl-init: result " and a JSON object with the world size,
NCCL's version and the NCCL_* variables of its process after NCCL's init. With one rank NCCL chooses no
algorithm or protocol and so never reports NCCL_PROTO or NCCL_ALGO; the filter checks those two there.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from nccl_environ import nccl_environment


def nccl_version():
    version = torch.cuda.nccl.version()  # a tuple such as (2, 28, 9); an int in old releases
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def run(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    tensor = torch.full((1 << 16,), float(rank + 1), device="cuda")
    dist.all_reduce(tensor)
    torch.cuda.synchronize()
    expected = world * (world + 1) / 2
    if tensor[0].item() != expected:
        raise SystemExit(f"rank {rank}: all-reduce gave {tensor[0].item()}, expected {expected}")
    if rank == 0:
        result = {"world_size": world, "nccl_version": nccl_version(), "environment": nccl_environment()}
        print("validate-nccl-init: result " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def main():
    world = torch.cuda.device_count()
    if world < 1:
        raise SystemExit("no GPU visible to torch")
    port = 29500 + os.getpid() % 1000
    if world == 1:
        run(0, 1, port)
    else:
        mp.spawn(run, args=(world, port), nprocs=world)
    print(f"validate-nccl-init: all-reduce correct on {world} GPU(s), NCCL {nccl_version()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
