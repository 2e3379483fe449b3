"""The wing's stand-in for the kernel's cgroup-empty notice: its unit runs the script where the lab puts it, only
where systemd listens for the release agent, and the script tells the agent of an empty cgroup of a stopping
service and of nothing else (systemctl, find and the agent are fakes on PATH and in a temporary tree)."""

import re
import subprocess

from inferhost.lab import machines


def test_the_unit_runs_the_script_where_the_lab_copies_it_and_only_in_legacy_cgroup_mode(monkeypatch):
    unit = machines.CGROUP_NOTIFY_UNIT.read_text()
    copied = []
    monkeypatch.setattr(machines, "podman", lambda *argv, **_: copied.append(argv))
    machines.install_cgroup_notify("m")
    [script_copy, unit_copy, enable] = copied
    assert re.search(r"^ExecStart=(\S+)$", unit, re.M)[1] == script_copy[2].split(":", 1)[1]
    assert unit_copy[2] == f"m:/etc/systemd/system/{machines.CGROUP_NOTIFY_UNIT.name}"
    assert "ConditionPathExists=/run/systemd/cgroups-agent" in unit
    assert enable[-1] == machines.CGROUP_NOTIFY_UNIT.name and "--now" in enable


def test_the_script_tells_the_agent_of_a_stopping_services_empty_cgroup_only(tmp_path):
    script = machines.CGROUP_NOTIFY.read_text()
    tree = tmp_path / "cgroup"
    for unit, procs in (("stuck.service", ""), ("busy.service", "42\n")):
        (tree / "slice" / unit).mkdir(parents=True)
        (tree / "slice" / unit / "cgroup.procs").write_text(procs)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(
        '#!/bin/sh\ncase "$1" in list-units) printf "stuck.service loaded deactivating\\nbusy.service x\\n";;\n'
        'show) echo "/slice/$4";; esac\n'
    )
    told = tmp_path / "told"
    (bin_dir / "agent").write_text(f'#!/bin/sh\necho "$1" >> {told}\n')
    (bin_dir / "sleep").write_text(f"#!/bin/sh\n[ -e {told} ] && exit 1; exit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = script.replace("hierarchy=/sys/fs/cgroup/systemd", f"hierarchy={tree}")
    script = script.replace("/usr/lib/systemd/systemd-cgroups-agent", str(bin_dir / "agent"))
    subprocess.run(["sh", "-c", script], env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=30, check=True)
    assert told.read_text() == "/slice/stuck.service\n"
