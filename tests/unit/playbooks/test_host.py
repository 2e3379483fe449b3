"""host.yml's rolling reboot: its structure read from the playbook (one host at a time, a failure stops it, the
order of a host's turn), and its play run by ansible-playbook against fakepve for two hosts on this machine.

Both hosts are this machine (a local connection), so pve_host_gpu's own guard skips the reboot and with it the
verification of the rebooted kernel: what runs is every API step of each turn, in order, and the stop on failure.
"""

import json
import re
import sys

import pytest
import yaml
from playbook_testlib import run_ansible
from pve_testlib import ROOT

HOST_YML = ROOT / "playbooks" / "host.yml"
ROLE_TASKS = ROOT / "roles" / "pve_host_gpu" / "tasks"


def plays():
    return [p for p in yaml.safe_load(HOST_YML.read_text()) if "hosts" in p]


def rolling_play():
    (play,) = [p for p in plays() if "serial" in p]
    return play


def module_of(task):
    return next(k for k in task if k.startswith(("ansible.builtin.", "pve_")))


def test_the_configure_play_runs_every_host_at_once_and_reboots_none():
    configure = plays()[0]
    assert configure["hosts"] == "pve_hosts"
    assert "serial" not in configure
    reboot = yaml.safe_load((ROLE_TASKS / "reboot.yml").read_text())
    assert "ansible.builtin.reboot" not in {module_of(t) for t in reboot}


def test_the_rolling_play_takes_one_host_at_a_time_and_stops_at_the_first_failure():
    play = rolling_play()
    # After the configure play, the last of host.yml.
    assert [p["name"] for p in plays()][1:] == [play["name"]]
    assert (play["hosts"], play["serial"], play["max_fail_percentage"], play["order"]) == (
        "pve_hosts",
        1,
        0,
        "inventory",
    )
    (turn,) = play["tasks"]
    assert turn["when"] == "__pve_host_gpu_reboot_now | default(false) | bool"
    roles = [
        (t["ansible.builtin.include_role"]["name"], t["ansible.builtin.include_role"].get("tasks_from"))
        for t in turn["block"]
    ]
    assert roles == [("pve_api", None), ("pve_host_gpu", "rolling_reboot.yml")]


def test_a_hosts_turn_runs_in_order_and_names_the_host_in_every_step():
    (block,) = yaml.safe_load((ROLE_TASKS / "rolling_reboot.yml").read_text())
    steps = [
        (module_of(t), t[module_of(t)].get("state") if isinstance(t[module_of(t)], dict) else t[module_of(t)])
        for t in block["block"]
    ]
    assert steps == [
        ("pve_guest_power", "stopped"),
        ("ansible.builtin.reboot", None),
        ("ansible.builtin.wait_for_connection", None),
        ("pve_cluster_quorum", None),
        ("ansible.builtin.import_tasks", "verify.yml"),
        ("pve_guest_power", "started"),
    ]
    assert all(t["name"].endswith("{{ inventory_hostname }}") for t in block["block"])
    # The guests started are the ones recorded as running before the reboot, no others.
    assert block["block"][-1]["pve_guest_power"]["guests"] == "{{ __pve_host_gpu_guests_before.running }}"
    assert block["rescue"][0]["ansible.builtin.fail"]


# --- the play itself, against fakepve --------------------------------------------------------------------------


@pytest.fixture
def cluster(fakepve):
    """Two nodes, each host's container running and its VM stopped."""
    for node, ct, vm in (("pve1", 101, 201), ("pve2", 102, 202)):
        fakepve.add_ct(ct, f"ct-{node}", node=node, status="running")
        fakepve.add_vm(vm, f"vm-{node}", node=node, status="stopped")
    return fakepve


def run_rolling_play(tmp_path, pve, cafile, **overrides):
    """host.yml's rolling play against hosts pve-a (node pve1) and pve-b (node pve2), both owing a reboot."""
    (tmp_path / "rolling.yml").write_text(yaml.safe_dump([rolling_play()], sort_keys=False))
    common = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "__pve_host_gpu_reboot_now": True,
        "__pve_host_gpu_reasons": ["a test"],
        "__pve_host_gpu_local_reason": "the play runs on this machine",
        "pve_api_host": pve.host,
        "pve_api_port": pve.port,
        "pve_api_password": "secret",
        "pve_api_ca_path": cafile,
        "pve_api_packages": [],
        "pve_host_gpu_guest_shutdown_timeout": 5,
        "pve_host_gpu_quorum_timeout": 0,
    }
    hosts = {
        "pve-a": {**common, "pve_api_node": "pve1", "pve_host_gpu_reboot_guests": guests(101, 201)},
        "pve-b": {**common, "pve_api_node": "pve2", "pve_host_gpu_reboot_guests": guests(102, 202)},
    }
    for host, values in overrides.items():
        hosts[host].update(values)
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"pve_hosts": {"hosts": hosts}}))
    return run_ansible(
        "ansible-playbook",
        "-i",
        str(tmp_path / "hosts.yml"),
        str(tmp_path / "rolling.yml"),
        env={"ANSIBLE_DISPLAY_SKIPPED_HOSTS": "true"},
        timeout=600,
    )


def guests(ct, vm):
    return [{"vmid": ct, "type": "lxc"}, {"vmid": vm, "type": "qemu"}]


def turns(stdout):
    """The rolling steps the log shows, in order: [(step, host named in its title, hosts it ran on)]."""
    steps = []
    for title, body in re.findall(
        r"^TASK \[pve_host_gpu : rolling_reboot \| (.*?)\] \**\n(.*?)(?=^TASK|^PLAY|\Z)", stdout, re.M | re.S
    ):
        ran = sorted(set(re.findall(r"^(?:ok|changed|skipping|fatal): \[([\w-]+)\]", body, re.M)))
        steps.append((title, ran))
    return steps


def power_posts(pve):
    posts = [path.split("/") for method, path, _ in pve.requests if method == "POST" and "/status/" in path]
    return [(int(p[p.index("status") - 1]), p[-1]) for p in posts]


def test_the_hosts_reboot_in_turn_each_guest_stopped_and_started_again(tmp_path, cluster, fakepve_cafile):
    result = run_rolling_play(tmp_path, cluster, fakepve_cafile)
    assert result.returncode == 0, result.stdout + result.stderr
    turn = [
        "Record and shut down the running GPU guests of {host}",
        "Reboot {host}",
        "Wait for the connection to {host}",
        "Wait for the cluster's quorum, seen from {host}",
        "Start again the GPU guests that ran on {host}",
    ]
    expected = [(step.format(host=host), [host]) for host in ("pve-a", "pve-b") for step in turn]
    assert turns(result.stdout) == expected
    # Only the containers ran: each was shut down and started again, host by host; the VMs were not touched.
    assert power_posts(cluster) == [(101, "shutdown"), (101, "start"), (102, "shutdown"), (102, "start")]
    assert {v: cluster.guest(v).status for v in (101, 102, 201, 202)} == {
        101: "running",
        102: "running",
        201: "stopped",
        202: "stopped",
    }


def test_a_failure_on_the_first_host_leaves_the_second_untouched(tmp_path, cluster, fakepve_cafile):
    cluster.guest(101).shutdown_secs = 10_000
    result = run_rolling_play(tmp_path, cluster, fakepve_cafile)
    assert result.returncode != 0
    assert "The rolling reboot stopped at pve-a" in result.stdout
    assert "CT 101 did not shut down within 5 s" in result.stdout
    hosts = {host for _, ran in turns(result.stdout) for host in ran}
    assert hosts == {"pve-a"}
    assert power_posts(cluster) == [(101, "shutdown")]
    assert cluster.guest(102).status == "running"


def test_lost_quorum_stops_the_rollout_with_the_guests_left_stopped(tmp_path, cluster, fakepve_cafile):
    cluster.lose_quorum()
    result = run_rolling_play(tmp_path, cluster, fakepve_cafile)
    assert result.returncode != 0
    assert "no quorum within 0 s" in result.stdout
    assert "GPU guests that ran before: 101" in result.stdout
    assert power_posts(cluster) == [(101, "shutdown")]
    assert (cluster.guest(101).status, cluster.guest(102).status) == ("stopped", "running")


def test_a_host_that_owes_no_reboot_is_passed_over(tmp_path, cluster, fakepve_cafile):
    result = run_rolling_play(tmp_path, cluster, fakepve_cafile, **{"pve-a": {"__pve_host_gpu_reboot_now": False}})
    assert result.returncode == 0, result.stdout + result.stderr
    assert {host for _, ran in turns(result.stdout) for host in ran} == {"pve-b"}
    assert power_posts(cluster) == [(102, "shutdown"), (102, "start")]
    assert json.dumps(power_posts(cluster)).count("101") == 0
