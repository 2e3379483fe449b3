#!/usr/bin/env python3
"""gpu-switch's own overhead for a full move of 8 GPUs (2 functions each) on the simulated kernel, sequential
versus parallel rebinding. Not a test: it prints figures, with the ratio measured in the same run.

    .venv/bin/python scripts/gpu-switch-bench.py [--gpus 8] [--rounds 5] [--latency-ms 0 20]

Each round moves the GPUs to the VM and back (two full moves) with an in-memory Proxmox API that answers at
once, so the time is the tool's own: reading sysfs and /proc, planning, the journal (written and fsynced
before every sysfs write), the timed writes. --latency-ms adds a simulated kernel time to every sysfs write
(a real nvidia unbind takes far longer), which is where parallel rebinding pays off.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir, "plugins", "module_utils"))

from gpu_switch.config import parse_config  # noqa: E402 - the path above must come first
from gpu_switch.switch import Switcher  # noqa: E402
from gpu_switch.system import Host  # noqa: E402

from inferhost.sim.gpu_api import FakeApi, ThreadWriter  # noqa: E402
from inferhost.sim.gpu_host import FakeHost  # noqa: E402
from inferhost.sim.gpu_kernel import FakeKernel, build  # noqa: E402


def one_round(gpus: int, parallel: bool, latency: float) -> tuple[float, int]:
    """Seconds per move (mean of to-vm and to-ct) and sysfs writes per move."""
    with tempfile.TemporaryDirectory(prefix="gpu-switch-bench-") as root:
        addresses = build(root, gpus)
        kernel = FakeKernel.open(f"{root}/sys", f"{root}/proc", f"{root}/dev")
        kernel.set_latency(latency)
        data = {
            "proxmox": {"node": "pve1", "password_file": f"{root}/password"},
            "container": {"vmid": 101},
            "vm": {"vmid": 201},
            "gpus": addresses,
            "roots": {
                n: f"{root}/{d}" for n, d in (("sysfs", "sys"), ("proc", "proc"), ("dev", "dev"), ("run", "run"))
            },
            "parallel": parallel,
        }
        config = parse_config(data, environ={})
        api, host = FakeApi(kernel), FakeHost()
        api.guests[("lxc", 101)]["config"].update(
            {f"dev{n}": f"/dev/nvidia{n}" for n in range(gpus)}
            | {f"dev{gpus}": "/dev/nvidiactl", f"dev{gpus + 1}": "/dev/nvidia-uvm"}
        )
        elapsed = 0.0
        for target in ("vm", "ct"):
            switcher = Switcher(config, api=api, writer=ThreadWriter(kernel.write), host=Host(host.run, 5))
            start = time.perf_counter()
            outcome = switcher.move(target)
            elapsed += time.perf_counter() - start
            if outcome.exit_code:
                raise SystemExit(f"benchmark move to {target} failed: {outcome.reason}")
        return elapsed / 2, len(kernel.writes) // 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 20.0])
    args = p.parse_args(argv)
    print(
        f"gpu-switch: full move of {args.gpus} GPUs x 2 functions, simulated kernel, in-memory API, "
        f"median of {args.rounds} rounds (each round: to-vm + to-ct)"
    )
    print(
        f"{'kernel ms/write':>15} {'writes/move':>11} {'sequential s':>12} {'parallel s':>10} "
        f"{'seq/par':>7} {'overhead ms/write':>17}"
    )
    for latency_ms in args.latency_ms:
        runs = {
            mode: [one_round(args.gpus, mode, latency_ms / 1000) for _ in range(args.rounds)] for mode in (False, True)
        }
        seq = statistics.median(t for t, _ in runs[False])
        par = statistics.median(t for t, _ in runs[True])
        writes = runs[False][0][1]
        overhead = (seq - writes * latency_ms / 1000) / writes * 1000
        print(f"{latency_ms:>15g} {writes:>11} {seq:>12.3f} {par:>10.3f} {seq / par:>7.2f} {overhead:>17.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
