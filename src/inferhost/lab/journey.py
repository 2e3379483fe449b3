"""What the lab does, step by step, and what each of its commands runs.

The bring-up (images, fake API, stand-in NVIDIA repository, machines, guests powered as the API has them,
stand-in engine), the converge of site.yml, the GPU moves with playbooks/gpu_switch.yml, the validation, the
README's deployment order with a cold fact cache per step, and the summary printed after them; then the bodies of
`inferhost-lab up`, `converge`, `deploy`, `ssh`, `status` and `down`, which cli.py calls once it has parsed
the arguments. Each step is timed through Lab.step and fails with a LabError.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import time
from pathlib import Path

from inferhost.runner import PlaybookResult
from inferhost.sim import apt_repo, checkpoint, engine_index

from .api import api_summary, fakepve_pid, remove_fakepve_files, start_fakepve, stop_fakepve
from .context import (
    CONTAINER_PREFIX,
    ENGINE_INDEX,
    HOST_COUNT,
    ROOT,
    STANDIN_REPO,
    STATE,
    UV_CACHE,
    Lab,
    LabError,
    pve_host,
    pve_hosts,
)
from .machines import (
    build_images,
    machine_running,
    podman,
    power_machines,
    reboot_host,
    remove_containers,
    remove_network,
    start_containers,
)
from .playbooks import cold_fact_cache, left_for_later, playbook
from .ssh import SSH_DIR, ssh_argv

# The project's pinned uv (scripts/bootstrap.sh) makes the test checkpoint's trainer environment (torch and
# transformers at the engine's versions), which makes the checkpoints, one per input (src/inferhost/sim/checkpoint).
UV = ROOT / ".cache" / "tools" / "bin" / "uv"
TRAINER = STATE / "trainer"
CHECKPOINTS = STATE / "checkpoint"


# --- the bring-up -----------------------------------------------------------------------------------


def build_standin_repo(lab: Lab) -> str:
    """The lab's NVIDIA repository: the wing's signed stand-in (src/inferhost/sim/apt_repo.py) with the packages
    of lab_standin_repo, and headers for the kernel the machines run (this machine's), as a distribution has
    them for its own kernels. Built once per specification."""
    standin = next(iter(lab.hosts.values()))["lab_standin_repo"]
    versions = standin["driver_versions"]
    spec = {
        "nvidia": {"driver_versions": versions},
        "guest": {"driver_versions": versions, "kernels": [platform.release()]},
        "cuda": standin["cuda"],
    }
    try:
        built = apt_repo.build(str(STANDIN_REPO), spec)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise LabError(f"the stand-in NVIDIA repository: {exc}") from exc
    return "built" if built else "unchanged"


def build_engine_index(lab: Lab) -> str:
    """The stand-in of vLLM's index of CPU wheels (lab_engine_index), mounted in the containers."""
    wheels = next(iter(lab.hosts.values()))["lab_engine_index"]["wheels"]
    try:
        return "built" if engine_index.build(ENGINE_INDEX, wheels) else "unchanged"
    except (OSError, LookupError, ValueError) as exc:
        raise LabError(f"the stand-in of vLLM's CPU wheel index: {exc}") from exc


CHECKPOINT_STAMP = "/var/lib/inferhost-lab/checkpoint"


def served_checkpoints(lab: Lab, host: str) -> list[str]:
    """Where the host's vLLM services read their checkpoint: the lab puts its test checkpoint there."""
    return sorted({s["model"]["path"] for s in lab.hosts[host]["inference_service_services"] if s["engine"] == "vllm"})


def install_checkpoint(lab: Lab) -> str:
    """The lab's test checkpoint (src/inferhost/sim/checkpoint: made and trained here once per input), copied
    where the containers' vLLM services read it, as a site downloads its model before the first converge."""
    containers = [h for h in sorted(lab.groups.get("inference_containers", [])) if machine_running(h)]
    if not containers:
        return "no container runs"
    try:
        made = checkpoint.ensure(
            CHECKPOINTS, checkpoint.ensure_trainer(TRAINER, UV, cache=UV_CACHE, index=ENGINE_INDEX / "simple")
        )
    except checkpoint.CheckpointError as exc:
        raise LabError(f"the test checkpoint: {exc}") from exc
    key = made.name
    copied = []
    for host in containers:
        name = CONTAINER_PREFIX + host
        if podman("exec", name, "cat", CHECKPOINT_STAMP, check=False).stdout.strip() == key:
            continue
        for path in served_checkpoints(lab, host):
            podman("exec", name, "rm", "-rf", path)
            podman("exec", name, "mkdir", "-p", str(Path(path).parent))
            podman("cp", f"{made}/.", f"{name}:{path}")
            podman("exec", name, "chmod", "-R", "u=rwX,go=rX", path)
        podman("exec", name, "sh", "-c", f"mkdir -p {Path(CHECKPOINT_STAMP).parent} && echo {key} > {CHECKPOINT_STAMP}")
        copied.append(host)
    return f"{made.name}: " + (f"copied to {', '.join(copied)}" if copied else "in place")


def bring_up(lab: Lab) -> None:
    """Everything the lab needs before its first converge, each step kept when it is in place already: the
    images, the fake API, the stand-in repository, the machines (the host with its GPUs first), each guest's
    machine on or off as the API has it, and the stand-in engine in the containers that run."""
    STATE.mkdir(parents=True, exist_ok=True)
    HOST_COUNT.write_text(f"{len(pve_hosts(lab))}\n")  # what the commands that follow run on
    lab.step("base images", build_images, lab)
    lab.step("fake Proxmox API", start_fakepve, lab)
    lab.step("stand-in NVIDIA repository", build_standin_repo, lab)
    lab.step("stand-in of vLLM's CPU wheel index", build_engine_index, lab)
    lab.step("podman machines", start_containers, lab)
    lab.step("guests powered as the API has them", power_machines, lab)
    lab.step("test checkpoint", install_checkpoint, lab)


# --- the stack on the lab ---------------------------------------------------------------------------


def converge(lab: Lab, check: bool = False) -> PlaybookResult:
    return playbook(ROOT / "site.yml", check=check, inventory=lab.inventory)


def move_gpus(lab: Lab, to: str, hosts: str | None = None) -> str:
    """playbooks/gpu_switch.yml, as a user runs it, on every host or on those of the pattern hosts
    (gpu_switch_hosts); returns where each host's GPUs are and what its move did."""
    extravars = {"gpu_switch_to": to, **({"gpu_switch_hosts": hosts} if hosts else {})}
    result = playbook(ROOT / "playbooks" / "gpu_switch.yml", extravars=extravars, inventory=lab.inventory)
    moves = {host: res for host, task, res in result.ok_results if task == "Move the GPUs to the requested guest"}
    if not moves:
        raise LabError("gpu_switch.yml reported no move")
    notes = []
    for host, move in sorted(moves.items()):
        if move.get("owner") != to:
            raise LabError(f"{host}: gpu-switch to-{to} left the GPUs with {move.get('owner')}")
        done = sum(1 for step in move.get("steps", []) if step.get("state") == "done")
        notes.append(
            f"{host + ': ' if len(moves) > 1 else ''}owner={move['owner']} gpus={len(move.get('gpus', []))} "
            f"changed={move.get('changed')} CT {move['container']['status']}, VM {move['vm']['status']}, {done} steps"
        )
    return "; ".join(notes)


def gpu_switch_over_ssh(lab: Lab, to: str, host: str | None = None) -> str:
    """`ssh root@<host> gpu-switch to-<guest>`, as the README's deployment order has the user do it."""
    host = host or pve_host(lab)
    argv = [*ssh_argv(lab, host), "gpu-switch", "--json", f"to-{to}"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"gpu-switch to-{to} on {host} (rc {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    report = json.loads(proc.stdout)
    if report.get("owner") != to:
        raise LabError(f"gpu-switch to-{to} left the GPUs with {report.get('owner')}")
    return f"owner={report['owner']} changed={report.get('changed')}"


def deploy_in_order(lab: Lab) -> list[tuple[str, float, str, object]]:
    """The README's first deployment, each step on its own with a cold fact cache, as a user runs it: host.yml,
    the host's reboot, host.yml again, container.yml, validate.yml on the container, gpu-switch to-vm, vm.yml,
    gpu-switch to-ct. Each step as (name, seconds, note, what it returned)."""
    playbooks = ROOT / "playbooks"
    steps = [
        ("host.yml", lambda cache: playbook(playbooks / "host.yml", fact_cache=cache, inventory=lab.inventory)),
        ("reboot the host", lambda _: reboot_host(lab)),
        # As the README says: after the reboot, host.yml again (its facts now name the module that runs).
        (
            "host.yml after the reboot",
            lambda cache: playbook(playbooks / "host.yml", fact_cache=cache, inventory=lab.inventory),
        ),
        (
            "container.yml",
            lambda cache: playbook(playbooks / "container.yml", fact_cache=cache, inventory=lab.inventory),
        ),
        ("validate.yml", lambda cache: validate(lab, fact_cache=cache)),
        ("gpu-switch to-vm", lambda _: gpu_switch_over_ssh(lab, "vm")),
        ("vm.yml", lambda cache: playbook(playbooks / "vm.yml", fact_cache=cache, inventory=lab.inventory)),
        ("gpu-switch to-ct", lambda _: gpu_switch_over_ssh(lab, "ct")),
    ]
    done = []
    for number, (name, run) in enumerate(steps):
        cache = cold_fact_cache(f"deploy-{number}")
        print(f"==> deployment order: {name} (empty fact cache)", flush=True)
        start = time.monotonic()
        result = run(cache)
        done.append((name, time.monotonic() - start, result if isinstance(result, str) else "", result))
    return done


def validate(lab: Lab, fact_cache: Path | None = None, active: str | None = None) -> str:
    """playbooks/validate.yml's smoke check against the containers' service (the lab's GPUs have no driver or CUDA);
    active: the service to ask, when a run made another one active than the inventory's (-e, as a user switches)."""
    extravars = {"validate_checks": ["smoke"], "validate_hosts": "inference_containers"}
    if active is not None:
        extravars["inference_service_active"] = active
    result = playbook(
        ROOT / "playbooks" / "validate.yml", extravars=extravars, fact_cache=fact_cache, inventory=lab.inventory
    )
    smoke = result.results_of("Ask for one token, the prompts, a tool call and a metric")
    if not smoke:
        raise LabError("validate.yml asked no questions: is inference_service_active set for the lab container?")
    return "; ".join(str(r.get("msg", "")) for r in smoke)


def print_summary(lab: Lab, result: PlaybookResult | None) -> None:
    print("\nLab summary")
    width = max(len(name) for name, _, _ in lab.timings) if lab.timings else 10
    for name, secs, note in lab.timings:
        print(f"  {name:<{width}}  {secs:7.1f} s  {note}")
    if result:
        print("\n  site.yml by play:")
        for play in result.plays:
            print(
                f"    {play.name:<40} {play.seconds:6.1f} s  tasks={play.tasks:<3} ok={play.ok:<3} "
                f"changed={play.changed:<3} failed={play.failed}"
            )
        print(f"  total: changed={result.changed} failed={result.failed} on {len(result.hosts)} hosts")
        for host, why in sorted(left_for_later(result).items()):
            print(f"  {host}: {why.split(': ', 1)[-1]}")


# --- the commands -----------------------------------------------------------------------------------


def _converge_step(lab: Lab, check: bool) -> PlaybookResult:
    """site.yml as a timed step, its note the number of changes."""
    result = lab.step("converge site.yml" + (" (check)" if check else ""), converge, lab, check)
    lab.timings[-1] = (*lab.timings[-1][:2], f"changed={result.changed}")
    return result


def up(check: bool, host_count: int = 1) -> None:
    """`inferhost-lab up`: the bring-up, site.yml, the GPUs to the VM for vm.yml and back, the validation; on each
    host of a lab of two. A lab of one host that runs takes its second host in: the fake API has its node already."""
    lab = Lab.from_inventory(host_count)
    bring_up(lab)
    result = _converge_step(lab, check)
    if not check:
        # The VM is off while the container holds the GPUs: site.yml left it for later. Converge it holding them.
        lab.step("gpu-switch to-vm", move_gpus, lab, "vm")
        lab.step(
            "vm.yml", lambda: f"changed={playbook(ROOT / 'playbooks' / 'vm.yml', inventory=lab.inventory).changed}"
        )
        lab.step("gpu-switch to-ct", move_gpus, lab, "ct")
        lab.step("validate.yml (smoke)", validate, lab)
    lab.step("Proxmox API state", api_summary, lab)
    print_summary(lab, result)


def converge_again(check: bool) -> None:
    """`inferhost-lab converge`: site.yml against the running lab."""
    lab = Lab.from_inventory()
    result = _converge_step(lab, check)
    print_summary(lab, result)


def deploy() -> None:
    """`inferhost-lab deploy`: the README's deployment order against the running lab."""
    lab = Lab.from_inventory()
    for name, secs, note, _ in deploy_in_order(lab):
        lab.timings.append((name, secs, note))
    print_summary(lab, None)


def shell(host: str, command: list[str]) -> int:
    """`inferhost-lab ssh`: a shell or a command on a lab machine; its exit status."""
    lab = Lab.from_inventory()
    if host not in lab.hosts:
        raise LabError(f"no lab machine {host!r} (known: {', '.join(sorted(lab.hosts))})")
    return subprocess.run([*ssh_argv(lab, host), *command], check=False).returncode


def status() -> None:
    """`inferhost-lab status`: the fake API, each machine's state, the guests' status on the API."""
    lab = Lab.from_inventory()
    pid = fakepve_pid()
    print(f"fake Proxmox API: {f'running (pid {pid})' if pid else 'stopped'}")
    for host in sorted(lab.hosts):
        state = podman("container", "inspect", "--format", "{{.State.Status}}", CONTAINER_PREFIX + host, check=False)
        print(f"{host}: {state.stdout.strip() if state.returncode == 0 else 'absent'}")
    if pid:
        print(f"API: {api_summary(lab)}")


def down() -> None:
    """`inferhost-lab down`: the machines removed (those of a lab of two hosts, whichever ran), the fake API stopped,
    its files, the guests' network and the SSH keys gone."""
    lab = Lab.from_inventory(2)
    remove_containers(lab)
    stop_fakepve()
    remove_fakepve_files()
    remove_network(lab)
    HOST_COUNT.unlink(missing_ok=True)
    # The next lab gets new keys.
    shutil.rmtree(SSH_DIR, ignore_errors=True)
    print("lab removed")
