"""The installed gpu-guard command: the role's guard tasks lay out its library in a directory of its own, and the
command runs from there alone (its logic is tested in tests/unit/inference/test_guard.py)."""

import os
import re
import stat
import subprocess
import sys

import pytest
import yaml
from inference_refdata import ROLE
from localhost import free_port, run_playbook

# The role installs as root; elsewhere its chown fails before anything can be seen.
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the role installs the guard as root")

SOURCE = ROLE.parents[1] / "plugins" / "module_utils"
# The package inference whole, and gpu_switch's holder scan alone (inference_service_guard_lib_modules).
SHIPPED = ["gpu_switch/holders.py", *sorted(p.relative_to(SOURCE).as_posix() for p in SOURCE.glob("inference/*.py"))]
UNIT = "inference-test.service"


def converge(tmp):
    """Run the role's guard tasks into tmp; the number of changed tasks."""
    proc = run_playbook(tmp / "play.yml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return int(re.search(r"localhost\s+:.*\bchanged=(\d+)", proc.stdout).group(1))


def installed(lib):
    return sorted(p.relative_to(lib).as_posix() for p in lib.rglob("*.py"))


@pytest.fixture(scope="module")
def guard(tmp_path_factory):
    """(the installed command, its library directory), after a first converge."""
    tmp = tmp_path_factory.mktemp("guard")
    command, lib = tmp / "libexec" / "gpu-guard", tmp / "lib" / "gpu-guard"
    play = {
        "name": "Install the GPU guard",
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {"inference_service_guard_path": str(command), "inference_service_guard_lib_dir": str(lib)},
        "tasks": [
            {
                "name": "Run the role's guard tasks",
                "ansible.builtin.include_role": {"name": "inference_service", "tasks_from": "guard.yml"},
            }
        ],
    }
    (tmp / "play.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    assert converge(tmp) > 0
    return command, lib


def test_the_library_is_the_shared_code_and_a_rerun_changes_nothing(guard):
    command, lib = guard
    assert installed(lib) == SHIPPED
    for name in SHIPPED:
        assert (lib / name).read_bytes() == (SOURCE / name).read_bytes(), name
        assert stat.S_IMODE((lib / name).stat().st_mode) == 0o644
    text = command.read_text()
    assert text.startswith("#!/usr/bin/python3 -I\n")
    assert f'sys.path.insert(0, "{lib}")' in text and "from inference.guard import main" in text
    assert stat.S_IMODE(command.stat().st_mode) == 0o755
    assert converge(command.parents[1]) == 0


def test_a_stale_or_edited_module_is_put_right(guard):
    command, lib = guard
    tmp = command.parents[1]
    (lib / "gpu_switch" / "__init__.py").write_text("from .switch import Switcher\n")  # the whole package
    (lib / "inference" / "retired.py").write_text("")
    (lib / "inference" / "__pycache__").mkdir(exist_ok=True)
    (lib / "inference" / "__pycache__" / "retired.cpython-311.pyc").write_bytes(b"\0")
    (lib / "inference" / "client.py").write_text("# edited\n")
    (lib / "gpu_switch" / "holders.py").chmod(0o600)
    (lib / "inference" / "NOTES").write_text("not Python: kept\n")
    # One config_files call ships the command and its library: the edited, stale and mis-moded files are put right
    # in it (the command is as it was).
    assert "inference/guard.py" in SHIPPED and "inference/retired.py" not in SHIPPED
    assert converge(tmp) == 1
    assert installed(lib) == SHIPPED
    assert not (lib / "inference" / "__pycache__" / "retired.cpython-311.pyc").exists()
    assert (lib / "inference" / "NOTES").read_text() == "not Python: kept\n"
    assert (lib / "inference" / "client.py").read_bytes() == (SOURCE / "inference" / "client.py").read_bytes()
    assert stat.S_IMODE((lib / "gpu_switch" / "holders.py").stat().st_mode) == 0o644
    assert converge(tmp) == 0


def run_installed(command, *argv):
    """The installed command as systemd runs it: its own shebang's flags, this interpreter."""
    flags = command.read_text().splitlines()[0].split()[1:]
    return subprocess.run(
        [sys.executable, *flags, str(command), *argv], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_installed_command_imports_only_its_library(guard):
    _, lib = guard
    code = (
        f"import sys; sys.path.insert(0, {str(lib)!r}); import inference.guard; "
        "print(*sorted(m for m in sys.modules if m.split('.')[0] in ('gpu_switch', 'inference')))"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True).stdout
    # gpu_switch is a namespace package there: its holder scan comes alone, none of the GPU switching
    assert out.split() == ["gpu_switch", "gpu_switch.holders", "inference", "inference.client", "inference.guard"]


def test_the_installed_command_guards_the_gpus(guard, tmp_path):
    command, _ = guard
    for name in ("nvidia0", "nvidiactl"):
        (tmp_path / name).write_text("")
    argv = ["--unit", UNIT, "--device", str(tmp_path / "nvidia0"), "--control", str(tmp_path / "nvidiactl")]
    argv += ["--nvidia-smi", "", "--sysfs", str(tmp_path)]
    with open(tmp_path / "nvidia0", "rb") as node:
        holder = subprocess.Popen(["sleep", "300"], stdin=node)
    try:
        refused = run_installed(command, "check", *argv)
        assert refused.returncode == 1, refused.stderr
        assert f"nothing was stopped because these processes do not belong to it: pid {holder.pid} (sleep 300;" in (
            refused.stdout
        )
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()
    passed = run_installed(command, "check", *argv)
    assert passed.returncode == 0 and f"{UNIT}: GPUs - are free and bound to nvidia" in passed.stdout
    port = free_port()
    waited = run_installed(command, "ready", "--url", f"http://127.0.0.1:{port}", "--model", "m", "--timeout", "0")
    assert waited.returncode == 1 and "gpu-guard: m not ready after 0 s (health no answer:" in waited.stdout
