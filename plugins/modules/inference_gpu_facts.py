#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: inference_gpu_facts
short_description: What the NVIDIA driver, its device nodes and CUDA look like from this machine
description:
  - Reads the loaded kernel module's version, the userspace driver library's version, what C(nvidia-smi)
    reports, which device nodes exist, and whether CUDA initialises (C(cuInit) through C(ctypes), in a child
    process with a timeout, so a hanging driver cannot hang the play).
  - Works on a Proxmox host, in an LXC container (where the kernel module is the host's) and in a VM.
  - Changes nothing.
version_added: "0.1.0"
author: inferhost contributors
options:
  device_paths:
    description: Device nodes to look for; default C(/dev/nvidiactl), C(/dev/nvidia-uvm) and every C(/dev/nvidia<N>).
    type: list
    elements: path
  cuda:
    description: Initialise CUDA and list the devices it sees.
    type: bool
    default: true
  cuda_timeout:
    description: Seconds CUDA initialisation may take.
    type: int
    default: 60
extends_documentation_fragment:
  - attributes.read_only
"""

EXAMPLES = r"""
- name: Read the driver and CUDA facts of the guest
  inference_gpu_facts:
  register: __gpu
"""

RETURN = r"""
kernel_module_version:
  description:
    - Version of the loaded nvidia kernel module (the host's, inside a container); null when none.
    - Read from C(/sys/module/nvidia/version), else C(/proc/driver/nvidia/version), else what the driver reports
      to nvidia-smi (sandboxes that hide both files).
  returned: always
  type: str
kernel_module_source:
  description: Where kernel_module_version was read.
  returned: always
  type: str
userspace_version:
  description: Version of the userspace driver library (libcuda.so.1); null when not installed.
  returned: always
  type: str
nvidia_smi:
  description: C(present), C(rc), C(error) and C(gpus) (index, name, pci_bus_id, driver_version, memory_used_mib).
  returned: always
  type: dict
device_nodes:
  description: Each device node and whether it exists.
  returned: always
  type: dict
cuda:
  description: C(init_rc) (0 is success), C(driver_api) (for example 13000), C(devices) (name, compute_capability).
  returned: when cuda is true
  type: dict
"""

CUDA_PROBE = r"""
import ctypes, json
out = {}
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    print(json.dumps({"init_rc": None, "error": str(exc)})); raise SystemExit
rc = cuda.cuInit(0)
out["init_rc"] = rc
if rc == 0:
    version = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(version))
    count = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(count))
    out["driver_api"] = version.value
    out["devices"] = []
    for i in range(count.value):
        dev = ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(dev), i)
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(name, 256, dev)
        major, minor = ctypes.c_int(), ctypes.c_int()
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
        cc = f"{major.value}.{minor.value}"
        out["devices"].append({"index": i, "name": name.value.decode(), "compute_capability": cc})
else:
    text = ctypes.c_char_p()
    cuda.cuGetErrorName(rc, ctypes.byref(text))
    out["error"] = (text.value or b"").decode() or f"CUresult {rc}"
print(json.dumps(out))
"""


def kernel_module_version(smi):
    """(version, where it was read): the module itself, or what the driver tells NVML through nvidia-smi."""
    try:
        with open("/sys/module/nvidia/version", encoding="utf-8") as handle:
            version = handle.read().strip()
            if version:
                return version, "/sys/module/nvidia/version"
    except OSError:
        pass
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as handle:
            match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", handle.read())
            if match:
                return match.group(1), "/proc/driver/nvidia/version"
    except OSError:
        pass
    versions = {gpu["driver_version"] for gpu in smi["gpus"]}
    if len(versions) == 1:
        return versions.pop(), "nvidia-smi"
    return None, None


# Where distributions and container runtimes put libcuda.so.1 (searched after ldconfig's cache).
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
)


def userspace_version(module):
    ldconfig = module.get_bin_path("ldconfig", opt_dirs=["/sbin", "/usr/sbin"])
    candidates = []
    if ldconfig:
        rc, out, _ = module.run_command([ldconfig, "-p"])
        candidates = [line.split("=>")[-1].strip() for line in out.splitlines() if "libcuda.so.1 " in line]
    directories = [*os.environ.get("LD_LIBRARY_PATH", "").split(":"), *LIBRARY_DIRS]
    candidates += [os.path.join(d, "libcuda.so.1") for d in directories if d]
    for path in candidates:
        match = re.search(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$", os.path.realpath(path))
        if match:
            return match.group(1)
    return None


def nvidia_smi(module):
    exe = module.get_bin_path("nvidia-smi")
    if not exe:
        return {"present": False, "rc": None, "gpus": [], "error": "nvidia-smi is not installed"}
    fields = "index,name,pci.bus_id,driver_version,memory.used"
    rc, out, err = module.run_command([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    gpus = []
    for line in out.splitlines() if rc == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5:
            gpus.append(
                {
                    "index": int(parts[0]),
                    "name": parts[1],
                    "pci_bus_id": parts[2],
                    "driver_version": parts[3],
                    "memory_used_mib": int(float(parts[4])) if parts[4].replace(".", "").isdigit() else None,
                }
            )
    return {"present": True, "rc": rc, "gpus": gpus, "error": (err or out).strip() if rc else ""}


def cuda_probe(timeout):
    try:
        done = subprocess.run(
            [sys.executable, "-c", CUDA_PROBE], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"init_rc": None, "error": f"cuInit did not return within {timeout} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"init_rc": None, "error": (done.stderr or done.stdout).strip()[-500:] or f"exit {done.returncode}"}
    return json.loads(lines[-1])


def main():
    module = AnsibleModule(
        argument_spec={
            "device_paths": {"type": "list", "elements": "path"},
            "cuda": {"type": "bool", "default": True},
            "cuda_timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    paths = module.params["device_paths"]
    if paths is None:
        numbered = sorted(glob.glob("/dev/nvidia[0-9]*"), key=lambda p: int(re.sub(r"\D", "", p) or 0))
        paths = ["/dev/nvidiactl", "/dev/nvidia-uvm", *numbered]
    smi = nvidia_smi(module)
    kernel, source = kernel_module_version(smi)
    result = {
        "changed": False,
        "kernel_module_version": kernel,
        "kernel_module_source": source,
        "userspace_version": userspace_version(module),
        "nvidia_smi": smi,
        "device_nodes": {path: os.path.exists(path) for path in paths},
    }
    if module.params["cuda"]:
        result["cuda"] = cuda_probe(module.params["cuda_timeout"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
