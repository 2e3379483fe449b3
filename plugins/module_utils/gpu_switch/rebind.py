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

    def _write(self, bdf: str, path: str, value: str) -> None:
        if self.before_write:
            self.before_write(bdf, path, value)
        try:
            self.writer.write(path, value, self.timeout)
        except WriteTimeout as exc:
            exc.address = bdf
            raise
        except OSError as exc:
            raise RebindError(f"{bdf}: writing {value.strip()!r} to {path} failed: {exc.strerror or exc}") from None

    def set_override(self, bdf: str, override: str | None) -> None:
        """Only this driver may bind the function from now on (None: any). Does not unbind."""
        if self.sysfs.override(bdf) != override:
            self._write(bdf, self.sysfs.path(bdf, "driver_override"), (override or "") + "\n")

    def unbind(self, bdf: str) -> None:
        driver = self.sysfs.driver(bdf)
        if driver is not None:
            self._write(bdf, os.path.join(self.sysfs.drivers, driver, "unbind"), bdf)

    def probe(self, bdf: str) -> None:
        self._write(bdf, os.path.join(os.path.dirname(self.sysfs.devices), "drivers_probe"), bdf)

    def bind(self, bdf: str, driver: str, final_override: str | None = None) -> bool:
        """Bind the function to exactly this driver; then leave final_override in place. True if changed."""
        if self.sysfs.driver(bdf) == driver:
            changed = self.sysfs.override(bdf) != final_override
            self.set_override(bdf, final_override)
            return changed
        self.set_override(bdf, driver)
        self.unbind(bdf)
        self.probe(bdf)
        now = self.sysfs.driver(bdf)
        if now != driver:
            raise RebindError(
                f"{bdf}: bound to {now or 'no driver'} after drivers_probe, expected {driver}"
                f"{'' if self.sysfs.driver_loaded(driver) else f' (driver {driver} is not loaded)'}"
            )
        if final_override != driver:
            self.set_override(bdf, final_override)
        return True

    def release(self, bdf: str, away_from: str) -> bool:
        """Clear the override and let the kernel pick the function's native driver, as long as it is not
        away_from (used for the GPU's audio and USB functions on the way back to the host). True if changed."""
        current = self.sysfs.driver(bdf)
        if current is not None and current != away_from:
            changed = self.sysfs.override(bdf) is not None
            self.set_override(bdf, None)
            return changed
        self.set_override(bdf, None)
        self.unbind(bdf)
        self.probe(bdf)
        now = self.sysfs.driver(bdf)
        if now == away_from:
            raise RebindError(f"{bdf}: still bound to {away_from} after drivers_probe")
        return True

    def restore(self, bdf: str, driver: str | None, override: str | None) -> None:
        """Put the function back exactly as it was: its driver (or unbound) and its override."""
        if driver is None:
            self.set_override(bdf, override)
            self.unbind(bdf)
        else:
            self.bind(bdf, driver, override)
