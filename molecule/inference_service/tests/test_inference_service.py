"""The inference units under systemd: readiness, the GPU guard, Conflicts=, restart after a crash."""

import json
import re
import shlex
import time

import pytest

KEY = "molecule-key"
UNIT_A, UNIT_B = "inference-svc-a.service", "inference-svc-b.service"
NODE = "/dev/nvidia1"


def show(host, unit, *props):
    out = host.check_output(f"systemctl show {unit} --property {','.join(props)}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def python_get(host, port, path, key=KEY):
    """GET through the container's python3 (curl may not be installed): (status, text)."""
    code = (
        "import sys, urllib.request, urllib.error\n"
        f"r = urllib.request.Request('http://127.0.0.1:{port}{path}')\n"
        + (f"r.add_header('Authorization', 'Bearer {key}')\n" if key else "")
        + "try:\n    res = urllib.request.urlopen(r, timeout=10); print(res.status); print(res.read().decode())\n"
        "except urllib.error.HTTPError as e:\n    print(e.code); print(e.read().decode())\n"
    )
    out = host.check_output(f"python3 -c {shlex.quote(code)}")
    status, _, text = out.partition("\n")
    return int(status), text


def wait_until(predicate, timeout=60, step=0.5, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


def journal(host, unit, since):
    return host.check_output(f"journalctl -u {unit} --since @{since} --no-pager -o cat")


HOLDERS = []


def start_holder(host, marker=None):
    """A process (not of any unit) that keeps a stand-in GPU node open; returns its pid."""
    env = f"env {shlex.quote('INFERHOST_UNIT=' + marker)} " if marker else ""
    pid_file = "/run/inferhost-test-holder.pid"
    host.run_expect([0], f"rm -f {pid_file}")
    host.run_expect([0], f"setsid -f sh -c 'echo $$ > {pid_file}; exec {env}sleep 600 <{NODE} >/dev/null 2>&1'")

    def written():
        return host.run(f"cat {pid_file}").stdout.strip()

    pid = int(wait_until(written, what="the holder's pid"))
    HOLDERS.append(pid)
    return pid


@pytest.fixture
def restore_a(host):
    """Leave svc-a active and nothing else holding the GPUs after a test."""
    yield
    while HOLDERS:
        host.run(f"kill {HOLDERS.pop()}")
    host.run(f"systemctl reset-failed {UNIT_A} {UNIT_B}")
    host.run_expect([0], f"systemctl start {UNIT_A}")


OLD = "inference-svc-old.service"


def test_a_dropped_service_is_stopped_disabled_and_removed(host):
    """prepare.yml ran svc-old; the converge's list drops it: nothing of it is left but the journal."""
    assert host.run(f"systemctl is-active {OLD}").stdout.strip() in {"inactive", "unknown"}
    assert "not-found" in host.run(f"systemctl show {OLD} --property LoadState").stdout
    for path in (
        f"/etc/systemd/system/{OLD}",
        "/etc/inferhost/services/svc-old.secret.env",
        "/var/lib/inferhost/svc-old",
    ):
        assert not host.file(path).exists, path
    assert host.file("/var/lib/inferhost/svc-a").is_directory, "the services kept must keep their state"


def test_the_dropped_service_freed_the_gpus_before_the_new_one_started(host):
    def first(unit, text):
        out = host.check_output(f"journalctl -u {unit} --no-pager -o short-unix")
        stamps = [float(line.split()[0]) for line in out.splitlines() if text in line]
        assert stamps, f"no {text!r} in the journal of {unit}"
        return stamps[0]

    released = first(OLD, "GPUs released")
    assert released < first(UNIT_A, "are free and bound to nvidia")


def test_units_are_rendered_as_designed(host):
    unit = host.file(f"/etc/systemd/system/{UNIT_A}").content_string
    for line in (
        "Type=exec",
        "User=inferhost",
        "KillMode=mixed",
        "TimeoutStopSec=240",
        "Restart=always",
        "RestartSec=2",
        "StartLimitBurst=3",
        "TimeoutStartSec=180",
        f"Conflicts={UNIT_B}",
        "EnvironmentFile=/etc/inferhost/nccl.env",
        "EnvironmentFile=/etc/inferhost/services/svc-a.secret.env",
        'Environment="VLLM_ENGINE_READY_TIMEOUT_S=120"',
        "ExecStart=/opt/venvs/standin/bin/vllm serve /srv/models/standin-a --served-model-name standin-a",
        "ExecStartPre=+/usr/local/libexec/inferhost/gpu-guard check --unit %n --device /dev/nvidia0",
    ):
        assert line in unit, line
    assert KEY not in unit
    sglang = host.file(f"/etc/systemd/system/{UNIT_B}").content_string
    assert (
        "ExecStart=/opt/venvs/standin/bin/python /usr/local/libexec/inferhost/sglang-launch "
        "--model-path /srv/models/standin-b"
    ) in sglang
    assert "--api-key" not in sglang and KEY not in sglang
    assert " --enable-metrics " in sglang  # SGLang serves /metrics only with it; the role adds it
    launcher = host.file("/usr/local/libexec/inferhost/sglang-launch")
    assert launcher.user == "root" and launcher.mode == 0o755
    # the guard's command runs its library, the modules' shared code, from a directory of its own
    guard = host.file("/usr/local/libexec/inferhost/gpu-guard")
    assert guard.mode == 0o755 and 'sys.path.insert(0, "/usr/local/lib/inferhost/gpu-guard")' in guard.content_string
    lib = "/usr/local/lib/inferhost/gpu-guard"
    for name in ("inference/guard.py", "inference/client.py", "gpu_switch/holders.py"):
        assert host.file(f"{lib}/{name}").user == "root" and host.file(f"{lib}/{name}").mode == 0o644, name
    assert not host.file(f"{lib}/gpu_switch/__init__.py").exists  # holders.py alone, not gpu-switch


def test_the_watchdog_is_installed_with_the_active_service_and_left_stopped_when_disabled(host):
    """The scenario disables it (molecule.yml says why): its unit and configuration are there, it runs not."""
    config = json.loads(host.file("/etc/inferhost/watchdog.json").content_string)
    assert [(s["name"], s["unit"], s["engine"]) for s in config["services"]] == [("svc-a", UNIT_A, "vllm")]
    assert config["services"][0]["secret_file"] == "/etc/inferhost/services/svc-a.secret.env"
    assert KEY not in host.file("/etc/inferhost/watchdog.json").content_string
    watchdog = host.service("inferhost-watchdog.service")
    assert not watchdog.is_running and not watchdog.is_enabled
    assert host.file("/usr/local/sbin/inferhost-watchdog").mode == 0o755


def test_each_engine_accepted_its_service_and_the_verdicts_are_root_only(host):
    cache = host.file("/var/cache/inferhost/engine-check.json")
    assert cache.user == "root" and cache.mode == 0o600
    assert sorted(json.loads(cache.content_string)) == ["svc-a", "svc-b"]


def test_api_key_file_is_root_only(host):
    secret = host.file("/etc/inferhost/services/svc-a.secret.env")
    assert secret.user == "root" and secret.mode == 0o600
    assert f'VLLM_API_KEY="{KEY}"' in secret.content_string


def test_only_the_active_service_runs_and_starts_at_boot(host):
    assert host.service(UNIT_A).is_running and host.service(UNIT_A).is_enabled
    assert not host.service(UNIT_B).is_running and not host.service(UNIT_B).is_enabled


def test_ready_service_lists_its_model_behind_the_key(host):
    status, body = python_get(host, 8000, "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "standin-a"
    assert python_get(host, 8000, "/v1/models", key=None)[0] == 401
    assert "standin-a is ready after" in host.check_output(f"journalctl -u {UNIT_A} --no-pager -o cat")


def test_engine_runs_unprivileged_with_nccl_and_timeouts(host):
    pid = show(host, UNIT_A, "MainPID")["MainPID"]
    assert host.check_output(f"ps -o user= -p {pid}").strip() == "inferhost"
    # root in a podman container has no CAP_SYS_PTRACE: read another user's environ as that user
    read = f"tr '\\0' '\\n' < /proc/{pid}/environ"
    environ = host.check_output(f"runuser -u inferhost -- sh -c {shlex.quote(read)}").splitlines()
    for assignment in (
        "NCCL_PROTO=LL",
        "NCCL_P2P_LEVEL=SYS",
        "CUDA_VISIBLE_DEVICES=0,1",
        f"INFERHOST_UNIT={UNIT_A}",
        "VLLM_ENGINE_READY_TIMEOUT_S=120",
        "HF_HUB_OFFLINE=1",
    ):
        assert assignment in environ, assignment


# Run as `nobody` (neither root nor the service's user): every pid, its command line, and its environment
# where the kernel lets that user read it. The key is given as hex so that this scan's own command line
# (and the shell's running it) does not contain it.
SCAN = """
import json, os
key = bytes.fromhex(%r)
seen, leaks, environ_read, environ_denied = [], [], 0, 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except OSError:
        continue
    seen.append(int(pid))
    if key in cmdline:
        leaks.append(f"{pid} cmdline")
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read()
        environ_read += 1
    except PermissionError:
        environ_denied += 1
        continue
    except OSError:
        continue
    if key in environ:
        leaks.append(f"{pid} environ")
print(json.dumps({"seen": seen, "leaks": leaks, "environ_read": environ_read, "environ_denied": environ_denied}))
"""


def unit_pids(host, unit):
    """The processes in the unit's cgroup (as the guard finds them: /proc/<pid>/cgroup names the unit)."""
    code = (
        "import os\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        lines = open(f'/proc/{pid}/cgroup').read().splitlines()\n"
        "    except OSError:\n"
        "        continue\n"
        f"    if any(line.endswith('/{unit}') for line in lines):\n"
        "        print(pid)\n"
    )
    return {int(pid) for pid in host.check_output(f"python3 -c {shlex.quote(code)}").split()}


def scan_as_nobody(host):
    code = SCAN % KEY.encode().hex()
    return json.loads(host.check_output(f"runuser -u nobody -- python3 -c {shlex.quote(code)}"))


def test_no_api_key_on_any_command_line_or_in_a_readable_environment(host, restore_a):
    """Item of the README's promise "secrets only in root-only files": nobody else can read the key anywhere."""
    for unit, port in ((UNIT_A, 8000), (UNIT_B, 8001)):
        since = int(time.time())
        host.run_expect([0], f"systemctl start {unit}")
        # the key is in force: the engine refuses a request without it (vLLM from VLLM_API_KEY, SGLang
        # through the launcher)
        assert python_get(host, port, "/v1/models", key=None)[0] == 401
        assert python_get(host, port, "/v1/models")[0] == 200
        pids = unit_pids(host, unit)
        assert pids, f"{unit} has no processes"
        found = scan_as_nobody(host)
        assert pids <= set(found["seen"]), "the scan must see the service's processes"
        assert found["leaks"] == [], f"{unit}: the key is readable by nobody in {found['leaks']}"
        assert found["environ_denied"] > 0  # other users' environments are closed to nobody
        # SGLang logs its arguments, the key among them; the launcher hides it (the stand-in logs the same way)
        assert KEY not in journal(host, unit, since)


def crash(host):
    host.run(
        "python3 -c \"import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:8000/standin/crash', "
        "data=b'{}'), timeout=5)\""
    )


def restarted_after(host, before):
    def check():
        now = show(host, UNIT_A, "MainPID", "NRestarts", "ActiveState")
        return now["ActiveState"] == "active" and now["MainPID"] != before["MainPID"] and now

    return wait_until(check, timeout=90, what="the restart after the crash")


def test_restart_after_a_crash(host, restore_a):
    host.run_expect([0], f"systemctl reset-failed {UNIT_A}")  # earlier starts count against the rate limit
    before = show(host, UNIT_A, "MainPID", "NRestarts")
    crash(host)
    after = restarted_after(host, before)
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1
    assert python_get(host, 8000, "/v1/models")[0] == 200


def test_restarts_are_rate_limited(host, restore_a):
    since = int(time.time())
    host.run_expect([0], f"systemctl reset-failed {UNIT_A}")
    host.run_expect([0], f"systemctl restart {UNIT_A}")
    # StartLimitBurst=3: this start and the restarts after two crashes are allowed, a fourth start is not.
    for _ in range(2):
        before = show(host, UNIT_A, "MainPID")
        crash(host)
        restarted_after(host, before)
    crash(host)

    def given_up():
        return show(host, UNIT_A, "ActiveState")["ActiveState"] == "failed"

    wait_until(given_up, timeout=60, what="the unit to give up")
    # The unit shows failed for a moment after the last crash, before systemd refuses the start it would make, and
    # the journal can lag behind the unit's state on a loaded machine: wait for systemd's own words.
    wait_until(
        lambda: "Start request repeated too quickly" in journal(host, UNIT_A, since),
        timeout=20,
        what="systemd's note that it refused the start",
    )


def test_starting_another_service_stops_the_first(host, restore_a):
    since = int(time.time())
    host.run_expect([0], f"systemctl start {UNIT_B}")
    assert show(host, UNIT_A, "ActiveState")["ActiveState"] == "inactive"
    assert show(host, UNIT_B, "ActiveState")["ActiveState"] == "active"
    status, body = python_get(host, 8001, "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "standin-b"
    # the stopped unit waited for its GPUs to be released before the next one started
    assert "GPUs released" in journal(host, UNIT_A, since)


def test_guard_refuses_when_another_process_holds_a_gpu(host, restore_a):
    holder = start_holder(host)
    since = int(time.time())
    assert host.run(f"systemctl restart {UNIT_A}").rc != 0
    log = journal(host, UNIT_A, since)
    assert re.search(rf"nothing was stopped because these processes do not belong to it: pid {holder} \(sleep", log)
    assert f"holds {NODE}" in log
    assert host.run(f"kill -0 {holder}").rc == 0, "the guard must not touch a process of someone else"


def test_guard_cleans_up_leftovers_of_its_own_unit(host, restore_a):
    holder = start_holder(host, marker=UNIT_A)
    since = int(time.time())
    host.run_expect([0], f"systemctl restart {UNIT_A}")
    assert f"leftover of {UNIT_A}: pid {holder}" in journal(host, UNIT_A, since)
    assert host.run(f"kill -0 {holder}").rc != 0


def test_guard_refuses_gpus_given_to_the_vm(host, restore_a):
    """Through the simulated kernel, as gpu-switch moves a GPU: off nvidia, onto vfio-pci, and back."""
    gpu, pci = "0000:02:00.0", "/sys/bus/pci"
    host.run_expect([0], f"echo {gpu} > {pci}/drivers/nvidia/unbind")
    host.run_expect([0], f"echo vfio-pci > {pci}/devices/{gpu}/driver_override")
    host.run_expect([0], f"echo {gpu} > {pci}/drivers/vfio-pci/bind")
    try:
        since = int(time.time())
        assert host.run(f"systemctl restart {UNIT_A}").rc != 0
        assert f"GPU {gpu} is bound to vfio-pci (given to the VM)" in journal(host, UNIT_A, since)
    finally:
        host.run_expect([0], f"echo {gpu} > {pci}/drivers/vfio-pci/unbind")
        host.run_expect([0], f"echo > {pci}/devices/{gpu}/driver_override")
        host.run_expect([0], f"echo {gpu} > {pci}/drivers/nvidia/bind")
