"""Playbook runs against the lab: one ansible-playbook run through ansible-runner on the lab's inventory, its failure as
a LabError, an empty fact cache for a run that must see the machines as a new controller does, and what a run's
results say (the guests it left for later, the reasons host.yml gives for a reboot).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from inferhost.runner import PlaybookResult, run_playbook

from .context import ROOT, STATE, LabError, current_inventory


def cold_fact_cache(name: str) -> Path:
    """An empty fact cache of its own for one run, as on a controller that never saw the machines."""
    cache = STATE / "cold-facts" / name
    shutil.rmtree(cache, ignore_errors=True)
    return cache


def playbook(path: Path, *, fact_cache: Path | None = None, inventory: Path | None = None, **options):
    """One ansible-playbook run on the lab's inventory (default: the running lab's, of one host or two); options:
    run_playbook's (check, extravars, limit, tags); fact_cache: a directory of its own (a cold cache, as on another
    controller)."""
    env = {"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(fact_cache)} if fact_cache else None
    result = run_playbook(
        path,
        inventory=inventory or current_inventory(),
        private_dir=STATE / "runner",
        env=env,
        project_dir=ROOT,
        **options,
    )
    if result.status != "successful":
        name = path.relative_to(ROOT).as_posix()
        raise LabError(f"{name} {result.status}: {result.first_failure or 'see the output above'}")
    return result


def left_for_later(result: PlaybookResult) -> dict[str, str]:
    """The guests a run left for later because they are off (playbooks/tasks/guest_power.yml), with its words."""
    return {
        host: str(res.get("msg", ""))
        for host, task, res in result.ok_results
        if task.startswith("guest_power | Say which guest")
    }


def reboot_reasons(result: PlaybookResult) -> list[str]:
    """What host.yml said a reboot is owed for (its closing report), empty when nothing is owed."""
    reports = [res for _, task, res in result.ok_results if task.endswith("Report that a reboot is required")]
    return [line for report in reports if isinstance(report.get("msg"), list) for line in report["msg"][1:]]
