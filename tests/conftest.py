"""Shared test setup: the commands tests start (ansible-playbook, molecule, ruff, ...) are this environment's."""

import os
import sys

_BIN = os.path.dirname(sys.executable)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = os.pathsep.join([_BIN, os.environ.get("PATH", "")])
