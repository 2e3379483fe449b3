"""The local lab end to end, over SSH as a real host is reached: the README's deployment order on fresh
machines, each playbook in its own run with an empty fact cache; then site.yml and --check change nothing,
the GPUs move to the VM and back through the playbook, and the real vLLM (its CPU build) serves the lab's test
checkpoint through the role's unit: validated, benchmarked, restarted after its engine dies."""

import json
import re
import shlex
import subprocess
import time

import pytest
from inference import bench
from lab_testlib import ansible_playbook, on, one_token, running, service, unit_state, watchdog_state
from pve_api import ApiError

from inferhost import lab as labmod

pytestmark = pytest.mark.lab
# The lab's service: the real vLLM (its CPU build) with the lab's test checkpoint.
UNIT = "inference-lab-vllm.service"


def test_the_lab_is_reached_over_ssh_with_its_host_keys_checked(lab):
    """No podman connection: the inventory's road is SSH, and a wrong host key is refused."""
    for host in lab.hosts:
        assert "ansible_connection" not in lab.hosts[host]
    argv = labmod.ssh_argv(lab, "lab-ct")
    ok = subprocess.run([*argv, "hostname"], capture_output=True, text=True, check=False)
    assert (ok.returncode, ok.stdout.strip()) == (0, "lab-ct")
    # lab-vm's host key under lab-ct's address: ssh must refuse it.
    known = (labmod.SSH_DIR / "known_hosts").read_text().splitlines()
    ct_line = next(line for line in known if line.startswith("[127.0.0.1]:2222 "))
    vm_key = next(line for line in known if line.startswith("[127.0.0.1]:2223 ")).split(" ", 1)[1]
    wrong = labmod.SSH_DIR / "known_hosts.wrong"
    wrong.write_text(f"{ct_line.split(' ', 1)[0]} {vm_key}\n")
    argv = [a if not a.startswith("UserKnownHostsFile=") else f"UserKnownHostsFile={wrong}" for a in argv]
    refused = subprocess.run([*argv, "true"], capture_output=True, text=True, check=False)
    assert refused.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in refused.stderr


# Before the deployment: the lab's machines are fresh until the first test that asks for `deployed`.
# What a run writes on a machine without changing what it configures: the journal, Ansible's own remote
# temporary files, the caches the modules read through (apt's package cache, Python's bytecode that the
# engine check leaves), and the mount points of other file systems (find -xdev lists them, not their content).
_NOT_CHANGES = re.compile(
    r"^/(var/log|var/cache|root/\.ansible|var/lib/systemd)/"
    r"|/__pycache__(/|$)|\.pyc$"
    r"|^/(run|tmp|dev|proc|sys)$"
)
_STAMP = "/var/tmp/inferhost-check-stamp"


def _written_since_stamp(lab) -> dict[str, list[str]]:
    """Per machine, every path on its root file system modified after the stamp, less _NOT_CHANGES and the
    directories whose only news is an entry of _NOT_CHANGES."""
    find = f"find / -xdev -newer {_STAMP} ! -path {_STAMP} -print | sort"
    written = {}
    for host in running(lab):
        paths = on(lab, host, find).splitlines()
        dropped = [path for path in paths if _NOT_CHANGES.search(path)]
        explained = {path.rsplit("/", 1)[0] or "/" for path in dropped}
        written[host] = [path for path in paths if path not in dropped and path not in explained]
    return written


def test_the_machines_follow_the_api_and_the_hookscript_guards_the_start(lab):
    """The VM the API has stopped is off; starting it through the API runs its hookscript's pre-start on the
    host, as PVE does. Before host.yml attached one, nothing guards it; the guard itself is proven below."""
    assert labmod.guest_status(lab) == ("running", "stopped")
    assert running(lab) == ["lab-ct", "lab-pve"]
    unreachable = subprocess.run([*labmod.ssh_argv(lab, "lab-vm"), "true"], capture_output=True, check=False)
    assert unreachable.returncode == 255


def test_a_fresh_lab_in_check_mode_shows_the_changes(lab):
    """Against machines that were never converged, --check lists the changes and makes none: no file on any
    machine is written (find -newer a stamp left just before) and the guests' API state stays as it was. The
    VM is off: the run says so by name and leaves it for later, with a success status."""
    for host in running(lab):
        on(lab, host, f"touch {_STAMP} && sleep 0.01")
    configs = labmod.guest_configs(lab)
    planned = labmod.converge(lab, check=True)
    assert planned.changed > 0
    changed_hosts = {line.split(":")[0] for line in planned.changed_tasks}
    assert {"lab-pve", "lab-ct"} <= changed_hosts and "lab-vm" not in changed_hosts
    assert list(labmod.left_for_later(planned)) == ["lab-vm"]
    assert "lab-vm left for later" in labmod.left_for_later(planned)["lab-vm"]
    assert _written_since_stamp(lab) == {host: [] for host in running(lab)}, "check mode wrote on the machines"
    assert labmod.guest_configs(lab) == configs, "check mode changed the guests' API state"


def test_the_host_play_on_a_fresh_host_wires_the_guests_and_reports_its_reboot(lab, deployed):
    """host.yml alone on a fresh host: the API module runs on the host, which has no proxmoxer until the role
    installs it, and the play ends with the reasons a reboot is owed for."""
    _, result = deployed["host.yml"]
    assert result.status == "successful" and result.changed > 0
    assert labmod.reboot_reasons(result), "host.yml on a fresh host reported no reboot reason"
    ct_config, vm_config = labmod.guest_configs(lab)
    assert sorted(k for k in vm_config if k.startswith("hostpci")) == [f"hostpci{n}" for n in range(8)]
    nodes = {v.split(",")[0] for k, v in ct_config.items() if k.startswith("dev") and k[3:].isdigit()}
    assert {f"/dev/nvidia{n}" for n in range(8)} | {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= nodes


def test_each_guest_play_runs_alone_with_a_cold_fact_cache(lab, deployed):
    for name in ("container.yml", "vm.yml"):
        _, result = deployed[name]
        assert result.status == "successful" and result.changed > 0, name
    assert "3/3 prompts answered well" in deployed["validate.yml"][1]
    assert deployed["gpu-switch to-vm"][1] == "owner=vm changed=True"
    assert deployed["gpu-switch to-ct"][1] == "owner=ct changed=True"


def test_the_container_play_alone_reads_the_hosts_driver_version(lab, deployed):
    """With no cached facts of the host, the container's driver role still learns the host's version (it
    refuses to run without it): a --check of that role, the NVIDIA repository's changes shown, not made."""
    result = labmod.playbook(
        labmod.ROOT / "playbooks" / "container.yml",
        check=True,
        extravars={"nvidia_userspace_install": True},
        tags="role::nvidia_userspace",
        fact_cache=labmod.cold_fact_cache("container-alone"),
    )
    assert result.status == "successful"
    # The version it compared is the one the host runs: with the host's module at another version (written into
    # the simulated GPUs' tree), the pin is refused, naming both (the module's version is put back afterwards).
    module = "/var/lib/inferhost-sim/sys/module/nvidia/version"
    on(lab, "lab-pve", f"cp -p {module} /root/nvidia-version.keep && echo 590.99.01 > {module}")
    try:
        with pytest.raises(
            labmod.LabError, match=r"userspace 590\.48\.01, but the host lab-pve runs the driver 590\.99\.01"
        ):
            labmod.playbook(
                labmod.ROOT / "playbooks" / "container.yml",
                check=True,
                extravars={"nvidia_userspace_install": True},
                tags="role::nvidia_userspace",
                fact_cache=labmod.cold_fact_cache("container-alone-other-driver"),
            )
    finally:
        on(lab, "lab-pve", f"cp /root/nvidia-version.keep {module}")


def test_after_the_deployment_site_yml_changes_nothing(lab, deployed):
    """The GPUs are with the container, the VM is off: site.yml converges the host and the container, and
    leaves the VM for later by name, with what to run."""
    again = labmod.converge(lab)
    assert again.changed == 0, f"site.yml after the deployment changed: {again.changed_tasks}"
    assert {"lab-pve", "lab-ct"} <= again.hosts
    why = labmod.left_for_later(again)
    assert list(why) == ["lab-vm"]
    assert "VM 201 is stopped on lab-pve, whose GPUs are with the ct" in " ".join(why["lab-vm"].split())
    assert "gpu-switch to-vm" in why["lab-vm"]


def test_check_mode_on_the_converged_lab_reports_nothing(lab, deployed):
    checked = labmod.converge(lab, check=True)
    assert checked.changed == 0, f"--check on a converged lab reports: {checked.changed_tasks}"


def test_gpu_switch_playbook_moves_the_gpus_to_the_vm_and_back(lab, deployed):
    assert labmod.guest_status(lab) == ("running", "stopped")

    assert labmod.move_gpus(lab, "vm").startswith("owner=vm gpus=8 changed=True")
    assert labmod.guest_status(lab) == ("stopped", "running")
    assert running(lab) == ["lab-pve", "lab-vm"]
    # The VM holds the GPUs: site.yml now converges it and leaves the container for later.
    held = labmod.converge(lab)
    assert held.changed == 0, held.changed_tasks
    assert list(labmod.left_for_later(held)) == ["lab-ct"]
    # The hookscript refuses to start the container while the VM holds the GPUs, and it stays off.
    api, ct = labmod.api_client(lab), labmod.lab_node(lab)["container"]["vmid"]
    with pytest.raises(ApiError, match="hookscript error for 101 on pre-start"):
        api.wait(api.post("lxc", ct, "start"), 30, "CT start")
    assert running(lab) == ["lab-pve", "lab-vm"] and labmod.guest_status(lab)[0] == "stopped"

    assert labmod.move_gpus(lab, "ct").startswith("owner=ct gpus=8 changed=True")
    assert labmod.guest_status(lab) == ("running", "stopped")

    # Asking for where the GPUs already are changes nothing.
    assert labmod.move_gpus(lab, "ct").startswith("owner=ct gpus=8 changed=False")


def test_validate_asks_the_service_its_questions(lab, deployed):
    assert "3/3 prompts answered well" in labmod.validate(lab)


def test_the_key_is_on_no_command_line_and_in_no_environment_another_user_can_read(lab, deployed):
    """The unit hands the key from its root-only file to the engine: no process shows it in its command line,
    and only the service's own user (and root) could read an environment that holds it."""
    key = lab.hosts["lab-ct"]["inference_service_api_key"]
    # Nothing here carries the key on its own command line: the processes are listed, the key looked for here.
    cmdlines = on(lab, "lab-ct", "for p in /proc/[0-9]*; do echo \"$p $(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\"; done")
    assert [line for line in cmdlines.splitlines() if key in line] == []
    # The environments that hold the key's variables are the service's user's (vLLM's process titles write over
    # the environment block the kernel shows, so the engine's own may show none).
    holders = on(
        lab, "lab-ct",
        "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null"
        " | grep -q '^VLLM_API_KEY=\\|^INFERHOST_API_KEY=' && stat -c %U $p; done | sort -u",
    ).split()  # fmt: skip
    assert set(holders) <= {lab.hosts["lab-ct"].get("inference_service_user", "inferhost")}, holders
    # And the engine holds it: without it, 401.
    port = service(lab)["port"]
    url = f"http://127.0.0.1:{port}/v1/models"
    ask = f"import urllib.request as u\ntry: u.urlopen('{url}')\nexcept Exception as e: print(e)"
    assert "401" in on(lab, "lab-ct", f"python3 -c {shlex.quote(ask)}")
    mode = on(lab, "lab-ct", "stat -c '%a %U' /etc/inferhost/services/lab-vllm.secret.env")
    assert mode == "600 root"


def test_the_engine_listens_only_on_the_address_the_inventory_gives(lab, deployed):
    """/proc/net/tcp{,6} as the kernel has them: the service's port is bound to bind_address alone."""
    port = service(lab)["port"]
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in on(lab, "lab-ct", f"cat {table}").splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:
                listening.add(address)
    # 127.0.0.1 in the kernel's little-endian hex.
    assert listening == {"0100007F"}, listening


def test_the_benchmark_measures_the_service_with_vllms_own_benchmark(lab, deployed, tmp_path):
    """benchmark.yml as a user runs it, on a short sweep: `vllm bench serve` from the service's environment, one
    run per level, its JSON fetched, the table, the plot and the ceiling written on the controller."""
    result = labmod.playbook(
        labmod.ROOT / "playbooks" / "benchmark.yml",
        extravars={
            "benchmark_concurrency": [1, 4],
            "benchmark_input_tokens": 64,
            "benchmark_output_tokens": 32,
            "benchmark_output_dir": str(tmp_path),
        },
    )
    assert result.status == "successful"
    out = tmp_path / "lab-ct-lab-vllm"
    assert sorted(p.name for p in out.glob("vllm-c*.json")) == ["vllm-c1.json", "vllm-c4.json"]
    report = json.loads((out / "benchmark.json").read_text())
    levels = {lv["concurrency"]: lv for lv in report["result"]["levels"]}
    assert sorted(levels) == [1, 4]
    for concurrency, level in levels.items():
        assert (level["requests"], level["failed"]) == (concurrency * 2, 0), level
        assert level["output_tok_s"] > 0 and level["ttft_ms"]["median"] > 0, level
    assert "vllm bench serve" in (out / "benchmark.md").read_text()
    assert (out / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Kept for the lab's record: the table of this run.
    (labmod.STATE / "benchmark.md").write_text((out / "benchmark.md").read_text())


def _serving_again(lab, since, bound=360):
    """Seconds from ``since`` until a one-token completion comes back (an AssertionError after ``bound``)."""
    while time.monotonic() - since < bound:
        if one_token(lab) == "ok":
            return time.monotonic() - since
        time.sleep(2)
    raise AssertionError(on(lab, "lab-ct", f"journalctl -u {UNIT} -u inferhost-watchdog --no-pager -n 60"))


def test_a_hung_engine_that_still_answers_health_is_restarted_by_the_watchdog(lab, deployed):
    """The engine core stopped (SIGSTOP: hung, not dead): /health and /v1/models still answer 200 and the unit stays
    active, so only a judgment by generation sees it. The watchdog restarts the service with no play run."""
    before = watchdog_state(lab)["services"]["lab-vllm"]
    assert before["verdict"] == "ok", before
    on(lab, "lab-ct", "pkill -STOP -f '^VLLM::EngineCore'")
    stopped = time.monotonic()
    health = on(
        lab,
        "lab-ct",
        "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/health').status)\"",
    )
    assert health == "200"  # what no check may count as alive
    seconds = _serving_again(lab, stopped)
    after = watchdog_state(lab)["services"]["lab-vllm"]
    new = after["restarts"][len(before["restarts"]) :]
    assert len(new) == 1 and "not generating" in new[0]["reason"], after
    journal = on(lab, "lab-ct", "journalctl -u inferhost-watchdog --no-pager -o cat")
    assert "restarting it" in journal and "not generating" in journal
    record = {"hung engine: serving again after (s)": round(seconds, 1)}
    (labmod.STATE / "watchdog-recovery.json").write_text(json.dumps(record))


def test_a_saturated_service_is_judged_busy_and_never_restarted(lab, deployed):
    """vLLM's own benchmark at concurrency 64 for at least a minute: the watchdog judges the engine by its token
    counters (a one-token request would queue behind 64 others), restarts nothing, and no request fails."""
    svc = service(lab)
    argv, result = bench.bench_argv(
        svc,
        url=f"http://127.0.0.1:{svc['port']}",
        served_name=svc["model"]["served_name"],
        concurrency=64,
        rounds=4,
        input_tokens=32,
        output_tokens=1024,
        api="completions",
        result_dir="/tmp/inferhost-saturation",
    )
    key = "sed -n 's/^INFERHOST_API_KEY=\"\\(.*\\)\"/\\1/p' /etc/inferhost/services/lab-vllm.secret.env"
    run = f"mkdir -p /tmp/inferhost-saturation && OPENAI_API_KEY=$({key}) {shlex.join(argv)} >/dev/null 2>&1"
    before = (unit_state(lab, "lab-ct", UNIT), watchdog_state(lab)["services"]["lab-vllm"])
    began, totals = time.monotonic(), {"completed": 0, "failed": 0, "runs": 0}
    while time.monotonic() - began < 60:
        on(lab, "lab-ct", run)
        figures = json.loads(on(lab, "lab-ct", f"cat {result}"))
        totals = {
            "completed": totals["completed"] + figures["completed"],
            "failed": totals["failed"] + figures["failed"],
            "runs": totals["runs"] + 1,
        }
    seconds = time.monotonic() - began
    after = (unit_state(lab, "lab-ct", UNIT), watchdog_state(lab)["services"]["lab-vllm"])
    assert totals["failed"] == 0 and totals["completed"] == totals["runs"] * 256, totals
    assert after[0]["MainPID"] == before[0]["MainPID"] and after[0]["NRestarts"] == before[0]["NRestarts"]
    assert after[1]["restarts"] == before[1]["restarts"], after[1]
    assert after[1]["judged"]["busy"] > before[1]["judged"]["busy"], after[1]  # judged busy, by its counters
    path = labmod.STATE / "watchdog-recovery.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    record["saturation at concurrency 64"] = {**totals, "seconds": round(seconds, 1), "restarts": 0}
    path.write_text(json.dumps(record))


# In the container: a streamed completion; once its first tokens came, a planned stop of the unit (a restart, as a
# changed unit or a key rotation does) and a new request during the drain. Prints what each got, as JSON.
_STREAM_THROUGH_A_RESTART = """
import json, re, subprocess, threading, time, urllib.request as u
secret = open('/etc/inferhost/services/lab-vllm.secret.env').read()
key = re.search(r'INFERHOST_API_KEY="?([^"\\n]*)', secret)[1]
def post(body, timeout):
    data = json.dumps({'model': MODEL, 'prompt': 'Write about the sea.', 'ignore_eos': True, **body}).encode()
    r = u.Request(URL + '/v1/completions', data=data,
                  headers={'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'})
    return u.urlopen(r, timeout=timeout)
chunks, finish, generated, late = 0, None, None, {}
def late_request():
    try:
        with post({'max_tokens': 4}, 30) as answer:
            late['status'] = answer.status
            late['tokens'] = json.load(answer)['usage']['completion_tokens']
    except Exception as e:
        late['error'] = str(e)
body = {'max_tokens': TOKENS, 'stream': True, 'stream_options': {'include_usage': True}}
with post(body, 120) as stream:
    for raw in stream:
        line = raw.decode().strip()
        if not line.startswith('data: {'):
            continue
        chunk = json.loads(line[6:])
        generated = (chunk.get('usage') or {}).get('completion_tokens', generated)
        if not chunk.get('choices'):
            continue
        chunks += 1
        finish = chunk['choices'][0].get('finish_reason') or finish
        if chunks == 20:
            subprocess.run(['systemctl', 'restart', '--no-block', UNIT], check=True)
            time.sleep(1)
            threading.Thread(target=late_request).start()
time.sleep(2)
print(json.dumps({'chunks': chunks, 'finish': finish, 'generated': generated, 'late': late}))
"""


def test_a_planned_stop_lets_the_requests_in_flight_finish(lab, deployed):
    """A restart of the unit while a completion streams: the engine's main process alone gets SIGTERM
    (KillMode=mixed) and vLLM drains (--shutdown-timeout): the stream gets every token it asked for, and a request
    that comes during the drain is refused before it starts rather than cut."""
    svc, tokens = service(lab), 1500
    unit_file = on(lab, "lab-ct", f"cat /etc/systemd/system/{UNIT}")
    assert "KillMode=mixed" in unit_file and "--shutdown-timeout" in unit_file
    script = _STREAM_THROUGH_A_RESTART.replace("URL", repr(f"http://127.0.0.1:{svc['port']}"))
    script = script.replace("MODEL", repr(svc["model"]["served_name"])).replace("TOKENS", str(tokens))
    script = script.replace("UNIT", repr(UNIT))
    before = unit_state(lab, "lab-ct", UNIT)
    seen = json.loads(on(lab, "lab-ct", f"python3 -c {shlex.quote(script)}").splitlines()[-1])
    assert seen["finish"] == "length" and seen["generated"] == tokens, seen
    assert "error" in seen["late"] or seen["late"].get("tokens") == 4, seen  # refused, never cut
    _serving_again(lab, time.monotonic())
    assert unit_state(lab, "lab-ct", UNIT)["MainPID"] != before["MainPID"]
    drains = on(lab, "lab-ct", f"journalctl -u {UNIT} --no-pager -o cat --grep 'stopping engine client mode=' || true")
    assert drains.splitlines()[-1].endswith("mode=drain timeout=60s"), drains


def test_the_service_comes_back_every_time_its_engine_dies_with_no_play(lab, deployed):
    """Three kills of vLLM's engine core in a row: systemd restarts the unit twice (Restart=always), the third start
    hits its start limit and the watchdog starts it (a unit that failed on its own). Serving again each time (a
    completion comes back), with no play; then a converge of the role changes nothing."""
    times = []
    for _ in range(3):
        before = unit_state(lab, "lab-ct", UNIT)
        on(lab, "lab-ct", "pkill -KILL -f '^VLLM::EngineCore'")
        killed = time.monotonic()
        # The API server exits once its engine core is gone; wait for the new process before asking.
        while unit_state(lab, "lab-ct", UNIT)["MainPID"] in (before["MainPID"], "0"):
            assert time.monotonic() - killed < 120, on(lab, "lab-ct", f"journalctl -u {UNIT} --no-pager -n 40")
            time.sleep(1)
        times.append(round(_serving_again(lab, killed), 1))
    # The role finds the service served (its wait asks a completion) and owes it nothing.
    rc, out = ansible_playbook(lab, "playbooks/container.yml", "--tags", "role::inference_service")
    assert rc == 0 and not re.search(r"changed=[1-9]", out), out[-3000:]
    path = labmod.STATE / "watchdog-recovery.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**record, "engine killed: serving again after (s), three in a row": times}))


# --- mistakes that only the machines can show: refused before any change, naming the variable -------------


@pytest.mark.parametrize(
    ("tags", "variable"),
    # Alone, gpu_switch still runs its dependency pve_api, which tries the login.
    [(None, "pve_api_password"), ("role::gpu_switch", "pve_api_password")],
)
def test_a_wrong_proxmox_password_is_refused_before_it_is_stored(lab, deployed, tags, variable):
    """The login is tried first: the run fails naming the variable, the host's password file and the guests'
    API state stay as they were, and the wrong password appears nowhere in the output."""
    wrong = "wrong-canary-5d1f"
    password_file = on(lab, "lab-pve", "sha256sum /etc/gpu-switch/password")
    before = labmod.guest_configs(lab)
    argv = ["-e", f"vault_proxmox_password={wrong}", *(["--tags", tags] if tags else [])]
    rc, out = ansible_playbook(lab, "playbooks/host.yml", *argv)
    assert rc != 0, out[-3000:]
    assert variable in out and "could not log in" in out, out[-3000:]
    assert wrong not in out
    assert "changed=0" in out and not re.search(r"changed=[1-9]", out), out[-3000:]
    assert on(lab, "lab-pve", "sha256sum /etc/gpu-switch/password") == password_file
    assert labmod.guest_configs(lab) == before


def test_adding_or_removing_an_inactive_service_does_not_restart_the_active_one(lab, deployed):
    unit = UNIT
    started = on(lab, "lab-ct", f"systemctl show -p MainPID -p ActiveEnterTimestampMonotonic {unit}")
    services = lab.hosts["lab-ct"]["inference_service_services"]
    other = {**services[0], "name": "lab-vllm-b", "port": 8001}
    for listed in ([*services, other], services):
        rc, out = ansible_playbook(lab, 
            "playbooks/container.yml", "--tags", "role::inference_service",
            "-e", json.dumps({"inference_service_services": listed}),
        )  # fmt: skip
        assert rc == 0, out[-3000:]
        now = on(lab, "lab-ct", f"systemctl show -p MainPID -p ActiveEnterTimestampMonotonic {unit}")
        assert now == started, out[-6000:]
    assert on(lab, "lab-ct", "systemctl is-active inference-lab-vllm-b.service || true") == "inactive"


def test_a_flag_the_engine_refuses_stops_the_play_before_the_running_service_is_touched(lab, deployed):
    """The engine in the service's environment parses the unit's command line first: a misspelt flag fails
    the play naming the service, the flag and the release, and the running unit is neither rewritten nor
    restarted."""
    unit = UNIT
    started = on(lab, "lab-ct", f"systemctl show -p MainPID -p ActiveEnterTimestampMonotonic {unit}")
    unit_file = on(lab, "lab-ct", f"sha256sum /etc/systemd/system/{unit}")
    [service] = lab.hosts["lab-ct"]["inference_service_services"]
    bad = {**service, "args": {**service.get("args", {}), "enable-prefix-cachng": True}}
    rc, out = ansible_playbook(lab, 
        "playbooks/container.yml", "--tags", "role::inference_service",
        "-e", json.dumps({"inference_service_services": [bad]}),
    )  # fmt: skip
    assert rc != 0, out[-3000:]
    assert re.search(
        r"lab-vllm: vllm 0\.32\.0\+cpu refuses its command line: unrecognized arguments: --enable-prefix-cachng", out
    )
    assert not re.search(r"changed=[1-9]", out), out[-3000:]
    assert on(lab, "lab-ct", f"sha256sum /etc/systemd/system/{unit}") == unit_file
    assert on(lab, "lab-ct", f"systemctl show -p MainPID -p ActiveEnterTimestampMonotonic {unit}") == started


def test_the_container_sees_its_hosts_gpus_as_an_lxc_container_does(lab, deployed):
    """Device nodes from its devN entries, the host's PCI devices in /sys, the stand-in driver's nvidia-smi: a
    GPU the host takes off nvidia is gone from nvidia-smi and the guard refuses the service on it, before the engine
    starts."""
    config = labmod.guest_configs(lab)[0]
    entries = sorted(v.split(",")[0] for k, v in config.items() if re.fullmatch(r"dev\d+", k))
    assert on(lab, "lab-ct", "ls -d /dev/nvidia*").split() == entries
    addresses = [g["address"] for g in lab.hosts["lab-pve"]["inferhost_gpus"]]
    smi = "nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader"
    assert on(lab, "lab-ct", smi).splitlines() == [f"{i}, 0000{a.upper()}" for i, a in enumerate(addresses)]

    unit, gpu = UNIT, addresses[0]
    on(lab, "lab-pve", f"echo {gpu} > /sys/bus/pci/drivers/nvidia/unbind")
    try:
        since = on(lab, "lab-ct", "date +%s")
        restart = [*labmod.ssh_argv(lab, "lab-ct"), f"systemctl restart {unit}"]
        assert subprocess.run(restart, capture_output=True, check=False).returncode != 0
        journal = on(lab, "lab-ct", f"journalctl -u {unit} --since @{since} --no-pager")
        assert f"GPU {gpu} is bound to no driver (not usable here)" in journal
        assert "0, " not in [line[:3] for line in on(lab, "lab-ct", smi).splitlines()]
    finally:
        on(lab, "lab-pve", f"echo {gpu} > /sys/bus/pci/drivers/nvidia/bind")
    # Left stopped: the engine's next start costs a minute; test_lab_cluster.py starts it while its second host
    # comes up.
    on(lab, "lab-ct", f"systemctl reset-failed {unit}")
