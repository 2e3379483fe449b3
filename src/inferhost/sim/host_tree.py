#!/usr/bin/env python3
"""Build a fake Proxmox host tree (sys/, proc/, lib/modules/) as the kernel lays it out.

Used by the unit tests (imported) and by the molecule scenario (run on the test container, beside
gpu_kernel.py: ``host_tree.py ROOT SPEC.json``) to drive the host role's checks through pass and fail cases.
The PCI part is the driver core model's (gpu_kernel.FakeKernel), so a tree built here and the simulated
GPUs that gpu-switch moves are laid out by the same code.

SPEC (JSON), every key optional::

    {"gpus": [{"address": "0000:01:00.0", "group": 10, "numa": 0, "driver": "nvidia", "minor": 0,
               "device": "0x2bb5", "audio": true}],
     "others": [{"address": "0000:00:01.1", "class": "0x060400", "vendor": "0x1022", "group": 10,
                 "driver": "pcieport"}],
     "secure_boot": null | false | true,          # null: legacy BIOS boot (no firmware/efi)
     "modules": {"nvidia_uvm": {"version": null, "parameters": {"uvm_disable_hmm": "Y"}}},
     "swaps": ["/dev/zd0"],
     "cpu_vendor": "AuthenticAMD",
     "cmdline": "BOOT_IMAGE=... iommu=pt",
     "kernels": {"6.8.12-9-pve": true}}          # true: the nvidia module is built for it
"""

import json
import os
import sys

try:
    from .gpu_kernel import FakeKernel
except ImportError:  # pragma: no cover - run as a script next to gpu_kernel.py
    from gpu_kernel import FakeKernel

EFI_GLOBAL = "8be4df61-93ca-11d2-aa0d-00e098032b8c"


def _write(path, text, mode="w"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as fh:
        fh.write(text)


def build(root, spec):
    sysfs, proc = os.path.join(root, "sys"), os.path.join(root, "proc")
    # The PCI functions, their drivers and IOMMU groups, and /proc/driver/nvidia: the driver core model's.
    kernel = FakeKernel.create(sysfs, proc, os.path.join(root, "dev"))
    functions = []
    for gpu in spec.get("gpus", []):
        place = {"group": gpu.get("group"), "numa": gpu.get("numa", -1)}
        functions.append(
            (
                gpu["address"],
                dict(place, device=gpu.get("device", "0x2bb5"), pci_class=gpu.get("class", "0x030200")),
                gpu.get("driver"),
                gpu.get("minor"),
            )
        )
        if gpu.get("audio", True):
            audio = dict(place, device="0x22e8", pci_class="0x040300")
            functions.append((gpu["address"][:-1] + "1", audio, gpu.get("audio_driver", "snd_hda_intel"), None))
    for other in spec.get("others", []):
        ids = {"vendor": other.get("vendor", "0x8086"), "device": other.get("device", "0x1234")}
        place = {"group": other.get("group"), "numa": other.get("numa", -1)}
        attrs = dict(place, pci_class=other.get("class", "0x020000"), **ids)
        functions.append((other["address"], attrs, other.get("driver"), None))
    for driver in sorted({driver for _, _, driver, _ in functions if driver}):
        kernel.add_driver(driver)
    for address, attrs, driver, minor in functions:
        kernel.add_device(address, native=driver, driver=driver, minor=minor, **attrs)
    secure_boot = spec.get("secure_boot", False)
    if secure_boot is not None:
        _write(
            os.path.join(sysfs, "firmware", "efi", "efivars", "SecureBoot-" + EFI_GLOBAL),
            bytes([6, 0, 0, 0, 1 if secure_boot else 0]),
            "wb",
        )
    for name, module in spec.get("modules", {}).items():
        base = os.path.join(sysfs, "module", name)
        os.makedirs(os.path.join(base, "parameters"), exist_ok=True)
        if module.get("version"):
            _write(os.path.join(base, "version"), module["version"] + "\n")
        for param, value in module.get("parameters", {}).items():
            _write(os.path.join(base, "parameters", param), str(value) + "\n")
    lines = ["Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority"]
    lines += [f"{s}\t\t\t\tpartition\t8388604\t\t0\t\t-2" for s in spec.get("swaps", [])]
    _write(os.path.join(proc, "swaps"), "\n".join(lines) + "\n")
    _write(os.path.join(proc, "cmdline"), spec.get("cmdline", "BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro") + "\n")
    _write(
        os.path.join(proc, "cpuinfo"),
        "processor\t: 0\nvendor_id\t: {}\n".format(spec.get("cpu_vendor", "AuthenticAMD")),
    )
    for kernel, built in spec.get("kernels", {}).items():
        base = os.path.join(root, "lib", "modules", kernel)
        os.makedirs(base, exist_ok=True)
        if built:
            _write(os.path.join(base, "updates", "dkms", "nvidia.ko.xz"), "stand-in\n")
    return root


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: host_tree.py ROOT SPEC.json\n")
        return 2
    with open(argv[2]) as fh:
        build(argv[1], json.load(fh))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
