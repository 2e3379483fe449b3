"""The NCCL settings reach real processes of a venv built on Debian's system Python."""

import json
import shlex

import pytest

VENV_PY = "/opt/venvs/serve/bin/python"
EXPECTED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}
PRINT_ENV = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {sorted(EXPECTED)!r}}}))"


def run_json(host, *argv, env=None):
    prefix = ["env", "-i"] + [f"{k}={v}" for k, v in (env or {}).items()]
    cmd = host.run_expect([0], shlex.join([*prefix, *argv]))
    return json.loads(cmd.stdout)


def test_a_venv_process_sees_the_settings(host):
    assert run_json(host, VENV_PY, "-c", PRINT_ENV) == EXPECTED


def test_isolated_mode_still_sees_the_settings(host):
    # -I ignores PYTHON* variables and the user site, but .pth hooks still run.
    assert run_json(host, VENV_PY, "-I", "-c", PRINT_ENV) == EXPECTED


def test_a_value_set_by_the_user_wins(host):
    got = run_json(host, VENV_PY, "-c", PRINT_ENV, env={"NCCL_PROTO": "Simple"})
    assert got == {**EXPECTED, "NCCL_PROTO": "Simple"}


def test_child_processes_inherit_the_settings(host):
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-S', '-c', {PRINT_ENV!r}], check=True)"
    # The child runs with -S (no site, no hook): it sees the values only through inheritance.
    assert run_json(host, VENV_PY, "-c", code) == EXPECTED


def test_the_system_sitecustomize_shadows_a_venv_one(host):
    # Why the role uses a .pth hook: a sitecustomize.py in the venv would never be imported.
    site = host.check_output(f"{VENV_PY} -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))'")
    probe = f"{site}/sitecustomize.py"
    host.run_expect([0], f'echo \'import os; os.environ["PROBE"] = "venv"\' > {probe}')
    try:
        system = host.run(f"{VENV_PY} -c 'import sitecustomize; print(sitecustomize.__file__)'")
        if system.rc != 0 or system.stdout.strip() == probe:
            pytest.skip("this Python ships no sitecustomize of its own")
        assert host.run(f"{VENV_PY} -c 'import os; print(os.environ.get(\"PROBE\"))'").stdout.strip() == "None"
    finally:
        host.run(f"rm -f {probe}")


def test_nccl_conf_has_each_setting_and_no_stray_assignments(host):
    conf = host.file("/etc/nccl.conf")
    assert conf.mode == 0o644 and conf.user == "root"
    assignments = [line for line in conf.content_string.splitlines() if "=" in line]
    # NCCL reads every line with an '=' as a setting, so comments must carry none.
    assert assignments == [f"{k}={v}" for k, v in EXPECTED.items()]


def test_env_file_for_systemd_units(host):
    # systemd-run parses the file exactly as a unit's EnvironmentFile= would.
    out = host.check_output("systemd-run --wait --pipe --quiet -p EnvironmentFile=/etc/inferhost/nccl.env /usr/bin/env")
    seen = dict(line.split("=", 1) for line in out.splitlines() if line.startswith("NCCL_"))
    assert seen == EXPECTED
