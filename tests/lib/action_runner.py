"""Load the project's action plugins and run them on the controller with the modules they call answered.

One helper for the unit tests of plugins/action: the action runs as Ansible would run it, except that each
module it executes on the target returns the next of the given results.
"""

import importlib.util
from pathlib import Path
from unittest.mock import MagicMock

ROOT = Path(__file__).resolve().parents[2]


def load_action(name):
    """Import plugins/action/<name>.py."""
    path = ROOT / "plugins" / "action" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"inferhost_action_{name}", path)
    action = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(action)
    return action


def run_action(action, args, results, check_mode=False, task_vars=None, *, diff=False):
    """Run the action with args; each module it calls returns the next of results, or what results(module name,
    module args) returns when it is a function (a module run in-process).
    Returns (the action's result, [(module name, module args)] in the order called)."""
    task = MagicMock()
    task.args = args
    task.check_mode = check_mode
    task.async_val = 0
    task.diff = diff
    plugin = action.ActionModule(task, MagicMock(), MagicMock(), MagicMock(), MagicMock(), MagicMock())
    calls = []

    def execute_module(module_name, module_args, task_vars):
        calls.append((module_name, module_args))
        return results(module_name, module_args) if callable(results) else results.pop(0)

    plugin._execute_module = execute_module
    return plugin.run(task_vars=task_vars or {}), calls
