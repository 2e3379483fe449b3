#!/usr/bin/env python3
"""All-reduce across every local GPU (one process per GPU, PyTorch + NCCL): check the sum, report bus bandwidth.

    python scripts/nccl_allreduce.py --label stack --json out.json

Each rank fills its buffer with (rank + 1); after a sum all-reduce every element must equal n(n+1)/2.
Bus bandwidth follows nccl-tests: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n. The NCCL variables
that the process saw at start are printed first, so a run shows where its settings came from.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

NCCL_VARS = ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_NVLS_ENABLE", "NCCL_CONF_FILE")
DEFAULT_SIZES = [2**k for k in range(10, 31, 2)]  # 1 KiB .. 1 GiB


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    sizes, iters = args.sizes, args.iters
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    expected = world * (world + 1) / 2
    rows = []
    for size in sizes:
        numel = max(1, size // 4)
        buf = torch.full((numel,), float(rank + 1), dtype=torch.float32, device="cuda")
        dist.all_reduce(buf)  # warm-up, and the correctness check
        torch.cuda.synchronize()
        correct = bool(torch.all(buf == expected).item())
        for _ in range(3):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        secs = (time.perf_counter() - start) / iters
        nbytes = numel * 4
        algbw = nbytes / secs / 1e9
        rows.append(
            {
                "bytes": nbytes,
                "time_us": secs * 1e6,
                "algbw_GBs": algbw,
                "busbw_GBs": algbw * 2 * (world - 1) / world,
                "correct": correct,
            }
        )
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="run", help="name of this configuration in the output")
    parser.add_argument("--sizes", type=int, nargs="*", default=DEFAULT_SIZES, help="message sizes in bytes")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    world = torch.cuda.device_count()
    if world < 1:
        print("no CUDA device", file=sys.stderr)
        return 2
    seen = {k: os.environ.get(k) for k in NCCL_VARS}
    print(f"[{args.label}] python={sys.executable} gpus={world} nccl={torch.cuda.nccl.version()} env={seen}")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(worker, args=(world, free_port(), args, queue), nprocs=world, join=True, start_method="spawn")
    rows = queue.get()
    print(f"[{args.label}] {'bytes':>12} {'time us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11} correct")
    for r in rows:
        print(
            f"[{args.label}] {r['bytes']:>12} {r['time_us']:>10.1f} {r['algbw_GBs']:>11.2f} "
            f"{r['busbw_GBs']:>11.2f} {r['correct']}"
        )
    ok = all(r["correct"] for r in rows)
    result = {"label": args.label, "gpus": world, "env": seen, "rows": rows, "correct": ok}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
