"""The simulated PCI driver core: a model of what the kernel does for the sysfs files gpu-switch writes.

The model keeps its tree on a plain directory, shaped as the kernel's (``bus/pci/devices/<address>`` links to
``devices/pci0000:00/<address>``, each with ``vendor``, ``class``, ``driver_override``, ``numa_node``,
``iommu_group`` and ``driver`` links), and ``FakeKernel.write`` answers a write as sysfs does:

- ``driver_override``: stored; writing it never unbinds; an empty value clears it;
- ``drivers/<drv>/unbind``: fails with ENODEV unless the function is bound to that driver;
- ``drivers/<drv>/bind``: ENODEV for an unknown device or one the driver does not match (an override for
  another driver, or not its native driver), EBUSY if already bound;
- ``drivers_probe``: binds an unbound function to its override if that driver is loaded, else to its
  native driver; ENODEV for an unknown device;
- ``new_id``/``remove_id`` and every other file: refused (gpu-switch must never use them);
- a path marked hung blocks forever, as a stuck unbind does;
- binding ``nvidia`` creates ``/proc/driver/nvidia/gpus/<address>/information`` and ``/dev/nvidiaN``.

Two ways in: the unit tests call ``write`` in-process (through ``ThreadWriter``, the seam gpu-switch's
Switcher takes), and ``gpu_fuse`` serves the tree as a FUSE filesystem whose writes reach the same model,
so that the real gpu-switch command, with its child-process writes, runs unchanged over it (the lab's host
machine, molecule, the command-line tests). Its metadata (native drivers, minors, hung paths, latency, the
crash trigger) lives in ``<sysfs>/.fakekernel.json`` and is read again before every write, so that a test
in another process can change it. This file needs nothing but the standard library: the lab copies it onto
its host machine.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable

META = ".fakekernel.json"


def _err(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


class FakeKernel:
    def __init__(self, sysfs: str, proc: str, dev: str, on_crash: Callable[[], None] | None = None):
        self.root, self.proc, self.dev = sysfs, proc, dev
        # What "the writing process dies" means: this process (in-process tests), or the FUSE caller.
        self.on_crash = on_crash or (lambda: os.kill(os.getpid(), signal.SIGKILL))
        self._lock = threading.Lock()
        self.meta = {
            "devices": {},
            "hang": [],
            "latency": 0.0,
            "crash_after_writes": None,
            "write_count": 0,
            "writes": [],
        }
        self._load()

    # ------------------------------------------------------------- building

    @classmethod
    def create(cls, sysfs: str, proc: str, dev: str, boot_id: str = "11111111-2222-3333-4444-555555555555"):
        for path in (
            os.path.join(sysfs, "bus", "pci", "devices"),
            os.path.join(sysfs, "bus", "pci", "drivers"),
            os.path.join(sysfs, "kernel", "iommu_groups"),
            os.path.join(sysfs, "devices", "pci0000:00"),
            os.path.join(sysfs, "module"),
            os.path.join(proc, "sys", "kernel", "random"),
            dev,
        ):
            os.makedirs(path, exist_ok=True)
        open(os.path.join(sysfs, "bus", "pci", "drivers_probe"), "w").close()
        with open(os.path.join(proc, "sys", "kernel", "random", "boot_id"), "w") as fh:
            fh.write(boot_id + "\n")
        with open(os.path.join(proc, "devices"), "w") as fh:
            fh.write(
                "Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n"
                "234 nvidia-caps\n507 nvidia-uvm\n\nBlock devices:\n  8 sd\n"
            )
        for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
            open(os.path.join(dev, name), "w").close()
        kernel = cls(sysfs, proc, dev)
        kernel._save()
        return kernel

    @classmethod
    def open(cls, sysfs: str, proc: str, dev: str) -> FakeKernel:
        if not os.path.exists(os.path.join(sysfs, META)):
            raise FileNotFoundError(f"{sysfs} is not a simulated sysfs tree (no {META})")
        return cls(sysfs, proc, dev)

    @property
    def writes(self) -> list[tuple[str, str]]:
        """Every write the model answered, from any process: (path relative to the sysfs root, value)."""
        self._load()
        return [tuple(w) for w in self.meta["writes"]]

    def _load(self) -> None:
        try:
            with open(os.path.join(self.root, META), encoding="utf-8") as fh:
                self.meta.update(json.load(fh))
        except FileNotFoundError:
            pass

    def _save(self) -> None:
        tmp = os.path.join(self.root, META + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.meta, fh, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(self.root, META))

    def add_driver(self, name: str) -> None:
        path = os.path.join(self.root, "bus", "pci", "drivers", name)
        os.makedirs(path, exist_ok=True)
        for attr in ("bind", "unbind", "new_id", "remove_id"):
            open(os.path.join(path, attr), "a").close()

    def remove_driver(self, name: str) -> None:
        """Unload a driver module (only when nothing is bound to it)."""
        path = os.path.join(self.root, "bus", "pci", "drivers", name)
        if any(":" in e for e in os.listdir(path)):
            raise RuntimeError(f"{name} still has devices bound")
        for entry in os.listdir(path):
            os.unlink(os.path.join(path, entry))
        os.rmdir(path)

    def add_device(
        self,
        address: str,
        *,
        vendor: str = "0x10de",
        device: str = "0x2bb5",
        pci_class: str = "0x030000",
        group: int | None = None,
        numa: int = -1,
        native: str | None = None,
        driver: str | None = None,
        minor: int | None = None,
        subsystem_vendor: str = "0x10de",
        subsystem_device: str = "0x204b",
    ) -> None:
        real = os.path.join(self.root, "devices", "pci0000:00", address)
        os.makedirs(real, exist_ok=True)
        for attr, value in (
            ("vendor", vendor),
            ("device", device),
            # The board's maker and model, which a PVE PCI mapping holds as subsystem-id.
            ("subsystem_vendor", subsystem_vendor),
            ("subsystem_device", subsystem_device),
            ("class", pci_class),
            ("numa_node", str(numa)),
            ("driver_override", "(null)"),
        ):
            with open(os.path.join(real, attr), "w") as fh:
                fh.write(value + "\n")
        os.symlink(f"../../../devices/pci0000:00/{address}", os.path.join(self.root, "bus", "pci", "devices", address))
        if group is not None:
            gdir = os.path.join(self.root, "kernel", "iommu_groups", str(group), "devices")
            os.makedirs(gdir, exist_ok=True)
            os.symlink(f"../../../../devices/pci0000:00/{address}", os.path.join(gdir, address))
            os.symlink(f"../../../kernel/iommu_groups/{group}", os.path.join(real, "iommu_group"))
        self.meta["devices"][address] = {"native": native, "minor": minor}
        self._save()
        if driver:
            self._bind(address, driver)

    def add_gpu(
        self,
        bus: int | str,
        *,
        group: int | None = None,
        numa: int = 0,
        minor: int | None = None,
        functions: int = 2,
        host_driver: str = "nvidia",
        driver: str | None = "nvidia",
    ) -> str:
        """A GPU at 0000:<bus>:00.0 (or at the address given) with an audio function (and more), in one
        IOMMU group (numbered after the bus unless given)."""
        base = f"0000:{bus:02x}:00" if isinstance(bus, int) else bus.rsplit(".", 1)[0]
        if len(base) == 7:  # bb:dd.f without the domain
            base = "0000:" + base
        group = int(base.split(":")[1], 16) if group is None else group
        self.add_device(f"{base}.0", group=group, numa=numa, native=host_driver, driver=driver, minor=minor)
        kinds = [("0x040300", "snd_hda_intel"), ("0x0c0330", "xhci_hcd"), ("0x0c8000", "nvidia-ucsi")]
        for n in range(1, functions):
            cls, native = kinds[(n - 1) % len(kinds)]
            bound = None if driver is None else ("vfio-pci" if driver == "vfio-pci" else native)
            self.add_device(
                f"{base}.{n}",
                device="0x22e8",
                pci_class=cls,
                group=group,
                numa=numa,
                native=native,
                driver=bound if self._loaded(bound) else None,
            )
        return f"{base}.0"

    def hang(self, rel: str, value: str | None = None) -> None:
        """Every write to this path (relative to the sysfs root), or of this value to it, blocks forever."""
        self.meta["hang"].append([rel, value])
        self._save()

    def unhang(self) -> None:
        self.meta["hang"] = []
        self._save()

    def set_latency(self, seconds: float) -> None:
        self.meta["latency"] = seconds
        self._save()

    def crash_after(self, writes: int | None) -> None:
        """SIGKILL the writing process after this many more writes (for crash tests in a child process)."""
        self.meta["crash_after_writes"] = writes
        self.meta["write_count"] = 0
        self._save()

    def reboot(self, boot_id: str) -> None:
        """What a host reboot does to the tree: a new boot id, overrides gone, every function probed afresh."""
        self.unhang()
        for address in sorted(self.meta["devices"]):
            driver = self.driver_of(address)
            if driver:
                self._unbind(address, driver)
            with open(os.path.join(self._dev(address), "driver_override"), "w") as fh:
                fh.write("(null)\n")
        for address in sorted(self.meta["devices"]):
            native = self.meta["devices"][address].get("native")
            if self._loaded(native):
                self._bind(address, native)
        with open(os.path.join(self.proc, "sys", "kernel", "random", "boot_id"), "w") as fh:
            fh.write(boot_id + "\n")

    def load_module(self, name: str, version: str | None) -> None:
        """What a loaded module shows in sysfs: /sys/module/<name>/version. None: the module is not loaded."""
        base = os.path.join(self.root, "module", name)
        if version is None:
            shutil.rmtree(base, ignore_errors=True)
            return
        os.makedirs(base, exist_ok=True)
        with open(os.path.join(base, "version"), "w") as fh:
            fh.write(version + "\n")

    # -------------------------------------------------------------- state

    def _dev(self, address: str) -> str:
        return os.path.join(self.root, "devices", "pci0000:00", address)

    def _loaded(self, driver: str | None) -> bool:
        return bool(driver) and os.path.isdir(os.path.join(self.root, "bus", "pci", "drivers", driver))

    def driver_of(self, address: str) -> str | None:
        try:
            return os.path.basename(os.readlink(os.path.join(self._dev(address), "driver")))
        except OSError:
            return None

    def override_of(self, address: str) -> str | None:
        with open(os.path.join(self._dev(address), "driver_override")) as fh:
            value = fh.read().strip()
        return None if value == "(null)" else value

    def _bind(self, address: str, driver: str) -> None:
        os.symlink(f"../../../bus/pci/drivers/{driver}", os.path.join(self._dev(address), "driver"))
        link = os.path.join(self.root, "bus", "pci", "drivers", driver, address)
        os.symlink(f"../../../../devices/pci0000:00/{address}", link)
        minor = self.meta["devices"].get(address, {}).get("minor")
        if driver == "nvidia" and minor is not None:
            info = os.path.join(self.proc, "driver", "nvidia", "gpus", address)
            os.makedirs(info, exist_ok=True)
            with open(os.path.join(info, "information"), "w") as fh:
                fh.write(
                    f"Model: \t\t NVIDIA RTX PRO 6000 Blackwell Server Edition\nBus Location: \t {address}\n"
                    f"Device Minor: \t {minor}\n"
                )
            open(os.path.join(self.dev, f"nvidia{minor}"), "a").close()

    def _unbind(self, address: str, driver: str) -> None:
        os.unlink(os.path.join(self._dev(address), "driver"))
        os.unlink(os.path.join(self.root, "bus", "pci", "drivers", driver, address))
        if driver == "nvidia":
            info = os.path.join(self.proc, "driver", "nvidia", "gpus", address)
            if os.path.isdir(info):
                os.unlink(os.path.join(info, "information"))
                os.rmdir(info)

    # -------------------------------------------------------------- writes

    def write(self, path: str, value: str) -> None:
        """What the kernel does for a write of value to path (absolute, inside the sysfs root)."""
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(self.root))
        value = value.strip()
        with self._lock:
            self._load()  # a test in another process may have changed the hung paths or the crash trigger
            hung = any(h == rel and v in (None, value) for h, v in self.meta["hang"])
            latency = self.meta.get("latency")
        if hung:
            threading.Event().wait()  # as a write stuck in the kernel: the caller's timeout gives up on it
        if latency:
            time.sleep(latency)
        with self._lock:
            self.meta["writes"].append([rel, value])
            crash = self.meta.get("crash_after_writes")
            try:
                self._apply(rel, os.path.realpath(path), value)
                if crash is not None:  # only a write the kernel answered counts
                    self.meta["write_count"] = self.meta.get("write_count", 0) + 1
            finally:
                self._save()
        if crash is not None and self.meta["write_count"] >= crash:
            self.on_crash()

    def _apply(self, rel: str, real: str, value: str) -> None:
        parts = rel.split(os.sep)
        if rel.startswith("..") or not os.path.exists(real):
            raise _err(errno.ENOENT, real)
        if parts[:2] == ["devices", "pci0000:00"] and len(parts) == 4 and parts[3] == "driver_override":
            with open(real, "w") as fh:
                fh.write((value or "(null)") + "\n")
        elif rel == os.path.join("bus", "pci", "drivers_probe"):
            self._probe(real, value)
        elif parts[:3] == ["bus", "pci", "drivers"] and len(parts) == 5 and parts[4] in ("bind", "unbind"):
            self._driver_attr(real, parts[3], parts[4], value)
        else:
            raise _err(errno.EPERM if parts[-1] in ("new_id", "remove_id") else errno.EACCES, real)

    def _probe(self, real: str, address: str) -> None:
        if address not in self.meta["devices"]:
            raise _err(errno.ENODEV, real)
        if self.driver_of(address) is None:
            override = self.override_of(address)
            choice = override if override else self.meta["devices"][address].get("native")
            if self._loaded(choice):
                self._bind(address, choice)

    def _driver_attr(self, real: str, driver: str, attr: str, address: str) -> None:
        if address not in self.meta["devices"]:
            raise _err(errno.ENODEV, real)
        if attr == "unbind":
            if self.driver_of(address) != driver:
                raise _err(errno.ENODEV, real)
            self._unbind(address, driver)
            return
        if self.driver_of(address) is not None:
            raise _err(errno.EBUSY, real)
        override = self.override_of(address)
        native = self.meta["devices"][address].get("native")
        if (override and override != driver) or (not override and native != driver):
            raise _err(errno.ENODEV, real)
        self._bind(address, driver)


def build(root: str, gpus: int | list, functions: int = 2, dev: str | None = None) -> list[str]:
    """A simulated host under root (sys/, proc/, and dev/ unless another device directory is given): GPUs
    on nvidia with an audio function each, one IOMMU group per GPU. gpus is a count (GPU n on bus n+1, the
    first half on NUMA node 0) or a list of {address, numa_node} (an inventory's inferhost_gpus). Returns the
    GPU addresses."""
    sysfs, proc = os.path.join(root, "sys"), os.path.join(root, "proc")
    kernel = FakeKernel.create(sysfs, proc, dev or os.path.join(root, "dev"))
    for driver in ("nvidia", "vfio-pci", "snd_hda_intel", "xhci_hcd"):
        kernel.add_driver(driver)
    if isinstance(gpus, int):
        gpus = [{"address": n + 1, "numa_node": 0 if n < max(gpus // 2, 1) else 1} for n in range(gpus)]
    return [
        kernel.add_gpu(gpu["address"], numa=int(gpu.get("numa_node", 0)), minor=n, functions=functions)
        for n, gpu in enumerate(gpus)
    ]
