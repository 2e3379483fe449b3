"""The playbook tests' site: one service "mm" serving MiniMax-M2.5 with vLLM on GPUs 0-3 of this machine, and
ansible-playbook run against it with a local connection."""

import json
import os
import shutil
import subprocess
import sys

from inference_refdata import MODELS, REFERENCE, ROOT

# The ansible-playbook of this interpreter's environment, also when that is not on PATH (make test).
PLAYBOOK = shutil.which("ansible-playbook", path=os.path.dirname(sys.executable)) or "ansible-playbook"


def minimax_site(tmp_path, hardware, key, environment, port, **variables):
    """The checkpoint copied under tmp_path, the service's secret file holding key, and the inventory variables of
    the service in environment on port (plus variables)."""
    model = tmp_path / "models/MiniMax-M2.5"
    shutil.copytree(MODELS / REFERENCE["minimax-m25"], model)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "mm.secret.env").write_text(f'INFERHOST_API_KEY="{key}"\n')
    service = {
        "name": "mm",
        "engine": "vllm",
        "environment": str(environment),
        "model": {
            "path": str(model),
            "served_name": "MiniMax-M2.5",
            "active_params_b": 10,
            "quantization": "fp8",
            "quantized": "all_linear",
        },
        "gpus": [0, 1, 2, 3],
        "tensor_parallel_size": 4,
        "port": port,
    }
    common = {
        "inference_service_active": "mm",
        "inference_service_hardware": hardware,
        "inference_service_services": [service],
        "inference_service_config_dir": str(secrets),
        "ansible_python_interpreter": sys.executable,
    }
    return {"tmp": tmp_path, "service": service, "vars": {**common, **variables}}


def run_playbook(site, name, *options, env=None, **extra):
    """playbooks/<name> with the site's variables and extra over them, and env over this process's environment:
    the return code and the output with whitespace collapsed (the YAML callback wraps long lines)."""
    path = site["tmp"] / "vars.json"
    path.write_text(json.dumps({**site["vars"], **extra}))
    argv = [PLAYBOOK, "-i", "localhost,", "-c", "local", str(ROOT / "playbooks" / name), "-e", f"@{path}", *options]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", **(env or {})}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def run_ansible(*argv, check=False, env=None, timeout=None):
    """An Ansible command (ansible-playbook, ansible-inventory) run from the repository's root with no fact cache:
    facts an earlier run cached for a host of the same name must not count. env: more of the environment."""
    env = {**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_NOCOLOR": "1", **(env or {})}
    return subprocess.run(list(argv), cwd=ROOT, env=env, capture_output=True, text=True, check=check, timeout=timeout)
