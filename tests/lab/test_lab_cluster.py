"""The lab of two hosts, one Proxmox cluster: the lab's second host (inventory/lab's lines tagged "# second host",
uncommented as a site uncomments inventory/example's) joins the deployed lab of one host. site.yml converges both
hosts and changes nothing the second time; a GPU move on the second host leaves the first host's guests and
service untouched; and one model runs across both hosts' containers with the real vLLM (its CPU build), a rank
of it killed and the group brought back in order by the role. Afterwards the lab is one host again, for the
modules that follow."""

import json
import re
import time

import pytest
from lab_testlib import on, unit_state

from inferhost import lab as labmod

pytestmark = pytest.mark.lab
SINGLE, PAIR = "lab-vllm", "lab-vllm-pair"
UNIT = "inference-{}.service"
TIMES = labmod.ROOT / ".cache" / "test-logs" / "lab-cluster-times.json"


@pytest.fixture(scope="module")
def times():
    """What the module measured (seconds), kept in .cache/test-logs for the record: timings are not asserted."""
    measured = {}
    yield measured
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    TIMES.write_text(json.dumps(measured, indent=2) + "\n")


@pytest.fixture(scope="module")
def cluster(lab, deployed, times):
    """The deployed lab of one host with its second host brought up and site.yml converged on both."""
    two = labmod.Lab.from_inventory(2)
    before = labmod.guest_configs(two, "lab-pve")
    try:
        # test_lab.py leaves the first container's service stopped: it loads while the second host comes up.
        labmod.podman_exec("lab-ct", "systemctl", "start", "--no-block", UNIT.format(SINGLE))
        start = time.monotonic()
        labmod.bring_up(two)
        times["second host brought up"] = round(time.monotonic() - start, 1)
        start = time.monotonic()
        result = labmod.converge(two)
        times["site.yml, second host fresh"] = round(time.monotonic() - start, 1)
        yield two, result, before
    finally:
        # The lab of one host again, whatever happened: the group's units stopped, the second host's machines off.
        for host in ("lab-ct", "lab-ct2"):
            labmod.podman_exec(host, "systemctl", "stop", UNIT.format(PAIR))
        labmod.stop_machines([h for h in two.hosts if h not in lab.hosts])
        labmod.HOST_COUNT.write_text("1\n")


def test_the_second_host_joins_and_its_guests_are_wired_on_its_own_node(cluster):
    two, result, before = cluster
    assert result.status == "successful"
    assert labmod.pve_hosts(two) == ["lab-pve", "lab-pve2"]
    ct_config, vm_config = labmod.guest_configs(two, "lab-pve2")
    assert sorted(k for k in vm_config if k.startswith("hostpci")) == ["hostpci0", "hostpci1"]
    nodes = {v.split(",")[0] for k, v in ct_config.items() if k.startswith("dev") and k[3:].isdigit()}
    assert {"/dev/nvidia0", "/dev/nvidia1"} <= nodes and "/dev/nvidia2" not in nodes
    # The first host's guests are as they were: the second host's play wires its own guests only.
    assert labmod.guest_configs(two, "lab-pve") == before
    # On the first host's machines, only the container's new service: the model across both hosts, inactive, its
    # unit and state directory (the host itself is unchanged).
    first = [line for line in result.changed_tasks if line.split(":")[0] in {"lab-pve", "lab-ct", "lab-vm"}]
    assert {line.split(": ", 1)[1].split(" | ")[0] for line in first} <= {"account", "units"}, first
    assert not [line for line in first if line.startswith("lab-pve:")], first
    assert on(two, "lab-ct", f"systemctl is-enabled {UNIT.format(PAIR)} || true") == "disabled"
    assert sorted(labmod.left_for_later(result)) == ["lab-vm", "lab-vm2"]


def test_site_yml_on_the_converged_cluster_changes_nothing(cluster, times):
    two = cluster[0]
    start = time.monotonic()
    again = labmod.converge(two)
    times["site.yml, no change"] = round(time.monotonic() - start, 1)
    assert again.changed == 0, again.changed_tasks
    assert {"lab-pve", "lab-pve2", "lab-ct", "lab-ct2"} <= again.hosts


def test_a_move_on_one_host_leaves_the_other_hosts_container_serving(cluster, times):
    two = cluster[0]
    unit = UNIT.format(SINGLE)
    serving = unit_state(two, "lab-ct", unit)
    assert serving["ActiveState"] == "active"
    first_host = labmod.guest_configs(two, "lab-pve"), labmod.guest_status(two, "lab-pve")
    start = time.monotonic()
    assert labmod.move_gpus(two, "vm", hosts="lab-pve2").startswith("owner=vm gpus=2 changed=True")
    times["gpu-switch to-vm on the second host"] = round(time.monotonic() - start, 1)
    assert labmod.guest_status(two, "lab-pve2") == ("stopped", "running")
    # The first host's guests and its container's service: untouched, still serving.
    assert (labmod.guest_configs(two, "lab-pve"), labmod.guest_status(two, "lab-pve")) == first_host
    assert unit_state(two, "lab-ct", unit) == serving
    assert "3/3 prompts answered well" in labmod.validate(two)
    assert labmod.move_gpus(two, "ct", hosts="lab-pve2").startswith("owner=ct gpus=2 changed=True")
    assert labmod.guest_status(two, "lab-pve2") == ("running", "stopped")
    assert unit_state(two, "lab-ct", unit) == serving


def _serve_the_pair(two):
    """container.yml's service role with the model across both hosts as the containers' active service (the rest of
    the play converged already); the head's wait result."""
    result = labmod.playbook(
        labmod.ROOT / "playbooks" / "container.yml",
        extravars={"inference_service_active": PAIR},
        tags="role::inference_service",
        inventory=two.inventory,
    )
    waits = {h: r for h, task, r in result.ok_results if task == "active | Wait until the model is served"}
    assert sorted(waits) == ["lab-ct", "lab-ct2"], waits
    return waits["lab-ct"], result


def test_one_model_runs_across_both_hosts_rank_0_serving(cluster, times):
    two = cluster[0]
    start = time.monotonic()
    head_wait, _ = _serve_the_pair(two)
    times["the group's first start (container.yml)"] = round(time.monotonic() - start, 1)
    times["the head's wait at the first start"] = {k: head_wait.get(k) for k in ("msg", "restarts", "elapsed_s")}
    assert head_wait.get("ready") is True and head_wait.get("restarts") == [], head_wait
    unit = UNIT.format(PAIR)
    head = on(two, "lab-ct", f"systemctl show -P ExecStart {unit}")
    rank = on(two, "lab-ct2", f"systemctl show -P ExecStart {unit}")
    assert "--nnodes 2 --node-rank 0 --master-addr 10.89.7.11" in head and "--headless" not in head
    assert "--nnodes 2 --node-rank 1 --master-addr 10.89.7.11" in rank and "--headless" in rank
    assert unit_state(two, "lab-ct", UNIT.format(SINGLE))["ActiveState"] == "inactive"
    # Ready means a one-token completion through the head came back (the wait's own proof).
    assert head_wait["msg"].startswith("the group of 2 nodes serves after "), head_wait


def test_a_killed_rank_is_found_by_a_completion_and_the_group_restarts_in_order(cluster, times):
    """Rank 1's vLLM worker killed: its unit stops, the head's worker fails with it (the head may still answer
    /health for a while). The role's wait finds the broken group, kills what is left, stops the group and starts
    it again, rank 1 first, the head last, until a completion through the head comes back."""
    two = cluster[0]
    unit = UNIT.format(PAIR)
    before = {h: unit_state(two, h, unit) for h in ("lab-ct", "lab-ct2")}
    workers = on(two, "lab-ct2", f"systemd-cgls --no-pager -u {unit} | grep -c 'VLLM::' || true")
    assert int(workers) >= 1, on(two, "lab-ct2", f"systemd-cgls --no-pager -u {unit}")
    on(two, "lab-ct2", "pkill -KILL -f '^VLLM::'")
    killed = time.monotonic()
    head_wait, result = _serve_the_pair(two)
    times["killed rank to the group serving again (container.yml)"] = round(time.monotonic() - killed, 1)
    times["the head's wait after the kill"] = {k: head_wait.get(k) for k in ("msg", "restarts", "elapsed_s")}
    assert head_wait.get("ready") is True and len(head_wait.get("restarts", [])) == 1, head_wait
    # What the wait sees first is a race: rank 1's unit stopping, or the head, whose worker failed with its peer,
    # exiting and restarted by systemd, or a completion failing. Each is the kill's doing and restarts the group.
    reason = head_wait["restarts"][0]
    assert re.match(r"rank (1 \(lab-ct2\)|0 \(lab-ct\)): ", reason) or "completion failed" in reason, reason
    after = {h: unit_state(two, h, unit) for h in ("lab-ct", "lab-ct2")}
    assert all(after[h]["InvocationID"] != before[h]["InvocationID"] for h in after), (before, after)
    # In order: rank 1 started before the head (the containers share this machine's monotonic clock).
    started = {h: int(on(two, h, f"systemctl show -P ExecMainStartTimestampMonotonic {unit}")) for h in after}
    assert 0 < started["lab-ct2"] < started["lab-ct"], started
