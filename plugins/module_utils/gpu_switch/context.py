# SPDX-License-Identifier: Apache-2.0
"""What every phase of a move shares: the configuration, the seams, the journal and lock files, and what the
move in flight has learnt so far.

Seams (all optional): ``api`` (a PveApi or a fake with the same methods; else one is logged in on first use),
``writer`` (sysfs writes with a timeout), ``host`` (systemctl / modprobe runner), ``after_step`` (called after
each step: tests inject crashes there) and ``clock``. The move in flight: ``record`` (its journal as last
written, None when no move runs), ``holders`` (the processes a check found on the GPUs, for the result) and
``persistenced_active`` (whether the plan leaves the persistence daemon running).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .config import Config, read_secret
from .holders import Holder
from .journal import HostLock, Journal
from .pci import Sysfs
from .pve import PveApi
from .system import Host
from .writer import ProcessWriter


class Context:
    """The configuration, the seams and the move in flight, one for all phases."""

    def __init__(
        self,
        config: Config,
        *,
        api=None,
        writer=None,
        host: Host | None = None,
        secret: str | None = None,
        after_step: Callable[[object], None] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.cfg = config
        self.sysfs = Sysfs(config.roots.sysfs)
        self.writer = writer or ProcessWriter()
        self.host = host or Host(timeout=config.timeouts.command)
        self._api, self._secret = api, secret
        self.after_step = after_step
        self.clock = clock
        self.journal = Journal(config.journal_path)
        self.lock = HostLock(config.lock_path)
        self.record: dict | None = None
        self.holders: list[Holder] = []
        self.persistenced_active: bool | None = None

    @property
    def api(self):
        if self._api is None:
            self._api = PveApi(self.cfg.proxmox, self._secret or read_secret(self.cfg.proxmox))
        return self._api

    def journal_update(self, **changes) -> None:
        """Change the journal of the move in flight and write it (nothing when no move runs)."""
        if self.record is None:
            return
        self.record.update(changes)
        self.journal.write(self.record)
