"""inference_service_owed: a restart an earlier run owes is found on the target whatever task that run stopped after:
the role's record, a unit file systemd has not loaded, a file of the definition newer than the engine."""

import os
from unittest import mock

from ansible.module_utils.basic import AnsibleModule
from module_runner import load_module, run_module

OWED = load_module("inference_service_owed")
STARTED = "Sun 2026-12-06 04:06:57.900514 UTC"
STARTED_EPOCH = 1796530017.900514  # 2026-12-06 04:06:57.900514 UTC


def run(tmp_path, shown, paths=(), marker_text=None, ignore=()):
    marker = tmp_path / "restart-owed"
    if marker_text is not None:
        marker.write_text(marker_text)
    out = "".join(f"{k}={v}\n" for k, v in shown.items())
    args = {
        "unit": "inference-a.service",
        "name": "a",
        "marker": str(marker),
        "paths": list(paths),
        "ignore": list(ignore),
    }
    with mock.patch.object(AnsibleModule, "run_command", return_value=(0, out, "")) as called:
        result = run_module(OWED, args)
    assert "--timestamp=us+utc" in called.call_args.args[0]
    return result


def state(reload="no", active="active"):
    return {"NeedDaemonReload": reload, "ActiveState": active, "ExecMainStartTimestamp": STARTED}


def file_at(path, epoch):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    os.utime(path, (epoch, epoch))
    return path


def test_the_timestamp_is_read_to_the_microsecond():
    assert abs(OWED.started_at(STARTED) - STARTED_EPOCH) < 1e-6
    assert OWED.started_at("") is None and OWED.started_at("n/a") is None


def test_nothing_is_owed_when_every_file_is_older_than_the_engine(tmp_path):
    key = file_at(tmp_path / "a.secret.env", STARTED_EPOCH - 0.5)
    result = run(tmp_path, state(), [str(key)])
    assert (result["owed"], result["reasons"], result["daemon_reload"]) == (False, [], False)


def test_the_record_of_an_earlier_run_owes_the_restart_and_only_for_its_service(tmp_path):
    assert run(tmp_path, state(), marker_text="a\n")["owed"] is True
    assert run(tmp_path, state(), marker_text="b\n")["owed"] is False


def test_a_unit_systemd_has_not_loaded_owes_a_restart_after_a_daemon_reload(tmp_path):
    result = run(tmp_path, state(reload="yes"))
    assert result["owed"] and result["daemon_reload"] and "NeedDaemonReload=yes" in result["reasons"][0]


def test_a_file_written_after_the_engine_started_owes_a_restart_within_a_second(tmp_path):
    lib = tmp_path / "lib"
    newer = file_at(lib / "inference" / "guard.py", STARTED_EPOCH + 0.05)
    file_at(lib / "inference" / "watchdog.py", STARTED_EPOCH + 100)  # the watchdog's own: no restart
    file_at(lib / "inference" / "__pycache__" / "guard.cpython-311.pyc", STARTED_EPOCH + 100)
    result = run(tmp_path, state(), [str(lib), str(tmp_path / "missing")], ignore=["watchdog.py"])
    assert result["owed"] and result["reasons"] == [f"changed after the engine started: {newer}"]


def test_a_stopped_service_owes_nothing_for_its_files(tmp_path):
    key = file_at(tmp_path / "a.secret.env", STARTED_EPOCH + 60)
    assert run(tmp_path, state(active="inactive"), [str(key)])["owed"] is False
