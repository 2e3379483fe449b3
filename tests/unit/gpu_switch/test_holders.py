"""Holders of /dev/nvidia* (and of given nodes such as /dev/vfio/<group>) found in /proc, by pid and command."""

from __future__ import annotations

import os

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


def test_given_nodes_by_path_and_by_device_number(rig, tmp_path):
    # dev/vfio/12 stands for the group node; its device number is /dev/null's, so an fd on /dev/null is
    # the same device under another path (a container's own copy of a node).
    os.makedirs(tmp_path / "devroot" / "vfio")
    os.symlink("/dev/null", tmp_path / "devroot" / "vfio" / "12")
    rig.add_process(20, "qemu-a", fds=["/dev/vfio/vfio", "/dev/vfio/12"])
    rig.add_process(21, "qemu-b", fds=["/dev/vfio/13"])
    rig.add_process(22, "copy", fds=["/dev/null"])
    rig.add_process(23, "smi", fds=["/dev/nvidia0"])
    found = find_holders(rig.proc, nvidia=False, nodes=("/dev/vfio/12",), dev_root=str(tmp_path / "devroot"))
    assert [(h.pid, h.path) for h in found] == [(20, "/dev/vfio/12"), (22, "/dev/null")]
    assert [h.pid for h in find_holders(rig.proc)] == [23]


def test_given_nodes_outside_dev_are_read_where_they_are(rig, tmp_path):
    # A test's stand-in GPU nodes: a plain file, matched by its path or as the same file under another path,
    # and a node elsewhere that is a device (/dev/null's number here), matched by device number.
    standin = tmp_path / "standin-dev"
    standin.mkdir()
    (standin / "nvidia0").write_text("")
    (standin / "nvidia1").write_text("")
    (tmp_path / "alias").symlink_to(standin)
    os.symlink("/dev/null", standin / "nvidia2")
    nodes = tuple(str(standin / n) for n in ("nvidia0", "nvidia2"))
    rig.add_process(30, "by-path", fds=[nodes[0]])
    rig.add_process(31, "by-alias", fds=[str(tmp_path / "alias" / "nvidia0")])
    rig.add_process(32, "other-node", fds=[str(standin / "nvidia1")])
    rig.add_process(33, "by-number", fds=["/dev/null"])
    found = find_holders(rig.proc, nvidia=False, nodes=nodes, dev_root=str(tmp_path / "unused"))
    assert [(h.pid, h.path) for h in found] == [
        (30, nodes[0]),
        (31, str(tmp_path / "alias" / "nvidia0")),
        (33, "/dev/null"),
    ]
