"""`python -m inferhost.lab`: the inferhost-lab command (cli.py)."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
