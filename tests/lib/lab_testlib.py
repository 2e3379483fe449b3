"""What the lab's test modules share: a command on a lab machine over its SSH road, ansible-playbook as a user runs
it on the running lab, the machines that run, the active service's data."""

import json
import shlex
import subprocess

from inferhost import lab as labmod


def on(lab, host: str, command: str) -> str:
    """A shell command on a lab machine over SSH; its output (a failure raises)."""
    argv = labmod.ssh_argv(lab, host)
    return subprocess.run([*argv, command], capture_output=True, text=True, check=True).stdout.strip()


def ansible_playbook(lab, playbook: str, *argv: str):
    """ansible-playbook against the lab as a user runs it, with its whole output (for the message and leaks)."""
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(lab.inventory), playbook, *argv],
        cwd=labmod.ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def running(lab) -> list[str]:
    """The lab machines that run: the guest the API has stopped is off, as on a real host."""
    return [host for host in sorted(lab.hosts) if labmod.machine_running(host)]


def service(lab, name: str = "lab-vllm") -> dict:
    """A service of the lab's containers, by name."""
    return next(s for s in lab.hosts["lab-ct"]["inference_service_services"] if s["name"] == name)


def unit_state(lab, host: str, unit: str) -> dict[str, str]:
    """A unit's MainPID, NRestarts, InvocationID and ActiveState on a lab machine."""
    show = f"systemctl show -p MainPID -p NRestarts -p InvocationID -p ActiveState {unit}"
    return dict(line.split("=", 1) for line in on(lab, host, show).splitlines())


def one_token(lab, host: str = "lab-ct", name: str = "lab-vllm", timeout: int = 10) -> str:
    """A one-token completion through a lab service from inside its container, with the service's key: "ok", or
    what came back instead."""
    svc = service(lab, name)
    ask = (
        "import json, re, urllib.request as u\n"
        f"secret = open('/etc/inferhost/services/{name}.secret.env').read()\n"
        "key = re.search(r'INFERHOST_API_KEY=\"?([^\"\\n]*)', secret)[1]\n"
        f"body = json.dumps({{'model': '{svc['model']['served_name']}', 'prompt': 'Hi', 'max_tokens': 1}}).encode()\n"
        f"r = u.Request('http://127.0.0.1:{svc['port']}/v1/completions', data=body,"
        " headers={'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'})\n"
        f"try: print('ok' if json.load(u.urlopen(r, timeout={timeout}))['choices'] else 'no choices')\n"
        "except Exception as e: print(e)"
    )
    return on(lab, host, f"python3 -c {shlex.quote(ask)}")


def watchdog_state(lab, host: str = "lab-ct") -> dict:
    """The watchdog's state file on a lab container ({} before it wrote one)."""
    return json.loads(on(lab, host, "cat /var/lib/inferhost-watchdog/state.json 2>/dev/null || echo '{}'"))
