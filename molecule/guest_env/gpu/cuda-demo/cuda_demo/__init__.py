"""Run the extension's kernel once and report what ran where."""

import torch

from ._ops import add_one, built_archs


def selftest(n=1 << 20):
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    add_one(x)
    torch.cuda.synchronize()
    ok = bool(torch.equal(x.cpu(), torch.arange(n, dtype=torch.float32) + 1))
    major, minor = torch.cuda.get_device_capability()
    return {
        "device": torch.cuda.get_device_name(),
        "capability": f"{major}.{minor}",
        "built_archs": built_archs,
        "torch": torch.__version__,
        "kernel_result_correct": ok,
    }


__all__ = ["add_one", "built_archs", "selftest"]
