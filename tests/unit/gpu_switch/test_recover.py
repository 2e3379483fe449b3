"""Journal and recover: the process dies after each step (or each sysfs write) in turn, then `recover`
must leave every function bound to exactly one driver and the owning guest running; also after a reboot."""

from __future__ import annotations

import json
import os

import pytest
from gpu_switch import cli
from gpu_switch.errors import EXIT_OK, EXIT_ROLLED_BACK, EXIT_STRANDED
from gpu_switch_rig import CT, VM, Rig

from inferhost.sim.gpu_api import ThreadWriter

# The steps of a full move of 2 GPUs from that side, and what recover decides when the move dies right after
# each: undo until both GPUs are rebound, finish from there. From the VM, check-holders looks for /dev/vfio
# holders and device-nodes recreates the container's nodes. Written out by hand, not read from the journal.
DECISIONS = {
    "ct": [
        ("stop-guest", "undo"),
        ("stop-service", "undo"),
        ("check-holders", "undo"),
        ("rebind", "undo"),
        ("rebind", "undo"),
        ("start-service", "finish"),
        ("guest-config", "finish"),
        ("start-guest", "finish"),
    ],
    "vm": [
        ("stop-guest", "undo"),
        ("stop-service", "undo"),
        ("check-holders", "undo"),
        ("rebind", "undo"),
        ("rebind", "undo"),
        ("device-nodes", "finish"),
        ("start-service", "finish"),
        ("guest-config", "finish"),
        ("start-guest", "finish"),
    ],
}
STEPS = {side: len(steps) for side, steps in DECISIONS.items()}
# sysfs writes of that move: 2 GPUs x 2 functions x (override, unbind, probe); from the VM the audio
# functions have no override to clear (PVE bound them, as the rig builds them).
WRITES = {"ct": 12, "vm": 10}


class Crash(BaseException):
    """The process dies: no except Exception and no rollback sees it."""


class CrashingWriter:
    def __init__(self, inner, after):
        self.inner, self.after, self.count = inner, after, 0

    def write(self, path, value, timeout):
        self.inner.write(path, value, timeout)
        self.count += 1
        if self.count == self.after:
            raise Crash(f"killed after write {self.count}")


def load_journal(rig):
    with open(rig.config.journal_path) as fh:
        return json.load(fh)


def other(side):
    return "vm" if side == "ct" else "ct"


def assert_consistent(rig: Rig, out):
    assert out.exit_code == EXIT_OK, out.reason
    drivers = rig.drivers()
    assert None not in drivers.values(), drivers  # every function bound to exactly one driver
    owner = out.result["owner"]
    if owner == "vm":
        assert set(drivers.values()) == {"vfio-pci"}
        assert (rig.api.status("qemu", VM), rig.api.status("lxc", CT)) == ("running", "stopped")
    else:
        assert owner == "ct"
        assert {d for b, d in drivers.items() if b.endswith(".0")} == {"nvidia"}
        assert {d for b, d in drivers.items() if b.endswith(".1")} == {"snd_hda_intel"}
        assert (rig.api.status("lxc", CT), rig.api.status("qemu", VM)) == ("running", "stopped")
    assert rig.host.active == {"nvidia-persistenced.service"}
    assert not os.path.exists(rig.config.journal_path)
    # And a fresh move either way works from there.
    assert rig.switcher().move(other(owner)).exit_code == EXIT_OK


def reboot(rig: Rig):
    rig.kernel.reboot("99999999-0000-0000-0000-000000000000")
    for key in rig.api.guests:
        rig.api.guests[key]["status"] = "stopped"
    rig.host.active = {"nvidia-persistenced.service"}


@pytest.mark.parametrize("origin", ["ct", "vm"])
def test_a_full_move_has_the_expected_size(make_rig, origin):
    rig = make_rig(owner=origin)
    writer = CrashingWriter(ThreadWriter(rig.kernel.write), after=None)
    out = rig.switcher(writer=writer).move(other(origin))
    assert out.exit_code == EXIT_OK and len(out.result["steps"]) == STEPS[origin] and writer.count == WRITES[origin]


@pytest.mark.parametrize("after_reboot", [False, True], ids=["same-boot", "after-reboot"])
@pytest.mark.parametrize("step", range(max(STEPS.values())))
@pytest.mark.parametrize("origin", ["ct", "vm"])
def test_killed_after_each_step_then_recover(tmp_path, origin, step, after_reboot):
    if step >= STEPS[origin]:
        pytest.skip("the move has fewer steps")
    rig = Rig(tmp_path, owner=origin)
    name, decision = DECISIONS[origin][step]
    done = []

    def crash(s):
        done.append(s.name)
        if len(done) == step + 1:
            raise Crash(s.name)

    with pytest.raises(Crash):
        rig.switcher(after_step=crash).move(other(origin))
    assert done[-1] == name
    journal = load_journal(rig)
    assert journal["origin"] == origin and journal["target"] == other(origin)
    if after_reboot:
        reboot(rig)
    out = rig.switcher().recover()
    assert out.result["recovery"]["same_boot"] is not after_reboot
    assert out.result["recovery"]["decision"] == decision
    assert_consistent(rig, out)
    assert out.result["owner"] == (origin if decision == "undo" else other(origin))


@pytest.mark.parametrize("after_reboot", [False, True], ids=["same-boot", "after-reboot"])
@pytest.mark.parametrize("write", range(1, max(WRITES.values()) + 1))
@pytest.mark.parametrize("origin", ["ct", "vm"])
def test_killed_after_each_sysfs_write_then_recover(tmp_path, origin, write, after_reboot):
    if write > WRITES[origin]:
        pytest.skip("the move has fewer writes")
    rig = Rig(tmp_path, owner=origin)
    writer = CrashingWriter(ThreadWriter(rig.kernel.write), after=write)
    with pytest.raises(Crash):
        rig.switcher(writer=writer).move(other(origin))
    journal = load_journal(rig)
    assert journal["write"]["address"] in rig.functions()
    if after_reboot:
        reboot(rig)
    out = rig.switcher().recover()
    assert_consistent(rig, out)
    if not after_reboot and journal["phase"] != "rebound":
        # Undo on the same boot restores each function exactly, override included.
        assert out.result["owner"] == origin


def test_a_crash_during_recover_is_recovered_too(rig):
    with pytest.raises(Crash):
        rig.switcher(writer=CrashingWriter(ThreadWriter(rig.kernel.write), after=7)).move("vm")
    with pytest.raises(Crash):
        rig.switcher(writer=CrashingWriter(ThreadWriter(rig.kernel.write), after=2)).recover()
    journal = load_journal(rig)
    assert journal["decision"] == "undo" and journal["command"] == "recover"
    out = rig.switcher().recover()
    assert out.result["recovery"]["decision"] == "undo"
    assert_consistent(rig, out)


def test_recover_removes_entries_an_undone_move_added(rig):
    def crash(s):
        if s.name == "guest-config":
            raise Crash(s.name)

    with pytest.raises(Crash):
        rig.switcher(after_step=crash).move("vm")
    assert "hostpci0" in rig.api.guests[("qemu", VM)]["config"]
    reboot(rig)  # the journal phase was "rebound": after the reboot, finishing means moving again
    out = rig.switcher().recover()
    assert out.result["recovery"]["decision"] == "finish"
    assert_consistent(rig, out)


def test_recover_without_a_journal_reports_and_changes_nothing(rig):
    out = rig.switcher().recover()
    assert out.exit_code == EXIT_OK and out.result["changed"] is False and out.result["owner"] == "ct"
    assert rig.kernel.writes == []


def test_recover_without_a_journal_on_split_gpus_asks_for_a_direction(rig):
    rig.kernel.write(os.path.join(rig.sysfs, "bus/pci/drivers/nvidia/unbind"), "0000:02:00.0")
    out = cli.run("recover", rig.switcher())
    assert out.exit_code == EXIT_STRANDED and "choose with gpu-switch to-vm or to-ct" in out.reason


def test_recover_dry_run_plans_without_changing(rig):
    with pytest.raises(Crash):
        rig.switcher(writer=CrashingWriter(ThreadWriter(rig.kernel.write), after=4)).move("vm")
    writes = len(rig.kernel.writes)
    out = rig.switcher().recover(dry_run=True)
    assert out.result["dry_run"] is True and out.result["steps"]
    assert len(rig.kernel.writes) == writes and os.path.exists(rig.config.journal_path)


def test_a_move_is_refused_while_a_journal_is_pending(rig):
    with pytest.raises(Crash):
        rig.switcher(writer=CrashingWriter(ThreadWriter(rig.kernel.write), after=2)).move("vm")
    out = cli.run("to-ct", rig.switcher())
    assert out.exit_code == EXIT_ROLLED_BACK
    assert "interrupted move (to-vm from ct to vm, phase rebinding, this boot)" in out.reason
    status = rig.switcher().status()
    assert status.result["journal"]["phase"] == "rebinding" and status.result["owner"] == "split"
