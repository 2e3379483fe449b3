"""Holders of /dev/nvidia* found in /proc, reported by pid and command."""

from __future__ import annotations

from gpu_switch.holders import find_holders


def test_fd_links_maps_and_containers(rig):
    rig.add_process(10, "/usr/bin/python3 serve.py", fds=["/dev/pts/0", "/dev/nvidia0"])
    rig.add_process(11, "/usr/bin/nvidia-persistenced --user nvidia-persistenced", fds=["/dev/nvidiactl"])
    rig.add_process(
        12,
        "python3 -m vllm",
        fds=["/var/lib/lxc/101/passthrough/dev/nvidia1"],
        cgroup="0::/lxc/101/ns/system.slice/vllm.service\n",
    )
    rig.add_process(13, "sleep 100", fds=["/dev/null", "socket:[123]"])
    rig.add_process(14, "mapper", maps="7f00-7f10 rw-s 00000000 00:05 12 /dev/nvidia-uvm\n")
    holders = find_holders(rig.proc)
    assert [(h.pid, h.path) for h in holders] == [
        (10, "/dev/nvidia0"),
        (11, "/dev/nvidiactl"),
        (12, "/var/lib/lxc/101/passthrough/dev/nvidia1"),
        (14, "/dev/nvidia-uvm"),
    ]
    assert holders[0].command == "/usr/bin/python3 serve.py"
    assert holders[1].is_persistenced and not holders[0].is_persistenced
    assert holders[2].container == 101
    assert str(holders[2]) == "pid 12 (python3 -m vllm) in CT 101 holds /var/lib/lxc/101/passthrough/dev/nvidia1"
    assert holders[0].as_dict() == {"pid": 10, "command": "/usr/bin/python3 serve.py", "path": "/dev/nvidia0"}
    assert [h.pid for h in find_holders(rig.proc, exclude_pids=(10, 11))] == [12, 14]


def test_no_proc_tree_means_no_holders(tmp_path):
    assert find_holders(str(tmp_path / "nothing")) == []
