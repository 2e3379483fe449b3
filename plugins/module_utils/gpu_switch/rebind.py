"""Per-address rebinding of PCI functions: driver_override, unbind, drivers_probe.

Never by vendor:device id: all eight GPUs share one, so ``new_id`` would let the driver grab every twin.
Each write goes through a writer with a timeout; ``before_write`` is called first, so the journal always
names the write that may be in flight when the process dies.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .errors import RebindError, WriteTimeout
from .pci import Sysfs


class Rebinder:
    def __init__(
        self, sysfs: Sysfs, writer, timeout: float, before_write: Callable[[str, str, str], None] | None = None
    ):
        self.sysfs, self.writer, self.timeout = sysfs, writer, timeout
        self.before_write = before_write

    def _write(self, address: str, path: str, value: str) -> None:
        if self.before_write:
            self.before_write(address, path, value)
        try:
            self.writer.write(path, value, self.timeout)
        except WriteTimeout as exc:
            exc.address = address
            raise
        except OSError as exc:
            raise RebindError(f"{address}: writing {value.strip()!r} to {path} failed: {exc.strerror or exc}") from None

    def set_override(self, address: str, override: str | None) -> None:
        """Only this driver may bind the function from now on (None: any). Does not unbind."""
        if self.sysfs.override(address) != override:
            self._write(address, self.sysfs.path(address, "driver_override"), (override or "") + "\n")

    def unbind(self, address: str) -> None:
        driver = self.sysfs.driver(address)
        if driver is not None:
            self._write(address, os.path.join(self.sysfs.drivers, driver, "unbind"), address)

    def probe(self, address: str) -> None:
        self._write(address, os.path.join(os.path.dirname(self.sysfs.devices), "drivers_probe"), address)

    def _keep(self, address: str, override: str | None) -> bool:
        """The function stays on its driver; only its override is set. True if that changed it."""
        changed = self.sysfs.override(address) != override
        self.set_override(address, override)
        return changed

    def _reprobe(self, address: str) -> str | None:
        """Unbind the function and let drivers_probe bind it by its override: the driver it then has."""
        self.unbind(address)
        self.probe(address)
        return self.sysfs.driver(address)

    def bind(self, address: str, driver: str, final_override: str | None = None) -> bool:
        """Bind the function to exactly this driver; then leave final_override in place. True if changed."""
        if self.sysfs.driver(address) == driver:
            return self._keep(address, final_override)
        self.set_override(address, driver)
        now = self._reprobe(address)
        if now != driver:
            raise RebindError(
                f"{address}: bound to {now or 'no driver'} after drivers_probe, expected {driver}"
                f"{'' if self.sysfs.driver_loaded(driver) else f' (driver {driver} is not loaded)'}"
            )
        if final_override != driver:
            self.set_override(address, final_override)
        return True

    def release(self, address: str, away_from: str) -> bool:
        """Clear the override and let the kernel pick the function's native driver, as long as it is not
        away_from (used for the GPU's audio and USB functions on the way back to the host). True if changed."""
        current = self.sysfs.driver(address)
        if current is not None and current != away_from:
            return self._keep(address, None)
        self.set_override(address, None)
        now = self._reprobe(address)
        if now == away_from:
            raise RebindError(f"{address}: still bound to {away_from} after drivers_probe")
        return True

    def restore(self, address: str, driver: str | None, override: str | None) -> None:
        """Put the function back exactly as it was: its driver (or unbound) and its override."""
        if driver is None:
            self.set_override(address, override)
            self.unbind(address)
        else:
            self.bind(address, driver, override)
