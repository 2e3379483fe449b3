"""pve_guest_gpu's raw method (hosts without devN) run by ansible-playbook on this machine, on files in tmp_path.

Nothing here talks to an API: the raw method writes the container's config file, which the test keeps
in a temporary directory, and reads the device majors from a fake /proc/devices.
"""

import re

import pytest
import yaml
from localhost import run_playbook

GPUS = [
    {"address": "0000:01:00.0", "slot": "0000:01:00", "index": 0, "minor": 0},
    {"address": "0000:81:00.0", "slot": "0000:81:00", "index": 1, "minor": None},
]
CONFIG = """arch: amd64
hostname: inference-ct
memory: 65536
rootfs: local-lvm:vm-101-disk-0,size=64G
lxc.apparmor.profile: unconfined

[before-upgrade]
arch: amd64
hostname: inference-ct
snaptime: 1700000000
"""
DEVICES = (
    "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n509 nvidia-caps\n\nBlock devices:\n  8 sd\n"
)


@pytest.fixture
def run(tmp_path):
    conf_dir, proc = tmp_path / "lxc", tmp_path / "proc"
    conf_dir.mkdir()
    proc.mkdir()
    (conf_dir / "101.conf").write_text(CONFIG)
    (proc / "devices").write_text(DEVICES)
    play = [
        {
            "name": "Wire the GPUs into a container the old way",
            "hosts": "localhost",
            "gather_facts": False,
            # The connection, role pve_api's (run first, as playbooks/host.yml does), as an inventory sets it.
            # This machine installs nothing and tries no login: the raw method asks no API.
            "vars": {
                "pve_api_node": "pve1",
                "pve_api_backend": "local",
                "pve_api_packages": [],
                "pve_api_check_login": False,
            },
            "roles": [
                {"role": "pve_api"},
                {
                    "role": "pve_guest_gpu",
                    "pve_guest_gpu_gpus": GPUS,
                    "pve_guest_gpu_containers": [{"vmid": 101, "extra_devices": ["/dev/nvidia-caps/nvidia-cap1"]}],
                    "pve_guest_gpu_ct_method": "raw",
                    "pve_guest_gpu_lxc_conf_dir": str(conf_dir),
                    "pve_guest_gpu_proc_root": str(proc),
                },
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))

    def go(*extra):
        proc_ = run_playbook(tmp_path / "play.yml", *extra)
        assert proc_.returncode == 0, proc_.stdout[-4000:] + proc_.stderr[-2000:]
        return int(re.search(r"changed=(\d+)", proc_.stdout).group(1)), proc_.stdout

    return go, conf_dir / "101.conf"


def test_lines_go_to_the_main_section_and_a_rerun_changes_nothing(run):
    go, conf = run
    changed, _ = go()
    assert changed == 1
    text = conf.read_text()
    main, snapshot = text.split("\n[before-upgrade]\n")
    assert "lxc.cgroup2.devices.allow: c 195:* rwm\n" in main
    assert "lxc.cgroup2.devices.allow: c 508:* rwm\n" in main
    assert "lxc.cgroup2.devices.allow: c 509:* rwm\n" in main
    assert "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n" in main
    assert "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file\n" in main, "index when no minor"
    assert "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file\n" in main
    assert "lxc.mount.entry: /dev/nvidia-caps/nvidia-cap1 dev/nvidia-caps/nvidia-cap1" in main
    assert main.startswith(CONFIG.split("\n\n", maxsplit=1)[0] + "\n"), "the container's own lines are untouched"
    assert "lxc." not in snapshot.replace("lxc.apparmor", ""), "the snapshot is untouched"
    assert snapshot == CONFIG.split("[before-upgrade]\n")[1]
    assert go()[0] == 0
    assert conf.read_text() == text
    assert go("--check", "--diff")[0] == 0


def test_check_mode_shows_the_lines_and_writes_nothing(run):
    go, conf = run
    changed, out = go("--check", "--diff")
    assert changed == 1
    assert "+lxc.cgroup2.devices.allow: c 508:* rwm" in out
    assert conf.read_text() == CONFIG


def test_without_pve_api_before_it_the_role_stops_naming_that_role(run, tmp_path):
    """The connection comes from role pve_api in the same play; a play that leaves it out stops in the preflight,
    before the container's file is touched."""
    _, conf = run
    play = yaml.safe_load((tmp_path / "play.yml").read_text())
    play[0]["roles"] = [r for r in play[0]["roles"] if r["role"] != "pve_api"]
    (tmp_path / "alone.yml").write_text(yaml.safe_dump(play))
    proc = run_playbook(tmp_path / "alone.yml")
    assert proc.returncode != 0
    assert "list pve_api before pve_guest_gpu in the same play" in proc.stdout
    assert conf.read_text() == CONFIG
