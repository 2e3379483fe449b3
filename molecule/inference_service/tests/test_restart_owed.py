"""A restart the active service owes survives a run that fails before it.

restart_owed.yml changes svc-a's command line and stops the run right after the units are written, as a run
that fails in between does: the old process keeps serving the old command line, and the role's record of
the owed restart stays on the target. The next plain run restarts svc-a (a new main process, started after
the interrupted run) and removes the record; the run after it changes nothing. The converge's services are
put back at the end. It runs after test_inference_service.py (file order).
"""

import os
import re
import subprocess
from pathlib import Path

import pytest
from molecule_play import ROOT, instances, machine, play

SCENARIO = Path(__file__).resolve().parents[1]
PLAYBOOK = SCENARIO / "restart_owed.yml"
UNIT = "inference-svc-a.service"
MARKER = "/var/lib/inferhost-service/restart-owed"
ARGS = ["-e", '{"restart_owed_args": {"max-num-seqs": 8}}']


# The second change: a run of the whole role that stops between the unit and the record of the owed restart (the
# record's directory cannot be made), before its daemon reload.
BEFORE_MARKER = ["-e", '{"restart_owed_args": {"max-num-seqs": 16}}', "-e", "inference_service_state_dir=/proc/none"]


def interrupted(hosts, argv=(*ARGS, "-e", "restart_owed_interrupt=true"), says="interrupted after the units"):
    """The run that fails after the units: it must fail there, on every host."""
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    command = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], "--limit", ",".join(hosts)]
    command += [*argv, str(PLAYBOOK)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode != 0, proc.stdout[-4000:]
    for host in hosts:
        assert re.search(rf"^fatal: \[{re.escape(host)}\]: FAILED!", proc.stdout, re.M), proc.stdout[-4000:]
    assert says in proc.stdout, proc.stdout[-4000:]


def state(host):
    shown = host.check_output(f"systemctl show {UNIT} --property MainPID,ActiveState,ExecMainStartTimestampMonotonic")
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    cmdline = host.check_output(f"tr '\\0' ' ' < /proc/{props['MainPID']}/cmdline") if props["MainPID"] != "0" else ""
    return {
        "pid": props["MainPID"],
        "active": props["ActiveState"],
        "started": int(props["ExecMainStartTimestampMonotonic"]),
        "cmdline": cmdline,
        "unit": host.file(f"/etc/systemd/system/{UNIT}").content_string,
        "marker": host.file(MARKER).content_string if host.file(MARKER).exists else None,
    }


@pytest.fixture(scope="module")
def seen(request):
    hosts = instances(request)
    machines = {h: machine(h) for h in hosts}

    def reset():  # the earlier tests' starts count against StartLimitBurst
        for m in machines.values():
            m.run_expect([0], f"systemctl reset-failed {UNIT}")

    steps = {"before": {h: state(m) for h, m in machines.items()}}
    try:
        interrupted(hosts)
        steps["interrupted"] = {h: state(m) for h, m in machines.items()}
        for step in ("converge", "again"):
            reset()
            changed = play(PLAYBOOK, hosts, *ARGS)
            steps[step] = {h: {"changed": changed[h], **state(m)} for h, m in machines.items()}
        steps["check"] = {h: {"changed": n} for h, n in play(PLAYBOOK, hosts, "--check", *ARGS).items()}
        interrupted(hosts, BEFORE_MARKER, "Record that the active service owes a restart")
        steps["before_marker"] = {h: state(m) for h, m in machines.items()}
        reset()
        changed = play(PLAYBOOK, hosts, "-e", '{"restart_owed_args": {"max-num-seqs": 16}}')
        steps["after_marker_run"] = {h: {"changed": changed[h], **state(m)} for h, m in machines.items()}
    finally:
        reset()
        play(SCENARIO / "converge.yml", hosts)  # the converge's services again, for the tests run after
    return steps


@pytest.fixture
def at(seen, host):
    return {step: states[host.backend.host] for step, states in seen.items()}


def test_the_interrupted_run_wrote_the_unit_and_left_the_old_process_with_the_restart_owed(at):
    before, after = at["before"], at["interrupted"]
    assert "--max-num-seqs 8" not in before["unit"] and "--max-num-seqs 8" in after["unit"]
    assert after["pid"] == before["pid"] and "--max-num-seqs" not in after["cmdline"]
    assert after["marker"] == "svc-a\n"


def test_the_next_run_restarts_the_service_and_forgets_the_owed_restart(at):
    converged = at["converge"]
    assert converged["changed"] > 0
    assert converged["pid"] != at["interrupted"]["pid"]
    assert converged["started"] > at["interrupted"]["started"]
    assert converged["active"] == "active" and re.search(r"--max-num-seqs 8\b", converged["cmdline"])
    assert converged["marker"] is None


def test_the_run_after_it_and_a_check_change_nothing(at):
    assert at["again"]["changed"] == 0 and at["again"]["pid"] == at["converge"]["pid"]
    assert at["check"]["changed"] == 0


def test_a_run_stopped_between_the_unit_and_the_record_still_owes_the_restart(at):
    """No record was written and systemd never read the new unit: the next run restarts the service all the same."""
    stopped, rerun = at["before_marker"], at["after_marker_run"]
    assert "--max-num-seqs 16" in stopped["unit"] and stopped["marker"] is None
    assert stopped["pid"] == at["again"]["pid"] and "--max-num-seqs 16" not in stopped["cmdline"]
    assert rerun["pid"] != stopped["pid"] and re.search(r"--max-num-seqs 16\b", rerun["cmdline"])
    assert rerun["active"] == "active"
