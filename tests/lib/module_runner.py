"""Load the project's Ansible modules and run them in-process, as a target host would run them.

One helper for every test layer that calls a module's main() directly (tests/unit, tests/api).
"""

import contextlib
import importlib.util
import io
import json
from pathlib import Path
from unittest import mock

import ansible.module_utils
from ansible.module_utils import _internal as module_internal
from ansible.module_utils.testing import patch_module_args

ROOT = Path(__file__).resolve().parents[2]


def load_module(name):
    """Import plugins/modules/<name>.py, with plugins/module_utils reachable as ansible.module_utils."""
    utils = str(ROOT / "plugins" / "module_utils")
    if utils not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(utils)
    spec = importlib.util.spec_from_file_location(f"inferhost_{name}", ROOT / "plugins" / "modules" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_module(module, args, check_mode=False, diff=False):
    """Run a module's main() with args; return its JSON result (failed results included).

    Any controller-side import in the same test process (an action plugin, ansible.errors) marks the
    process as Ansible's controller, and a module's warnings then go to the controller's display instead of
    its result: the run is marked target-side, as it is on a host.
    """
    args = dict(args)
    if check_mode:
        args["_ansible_check_mode"] = True
    if diff:
        args["_ansible_diff"] = True
    out = io.StringIO()
    with (
        mock.patch.object(module_internal, "is_controller", False),
        patch_module_args(args),
        contextlib.redirect_stdout(out),
        contextlib.suppress(SystemExit),
    ):
        module.main()
    return json.loads(out.getvalue())
