#!/usr/bin/env python3
"""Latency of the small all-reduces decoding waits for, across the GPUs of a service, timed as decoding sees them.

Run by playbooks/benchmark.yml with the service environment's python and the unit's environment (its
CUDA_VISIBLE_DEVICES, the NCCL settings of nccl_tuning): one process per GPU, torch.distributed with NCCL, each
rank filling its buffers with rank + 1, so that every element of a sum all-reduce must be n(n+1)/2.

For each message size (hidden size x 2 bytes x batch: a few KB to tens of KB), ``--steps`` all-reduces on as many
buffers are captured in one CUDA graph, as an engine captures its decode step, and the graph is replayed
``--iters`` times between two CUDA events: the latency is the elapsed time over iters x steps, the slowest rank's.
``--method eager`` times back-to-back calls instead (also the only way on a CPU, ``--backend gloo``). The sum is
checked after an eager all-reduce and after one replay of the captured graph; a wrong sum fails the run (exit 1).

Fewer than two GPUs visible: nothing to all-reduce across, the result says so (measured: false) and the ceiling
keeps the hardware profile's figure; ``--single-rank`` times the path with a world of one all the same (a check
of the machinery, not a latency across GPUs).

    python allreduce-latency.py --world 8 --sizes 8192 16384 32768 65536 --json allreduce.json

Exit status: 0 measured (or not measurable), 1 a wrong sum, 2 bad arguments or not as many GPUs as --world, 3 a
rank failed (its traceback is printed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import queue as queues
import socket
import sys
import time
import traceback
import warnings

from nccl_environ import nccl_environment

DEFAULT_SIZES = [8192, 16384, 32768, 65536]
# Buffers one size may capture in a graph: a large message gets fewer steps.
GRAPH_BYTES = 256 << 20
PREFIX = "allreduce-latency:"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, help="ranks, one a GPU (default: every visible GPU)")
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="message sizes in bytes")
    parser.add_argument("--method", choices=("graph", "eager"), help="default: graph on GPUs, eager on a CPU")
    parser.add_argument("--steps", type=int, default=64, help="all-reduces captured in one graph")
    parser.add_argument("--iters", type=int, default=100, help="graph replays (eager: calls) timed")
    parser.add_argument("--warmup", type=int, default=10, help="replays (eager: calls) before the timing")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl", help="gloo: CPU ranks, no GPU")
    parser.add_argument("--single-rank", action="store_true", help="time a world of one GPU all the same")
    parser.add_argument("--label", default="", help="a name printed before each line")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    bad = [f"--{name} {value}" for name, value in (("steps", args.steps), ("iters", args.iters)) if value < 1]
    bad += [f"--sizes {size}" for size in args.sizes if size < 1]
    if args.warmup < 0:
        bad.append(f"--warmup {args.warmup}")
    if args.world is not None and args.world < 1:
        bad.append(f"--world {args.world}")
    if bad:
        parser.error(f"{', '.join(bad)}: expected a whole number of at least 1 (--warmup: at least 0)")
    if args.backend == "gloo" and args.world is None:
        parser.error("--backend gloo needs --world: CPU ranks are not counted from the GPUs")
    if args.backend == "gloo" and args.method == "graph":
        parser.error("--method graph needs GPUs (--backend nccl): a CPU has no CUDA graphs")
    args.method = args.method or ("graph" if args.backend == "nccl" else "eager")
    return args


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def steps_for(size, steps):
    """All-reduces (buffers) for one size: --steps, fewer where their buffers would pass GRAPH_BYTES."""
    return max(1, min(steps, GRAPH_BYTES // size))


def first_wrong(torch, buffers, expected, rank, size):
    """A sentence about the first element that is not ``expected``, or ""."""
    for index, buf in enumerate(buffers):
        wrong = (buf.float() != expected).nonzero()
        if len(wrong):
            at = int(wrong[0])
            return (
                f"rank {rank}: all-reduce of {size} B (buffer {index}) gave {buf[at].item()} at element {at}, "
                f"expected {expected}"
            )
    return ""


def capture(torch, dist, buffers):
    """One CUDA graph holding an all-reduce of each buffer, as a decode step's graph holds its layers', and whether
    it came out empty (PyTorch warns so: one rank's in-place all-reduce launches nothing to capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the collectives' first calls happen outside the capture
        for buf in buffers:
            dist.all_reduce(buf)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph):
            for buf in buffers:
                dist.all_reduce(buf)
    torch.cuda.synchronize()
    return graph, any("graph is empty" in str(w.message).lower() for w in seen)


def time_graph(torch, dist, graph, iters, warmup):
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3  # microseconds


def time_eager(torch, dist, buffers, iters, warmup, *, sync):
    for index in range(warmup):
        dist.all_reduce(buffers[index % len(buffers)])
    sync()
    dist.barrier()
    sync()
    start = time.perf_counter()
    for index in range(iters):
        dist.all_reduce(buffers[index % len(buffers)])
    sync()
    return (time.perf_counter() - start) * 1e6


def worker(rank, world, port, opts, results):
    """One rank: check the sum and time each size; puts (rank, rows, nccl environment) into ``results``."""
    import torch  # noqa: PLC0415  (the service environment's; the module imports without it)
    import torch.distributed as dist  # noqa: PLC0415

    cuda = opts["backend"] == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    init = {"device_id": device} if cuda else {}
    dist.init_process_group(opts["backend"], init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **init)
    dtype = getattr(torch, opts["dtype"])
    expected = world * (world + 1) / 2
    rows = []
    try:
        for size in opts["sizes"]:
            numel = max(1, size // torch.empty((), dtype=dtype).element_size())
            steps = steps_for(size, opts["steps"]) if opts["method"] == "graph" else 1
            buffers = [torch.full((numel,), float(rank + 1), dtype=dtype, device=device) for _ in range(steps)]
            for buf in buffers:
                dist.all_reduce(buf)
            sync()
            wrong = first_wrong(torch, buffers, expected, rank, size)
            if opts["method"] == "graph":
                graph, empty = capture(torch, dist, buffers)
                for buf in buffers:  # the captured all-reduces sum right too
                    buf.fill_(rank + 1)
                graph.replay()
                sync()
                wrong = wrong or first_wrong(torch, buffers, expected, rank, size)
                for buf in buffers:  # zeros: replayed sums stay finite
                    buf.zero_()
                elapsed = time_graph(torch, dist, graph, opts["iters"], opts["warmup"])
                calls = opts["iters"] * steps
            else:
                elapsed = time_eager(torch, dist, buffers, opts["iters"], opts["warmup"], sync=sync)
                calls, empty = opts["iters"], False
            rows.append(
                {
                    "bytes": numel * buffers[0].element_size(),
                    "steps": steps,
                    "us": elapsed / calls,
                    "wrong": wrong,
                    "empty": empty,
                }
            )
        results.put((rank, rows, nccl_environment()))
    finally:
        dist.destroy_process_group()


def run_rank(target, rank, world_port_opts, results):
    """A spawned rank: its result, or its traceback when it fails, goes to ``results``."""
    try:
        target(rank, *world_port_opts, results)
    except BaseException:
        results.put((rank, None, traceback.format_exc()))
        raise SystemExit(1) from None


class RankFailed(RuntimeError):
    """A rank raised or died; the message holds what it said."""


def gather(target, world, port, opts):
    """Run ``target`` on ``world`` ranks (spawned processes; in this one for a world of one): {rank: result}."""
    if world == 1:
        results = queues.SimpleQueue()
        target(0, 1, port, opts, results)
        rank, rows, env = results.get()
        return {rank: (rows, env)}
    context = multiprocessing.get_context("spawn")
    results = context.SimpleQueue()
    procs = [
        context.Process(target=run_rank, args=(target, rank, (world, port, opts), results), name=f"rank {rank}")
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    found, failed = {}, []
    while True:
        alive = any(proc.is_alive() for proc in procs)
        while not results.empty():  # read as they come: a full pipe would block a rank
            rank, rows, extra = results.get()
            if rows is None:
                failed.append(f"rank {rank} failed:\n{extra}")
            else:
                found[rank] = (rows, extra)
        if failed or not alive:
            break
        procs[0].join(0.1)
    for proc in procs:  # a rank left waiting in a collective for a failed one
        if proc.is_alive():
            proc.terminate()
        proc.join()
    failed += [f"{proc.name} exited with {proc.exitcode}" for rank, proc in enumerate(procs) if rank not in found]
    if failed:
        raise RankFailed("\n".join(dict.fromkeys(failed)))
    return found


def combine(found, world):
    """Rows of every size across the ranks: the slowest rank's latency, every rank's, the first wrong sum."""
    sizes = found[0][0]
    rows = []
    for index, row in enumerate(sizes):
        per_rank = [found[rank][0][index]["us"] for rank in range(world)]
        wrong = [found[rank][0][index]["wrong"] for rank in range(world) if found[rank][0][index]["wrong"]]
        latency = max(per_rank)
        rows.append(
            {
                "bytes": row["bytes"],
                "buffers": row["steps"],
                "latency_us": round(latency, 2),
                "per_rank_us": [round(us, 2) for us in per_rank],
                "busbw_gbps": round(row["bytes"] / (latency * 1e-6) * 2 * (world - 1) / world / 1e9, 3),
                "correct": not wrong,
                "error": wrong[0] if wrong else "",
                "graph_empty": any(found[rank][0][index]["empty"] for rank in range(world)),
            }
        )
    return rows


def visible_gpus(torch):
    try:
        return torch.cuda.device_count()
    except RuntimeError:
        return 0


def nccl_version(torch):
    try:
        version = torch.cuda.nccl.version()  # (2, 28, 9); an int in old releases
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def say(args, text):
    print(f"{args.label + ' ' if args.label else ''}{PREFIX} {text}", flush=True)


def finish(args, result):
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
            out.write("\n")
    return 0 if result.get("correct", True) else 1


def cannot_measure(args, result):
    """Why this run cannot measure an all-reduce ("" when it can); puts the world and the GPUs seen in ``result``."""
    if args.backend == "nccl" and args.world == 1 and not args.single_rank:
        result["world_size"] = 1
        return "--world 1: one GPU has nothing to all-reduce with"
    if importlib.util.find_spec("torch") is None:
        return f"no torch in the environment of {sys.executable}"
    visible = args.world
    if args.backend == "nccl":  # gloo's ranks need no torch in this process: the spawned ranks import it
        import torch  # noqa: PLC0415

        visible = visible_gpus(torch)
        result.update(gpus_visible=visible, nccl_version=nccl_version(torch))
    result["world_size"] = args.world or visible
    if args.backend == "nccl" and visible < 2 and not args.single_rank:
        what = "no GPU is visible" if visible == 0 else "one GPU is visible"
        return f"{what} (CUDA_VISIBLE_DEVICES={result['cuda_visible_devices']}): an all-reduce needs two GPUs or more"
    return ""


def main(argv=None, target=worker):
    args = parse_args(argv)
    result = {
        "program": "allreduce-latency.py",
        "python": sys.executable,
        "backend": args.backend,
        "method": args.method,
        "dtype": args.dtype,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
        "measured": False,
    }
    reason = cannot_measure(args, result)
    if reason:
        result["reason"] = reason
        say(args, f"cannot measure an all-reduce: {reason}; the ceiling keeps the hardware profile's figure")
        return finish(args, result)
    world = result["world_size"]
    visible = result.get("gpus_visible", world)
    if world > visible or (args.single_rank and visible < 1):
        print(f"{PREFIX} --world {world} needs {world} GPUs; {visible} visible", file=sys.stderr)
        return 2
    opts = {
        "backend": args.backend,
        "method": args.method,
        "dtype": args.dtype,
        "sizes": args.sizes,
        "steps": args.steps,
        "iters": args.iters,
        "warmup": args.warmup,
    }
    how = (
        f"a CUDA graph of up to {args.steps} all-reduces replayed {args.iters} times"
        if args.method == "graph"
        else f"{args.iters} back-to-back all-reduces"
    )
    say(
        args,
        f"{world} rank(s), {args.backend} {result.get('nccl_version') or ''}, {how}, {args.dtype}; "
        f"NCCL settings {json.dumps(result['environment'])}",
    )
    try:
        found = gather(target, world, free_port(), opts)
    except RankFailed as exc:
        print(f"{PREFIX} {exc}", file=sys.stderr)
        return 3
    missing = sorted(set(range(world)) - set(found))
    if missing:
        print(f"{PREFIX} rank(s) {missing} returned no result", file=sys.stderr)
        return 2
    rows = combine(found, world)
    result.update(
        measured=True,
        single_rank=world == 1,
        environment_after_init=found[0][1],
        iters=args.iters,
        sizes=rows,
        correct=all(row["correct"] for row in rows),
        latency_us=rows[0]["latency_us"],
        latency_bytes=rows[0]["bytes"],
    )
    for row in rows:
        verdict = "sum correct" if row["correct"] else f"WRONG SUM: {row['error']}"
        say(
            args,
            f"{row['bytes']:>9} B  {row['latency_us']:>9.2f} us  (ranks: {', '.join(map(str, row['per_rank_us']))})"
            f"  busbw {row['busbw_gbps']} GB/s  {verdict}",
        )
    if world == 1:
        say(args, "a world of one GPU: this times the path, it is no all-reduce across GPUs")
    if any(row["graph_empty"] for row in rows):
        say(args, "the captured graph is empty (no kernel was launched to capture): its time is no all-reduce's")
        result["latency_us"] = None
    if not result["correct"]:
        say(args, "the all-reduce gave a wrong sum: no latency is reported for the ceiling")
        result["latency_us"] = None
    return finish(args, result)


if __name__ == "__main__":
    sys.exit(main())
