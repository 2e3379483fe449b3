"""Run a playbook through ansible-runner and build progress and a summary from its event stream."""

from __future__ import annotations

import io
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import ansible_runner


@dataclass
class PlayStats:
    name: str
    started: float
    seconds: float = 0.0
    tasks: int = 0
    ok: int = 0
    changed: int = 0
    failed: int = 0
    hosts: set[str] = field(default_factory=set)


@dataclass
class PlaybookResult:
    status: str = "unstarted"
    rc: int | None = None
    plays: list[PlayStats] = field(default_factory=list)
    hosts: set[str] = field(default_factory=set)
    changed_tasks: list[str] = field(default_factory=list)
    first_failure: str | None = None
    # (host, task, result) of every task that ended ok, for callers that read a module's return values.
    ok_results: list[tuple[str, str, dict]] = field(default_factory=list)

    def results_of(self, task: str) -> list[dict]:
        return [res for _, name, res in self.ok_results if name == task]

    @property
    def changed(self) -> int:
        return sum(p.changed for p in self.plays)

    @property
    def failed(self) -> int:
        return sum(p.failed for p in self.plays)


class EventPrinter:
    """Turns runner events into one line per task and keeps the counts of the summary."""

    def __init__(self, result: PlaybookResult, stream=None, show_output: bool = False):
        self.result = result
        self.stream = stream or sys.stdout
        self.show_output = show_output
        self.task = ""

    def _close_play(self) -> None:
        if self.result.plays:
            play = self.result.plays[-1]
            play.seconds = time.monotonic() - play.started

    def __call__(self, event: dict) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        host = data.get("host")
        if host:
            self.result.hosts.add(host)
            if self.result.plays:
                self.result.plays[-1].hosts.add(host)
        if kind == "playbook_on_play_start":
            self._close_play()
            self.result.plays.append(PlayStats(name=data.get("play", ""), started=time.monotonic()))
            print(f"  PLAY {data.get('play', '')}", file=self.stream, flush=True)
        elif kind == "playbook_on_task_start" and self.result.plays:
            self.task = data.get("task", "")
            self.result.plays[-1].tasks += 1
        elif kind == "runner_on_ok" and self.result.plays:
            play = self.result.plays[-1]
            play.ok += 1
            self.result.ok_results.append((host, self.task, data.get("res", {})))
            if data.get("res", {}).get("changed"):
                play.changed += 1
                self.result.changed_tasks.append(f"{host}: {self.task}")
                print(f"    changed  {host:<10} {self.task}", file=self.stream, flush=True)
                if self.show_output and event.get("stdout"):
                    print(event["stdout"], file=self.stream, flush=True)
        elif kind in {"runner_on_failed", "runner_on_unreachable"} and self.result.plays:
            if kind == "runner_on_failed" and data.get("ignore_errors"):
                return True
            self.result.plays[-1].failed += 1
            line = f"{host}: {self.task}: {failure_text(data.get('res', {}))}"
            self.result.first_failure = self.result.first_failure or line
            print(f"    FAILED   {line}", file=self.stream, flush=True)
        elif kind == "playbook_on_stats":
            self._close_play()
        return True


def failure_text(res: dict) -> str:
    """Why a task failed: its message, the command's last lines of stderr where it ran one, and for a loop the
    first failed item's, which its own message ("One or more items failed") does not say."""
    items = [item for item in res.get("results") or [] if isinstance(item, dict) and item.get("failed")]
    if items:
        label = items[0].get("_ansible_item_label")
        return f"{'item ' + str(label) + ': ' if label else ''}{failure_text(items[0])}"
    msg = str(res.get("msg") or "").strip()
    output = str(res.get("stderr") or res.get("stdout") or "").strip()
    tail = "\n".join(output.splitlines()[-15:])
    if msg and tail:
        return f"{msg}\n{tail}"
    return msg or tail or "failed"


def use_this_environment() -> None:
    """Put this interpreter's bin directory first on PATH, so the ansible-* commands that ansible-runner and
    the lab start are the locked ones of this environment even when it is not activated."""
    bindir = os.path.dirname(sys.executable)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bindir:
        os.environ["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", "")])


def run_playbook(
    playbook: Path,
    *,
    inventory: Path,
    private_dir: Path,
    project_dir: Path,
    check: bool = False,
    extravars: dict | None = None,
    limit: str | None = None,
    tags: str | None = None,
    env: dict[str, str] | None = None,
    quiet: bool = False,
) -> PlaybookResult:
    """Run one playbook, printing a line per change or failure; return the counts per play."""
    use_this_environment()
    result = PlaybookResult()
    cmdline = ["--diff"]
    if check:
        cmdline.append("--check")
    if tags:
        cmdline += ["--tags", tags]
    private_dir.mkdir(parents=True, exist_ok=True)
    envvars = {
        "ANSIBLE_CONFIG": str(project_dir / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "0",
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(project_dir / "containers.conf")),
        # The runner's own artifacts stay small: no fact cache of its own, no job event files kept.
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        **(env or {}),
    }
    runner = ansible_runner.run(
        private_data_dir=str(private_dir),
        project_dir=str(project_dir),
        playbook=str(playbook),
        inventory=str(inventory),
        cmdline=" ".join(cmdline),
        extravars=extravars or {},
        limit=limit,
        envvars=envvars,
        event_handler=EventPrinter(result, stream=io.StringIO() if quiet else None, show_output=check),
        quiet=True,
        rotate_artifacts=3,
    )
    result.status, result.rc = runner.status, runner.rc
    if runner.status != "successful" and not result.first_failure:
        result.first_failure = (runner.stdout.read()[-2000:] if runner.stdout else "") or f"rc {runner.rc}"
    return result
