"""A simulated PCI driver core on a plain directory tree, for tests and the local lab.

The tree looks like the kernel's (``bus/pci/devices/<bdf>`` links to ``devices/pci0000:00/<bdf>``, each with
``vendor``, ``class``, ``driver_override``, ``numa_node``, ``iommu_group`` and ``driver`` links), and
``FakeKernel.write`` behaves like sysfs does for the files gpu-switch writes:

- ``driver_override``: stored; writing it never unbinds; an empty value clears it;
- ``drivers/<drv>/unbind``: fails with ENODEV unless the function is bound to that driver;
- ``drivers/<drv>/bind``: ENODEV for an unknown device or one the driver does not match (an override for
  another driver, or not its native driver), EBUSY if already bound;
- ``drivers_probe``: binds an unbound function to its override if that driver is loaded, else to its
  native driver; ENODEV for an unknown device;
- ``new_id``/``remove_id`` and every other file: refused (gpu-switch must never use them);
- a path marked hung blocks forever, as a stuck unbind does;
- binding ``nvidia`` creates ``/proc/driver/nvidia/gpus/<bdf>/information`` and ``/dev/nvidiaN``.

Its metadata (native drivers, minors, hung paths, latency) lives in ``<sysfs>/.fakekernel.json`` so that
another process (the gpu-switch command in the lab) can open the same simulated kernel.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import signal
import threading
import time

from .entries import parse_dev, parse_hostpci
from .errors import ApiError, TaskFailed
from .pve import label
from .system import Completed

META = ".fakekernel.json"
HOST_STATE = ".fakehost.json"


def _err(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


class FakeKernel:
    def __init__(self, sysfs: str, proc: str, dev: str):
        self.root, self.proc, self.dev = sysfs, proc, dev
        self._lock = threading.Lock()
        self.writes: list[tuple[str, str]] = []
        self.meta = {"devices": {}, "hang": [], "latency": 0.0, "crash_after_writes": None, "write_count": 0}
        self._load()

    # ------------------------------------------------------------- building

    @classmethod
    def create(cls, sysfs: str, proc: str, dev: str, boot_id: str = "11111111-2222-3333-4444-555555555555"):
        for path in (
            os.path.join(sysfs, "bus", "pci", "devices"),
            os.path.join(sysfs, "bus", "pci", "drivers"),
            os.path.join(sysfs, "kernel", "iommu_groups"),
            os.path.join(sysfs, "devices", "pci0000:00"),
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
        bdf: str,
        *,
        vendor: str = "0x10de",
        device: str = "0x2bb5",
        pci_class: str = "0x030000",
        group: int | None = None,
        numa: int = -1,
        native: str | None = None,
        driver: str | None = None,
        minor: int | None = None,
    ) -> None:
        real = os.path.join(self.root, "devices", "pci0000:00", bdf)
        os.makedirs(real, exist_ok=True)
        for attr, value in (
            ("vendor", vendor),
            ("device", device),
            ("class", pci_class),
            ("numa_node", str(numa)),
            ("driver_override", "(null)"),
        ):
            with open(os.path.join(real, attr), "w") as fh:
                fh.write(value + "\n")
        os.symlink(f"../../../devices/pci0000:00/{bdf}", os.path.join(self.root, "bus", "pci", "devices", bdf))
        if group is not None:
            gdir = os.path.join(self.root, "kernel", "iommu_groups", str(group), "devices")
            os.makedirs(gdir, exist_ok=True)
            os.symlink(f"../../../../devices/pci0000:00/{bdf}", os.path.join(gdir, bdf))
            os.symlink(f"../../../kernel/iommu_groups/{group}", os.path.join(real, "iommu_group"))
        self.meta["devices"][bdf] = {"native": native, "minor": minor}
        self._save()
        if driver:
            self._bind(bdf, driver)

    def add_gpu(
        self,
        bus: int,
        *,
        group: int | None = None,
        numa: int = 0,
        minor: int | None = None,
        functions: int = 2,
        host_driver: str = "nvidia",
        driver: str | None = "nvidia",
    ) -> str:
        """A GPU at 0000:<bus>:00.0 with an audio function (and more), in one IOMMU group."""
        base = f"0000:{bus:02x}:00"
        group = bus if group is None else group
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
        for bdf in sorted(self.meta["devices"]):
            driver = self.driver_of(bdf)
            if driver:
                self._unbind(bdf, driver)
            with open(os.path.join(self._dev(bdf), "driver_override"), "w") as fh:
                fh.write("(null)\n")
        for bdf in sorted(self.meta["devices"]):
            native = self.meta["devices"][bdf].get("native")
            if self._loaded(native):
                self._bind(bdf, native)
        with open(os.path.join(self.proc, "sys", "kernel", "random", "boot_id"), "w") as fh:
            fh.write(boot_id + "\n")

    # -------------------------------------------------------------- state

    def _dev(self, bdf: str) -> str:
        return os.path.join(self.root, "devices", "pci0000:00", bdf)

    def _loaded(self, driver: str | None) -> bool:
        return bool(driver) and os.path.isdir(os.path.join(self.root, "bus", "pci", "drivers", driver))

    def driver_of(self, bdf: str) -> str | None:
        try:
            return os.path.basename(os.readlink(os.path.join(self._dev(bdf), "driver")))
        except OSError:
            return None

    def override_of(self, bdf: str) -> str | None:
        with open(os.path.join(self._dev(bdf), "driver_override")) as fh:
            value = fh.read().strip()
        return None if value == "(null)" else value

    def _bind(self, bdf: str, driver: str) -> None:
        os.symlink(f"../../../bus/pci/drivers/{driver}", os.path.join(self._dev(bdf), "driver"))
        os.symlink(
            f"../../../../devices/pci0000:00/{bdf}", os.path.join(self.root, "bus", "pci", "drivers", driver, bdf)
        )
        minor = self.meta["devices"].get(bdf, {}).get("minor")
        if driver == "nvidia" and minor is not None:
            info = os.path.join(self.proc, "driver", "nvidia", "gpus", bdf)
            os.makedirs(info, exist_ok=True)
            with open(os.path.join(info, "information"), "w") as fh:
                fh.write(
                    f"Model: \t\t NVIDIA RTX PRO 6000 Blackwell Server Edition\nBus Location: \t {bdf}\n"
                    f"Device Minor: \t {minor}\n"
                )
            open(os.path.join(self.dev, f"nvidia{minor}"), "a").close()

    def _unbind(self, bdf: str, driver: str) -> None:
        os.unlink(os.path.join(self._dev(bdf), "driver"))
        os.unlink(os.path.join(self.root, "bus", "pci", "drivers", driver, bdf))
        if driver == "nvidia":
            info = os.path.join(self.proc, "driver", "nvidia", "gpus", bdf)
            if os.path.isdir(info):
                os.unlink(os.path.join(info, "information"))
                os.rmdir(info)

    # -------------------------------------------------------------- writes

    def write(self, path: str, value: str) -> None:
        """What the kernel does for a write of value to path (absolute, inside the sysfs root)."""
        root = os.path.realpath(self.root)
        real = os.path.realpath(path)
        rel = os.path.relpath(real, root)
        if any(h == rel and v in (None, value.strip()) for h, v in self.meta["hang"]):
            threading.Event().wait()  # as a write stuck in the kernel: the caller's timeout gives up on it
        if self.meta.get("latency"):
            time.sleep(self.meta["latency"])
        with self._lock:
            self.writes.append((rel, value.strip()))
            self._apply(rel, real, value.strip())
            self._count()

    def _count(self) -> None:
        if self.meta.get("crash_after_writes") is None:
            return
        self._load()
        self.meta["write_count"] = self.meta.get("write_count", 0) + 1
        self._save()
        if self.meta["write_count"] >= self.meta["crash_after_writes"]:
            os.kill(os.getpid(), signal.SIGKILL)

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

    def _probe(self, real: str, bdf: str) -> None:
        if bdf not in self.meta["devices"]:
            raise _err(errno.ENODEV, real)
        if self.driver_of(bdf) is None:
            override = self.override_of(bdf)
            choice = override if override else self.meta["devices"][bdf].get("native")
            if self._loaded(choice):
                self._bind(bdf, choice)

    def _driver_attr(self, real: str, driver: str, attr: str, bdf: str) -> None:
        if bdf not in self.meta["devices"]:
            raise _err(errno.ENODEV, real)
        if attr == "unbind":
            if self.driver_of(bdf) != driver:
                raise _err(errno.ENODEV, real)
            self._unbind(bdf, driver)
            return
        if self.driver_of(bdf) is not None:
            raise _err(errno.EBUSY, real)
        override = self.override_of(bdf)
        if (override and override != driver) or (not override and self.meta["devices"][bdf].get("native") != driver):
            raise _err(errno.ENODEV, real)
        self._bind(bdf, driver)


class FakeHost:
    """systemctl, modprobe and nvidia-modprobe as a simulated host answers them: units are active or not (kept in
    a JSON file when a path is given, so separate gpu-switch processes see the same state); every call is recorded.
    The lab and the tests use it so that a simulated move never touches the real host's services."""

    def __init__(self, state_path: str | None = None, active=("nvidia-persistenced.service",)):
        self.state_path = state_path
        self.calls: list[list[str]] = []
        self._active = set(active)
        if state_path and os.path.exists(state_path):
            with open(state_path, encoding="utf-8") as fh:
                self._active = set(json.load(fh).get("active", []))

    @classmethod
    def for_tree(cls, sysfs: str) -> FakeHost:
        return cls(os.path.join(sysfs, HOST_STATE))

    @property
    def active(self) -> set[str]:
        return self._active

    @active.setter
    def active(self, units) -> None:
        self._active = set(units)
        self._save()

    def _save(self) -> None:
        if self.state_path:
            with open(self.state_path, "w", encoding="utf-8") as fh:
                json.dump({"active": sorted(self._active)}, fh)

    def run(self, argv, timeout):
        self.calls.append(list(argv))
        if argv[:2] == ["systemctl", "is-active"]:
            return Completed(0 if argv[-1] in self._active else 3)
        if argv[:2] == ["systemctl", "stop"]:
            self._active.discard(argv[-1])
            self._save()
        elif argv[:2] == ["systemctl", "start"]:
            self._active.add(argv[-1])
            self._save()
        return Completed(0)


def build(root: str, gpus: int, functions: int = 2) -> list[str]:
    """A simulated host under root (sys/, proc/, dev/): GPUs on nvidia with an audio function each, one IOMMU
    group per GPU, the first half on NUMA node 0. Returns the GPU addresses. Used by the lab and molecule."""
    sysfs, proc, dev = (os.path.join(root, n) for n in ("sys", "proc", "dev"))
    kernel = FakeKernel.create(sysfs, proc, dev)
    for driver in ("nvidia", "vfio-pci", "snd_hda_intel", "xhci_hcd"):
        kernel.add_driver(driver)
    return [
        kernel.add_gpu(n + 1, numa=0 if n < max(gpus // 2, 1) else 1, minor=n, functions=functions) for n in range(gpus)
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m gpu_switch.fakesys", description="Build a simulated GPU host tree.")
    p.add_argument("--root", required=True, help="directory to create (sys/, proc/, dev/ inside)")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--functions", type=int, default=2)
    args = p.parse_args(argv)
    if os.path.exists(os.path.join(args.root, "sys", META)):
        print(json.dumps({"changed": False}))
        return 0
    addresses = build(args.root, args.gpus, args.functions)
    print(json.dumps({"changed": True, "gpus": addresses}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


class FakeApi:
    """The Proxmox API as gpu-switch uses it (PveApi's methods), in memory, for unit tests and the benchmark.
    Starting a guest checks what PVE and the hookscript would: the container's device nodes exist, no GPU
    function is on vfio-pci for the container, every hostpciN function is on vfio-pci for the VM."""

    def __init__(self, kernel: FakeKernel, container_vmid: int = 101, vm_vmid: int = 201):
        self.kernel = kernel
        self.guests = {
            ("lxc", container_vmid): {"status": "running", "config": {"hostname": "ct", "memory": 4096}},
            ("qemu", vm_vmid): {
                "status": "stopped",
                "config": {"name": "vm", "machine": "q35", "scsi0": "local-lvm:vm-201-disk-0"},
            },
        }
        self.calls: list[tuple] = []
        self.slow_shutdown: set[tuple] = set()  # (kind, vmid) whose shutdown times out
        self.fail_start: dict[tuple, str] = {}  # (kind, vmid) -> the start task's error
        self.fail_set_config: dict[tuple, Exception] = {}
        self.down = False

    def _guest(self, kind, vmid):
        if self.down:
            raise ApiError("Proxmox API at 127.0.0.1:8006 unreachable")
        return self.guests[(kind, vmid)]

    def status(self, kind, vmid):
        return self._guest(kind, vmid)["status"]

    def config(self, kind, vmid):
        guest = self._guest(kind, vmid)
        digest = hashlib.sha1(json.dumps(guest["config"], sort_keys=True).encode()).hexdigest()
        return dict(guest["config"], digest=digest)

    def set_config(self, kind, vmid, values, delete=None, digest=None):
        self.calls.append(("set_config", kind, vmid, dict(values), list(delete or [])))
        if (kind, vmid) in self.fail_set_config:
            raise self.fail_set_config[(kind, vmid)]
        guest = self._guest(kind, vmid)
        if digest and digest != self.config(kind, vmid)["digest"]:
            raise ApiError("checksum mismatch (file change by other user?)", 500)
        guest["config"].update(values)
        for key in delete or []:
            guest["config"].pop(key, None)

    def act(self, kind, vmid, action, want, wait_timeout, **params):
        self.calls.append((action, kind, vmid, params))
        guest = self._guest(kind, vmid)
        what = f"{action} {label(kind, vmid)}"
        if action == "shutdown":
            if guest["status"] != "running":
                raise TaskFailed(f"{what}: task failed: not running", "UPID:fake", "not running")
            if (kind, vmid) in self.slow_shutdown:
                status = "container did not stop" if kind == "lxc" else "VM quit/powerdown failed - got timeout"
                raise TaskFailed(f"{what}: task failed: {status}", "UPID:fake", status)
            guest["status"] = "stopped"
        elif action == "stop":
            guest["status"] = "stopped"
        elif action == "start":
            if guest["status"] == "running":
                raise TaskFailed(f"{what}: task failed: already running", "UPID:fake", "already running")
            error = self.fail_start.get((kind, vmid)) or self._start_error(kind, guest)
            if error:
                raise TaskFailed(f"{what}: task failed: {error}", "UPID:fake", error)
            guest["status"] = "running"

    def _start_error(self, kind, guest) -> str | None:
        devices = self.kernel.meta["devices"]
        if kind == "lxc":
            for key, value in guest["config"].items():
                if key.startswith("dev") and key[3:].isdigit():
                    path = parse_dev(value)["path"]
                    if not os.path.exists(os.path.join(self.kernel.dev, path[len("/dev/") :])):
                        return f"Device {path} does not exist"
            if any(self.kernel.driver_of(b) == "vfio-pci" for b in devices):
                return "hookscript error for 101 on pre-start: exit code 1 (GPU functions on vfio-pci)"
            return None
        for key, value in guest["config"].items():
            if key.startswith("hostpci"):
                for slot in parse_hostpci(value)["host"]:
                    stray = [b for b in devices if b.startswith(slot) and self.kernel.driver_of(b) != "vfio-pci"]
                    if stray:
                        return f"hookscript error on pre-start: {stray[0]} is not on vfio-pci"
        return None
