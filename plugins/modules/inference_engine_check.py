#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: inference_engine_check
short_description: Ask each service's engine, in its own environment, whether it would take the service
description:
  - For every service, runs the Python of the service's virtual environment on a small script
    (C(module_utils/inference/engine_check.py)). The exact command line the unit will run goes through the
    installed engine's own argument parser (C(vllm serve)'s, or SGLang's C(ServerArgs)), then through the
    engine's own checks of the parsed arguments that need no device and no checkpoint (vLLM's
    C(validate_parsed_serve_args) and C(validate_api_server_args), and its reasoning parser registry; the
    device-free steps of SGLang's C(ServerArgs)), and the checkpoint's C(config.json) C(architectures) are
    looked up in the engine's model registry.
  - A refusal names the service, the argument or architecture, and the engine and its version. The play stops
    before any unit is written or restarted, so a running service keeps running.
  - Services of one environment are checked by one process. A verdict that passed is remembered in
    O(cache), keyed by the arguments, the architectures, the environment's installed packages
    (C(packages_id), a hash of their RECORDs) and this check, so a
    run that changes none of them starts no engine. The cache is bookkeeping, not configuration; writing it
    is not reported as a change.
  - Without a GPU (the GPUs are with the VM, or the machine has none), vLLM's parser is run on its CPU
    platform. Nothing is loaded; a parser plugin file named by the service (C(--tool-parser-plugin),
    C(--reasoning-parser-plugin)) is imported, as the engine imports it before it checks the parser names.
version_added: "0.2.0"
author: inferhost contributors
options:
  services:
    description:
      - The services as C(inference_service_plan) returns them; each needs C(name), C(engine),
        C(virtualenv) and C(argv), and may have C(architectures) (none when the checkpoint is not there yet)
        and C(packages_id).
    type: list
    elements: dict
    required: true
  active:
    description:
      - The service that will be started. Its environment must exist (outside check mode); for other services
        a missing environment is a warning, and they are checked when it exists.
    type: str
    default: ""
  cache:
    description: File of the verdicts that passed (root-only); removing it makes the next run check everything.
    type: path
    default: /var/cache/inferhost/engine-check.json
  timeout:
    description: Seconds one engine may take to answer (importing an engine takes 5 to 30 s).
    type: int
    default: 600
"""

EXAMPLES = r"""
- name: Ask the engines about every service
  inference_engine_check:
    services: "{{ __inference_service_plan.services }}"
    active: qwen35
"""

RETURN = r"""
services:
  description: One entry per service.
  returned: always
  type: list
  elements: dict
  sample:
    - name: kimi-k25
      engine: vllm
      version: 0.16.0
      checked: true
      cached: false
      refusals: []
"""

# The engines put these before the arguments the parser sees: "vllm serve" and the SGLang launcher's
# "python LAUNCHER" (module_utils/inference/command.py builds both).
PROGRAM_WORDS = 2


def verdict_key(service, checker):
    # packages_id: inference_service_plan's hash of every RECORD in the venv, the engine's among them.
    data = [
        service["engine"],
        list(service["argv"][PROGRAM_WORDS:]),
        service.get("architectures") or [],
        checker,
        service.get("packages_id") or "",
    ]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def read_cache(path):
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_cache(path, data):
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    temp = f"{path}.tmp"
    with open(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
    os.replace(temp, path)


def ask_engine(module, python, engine, services, checker):
    """The engine's answer for these services: {name: (version, refusals)}."""
    request = {
        "engine": engine,
        "services": [
            {"name": s["name"], "args": s["argv"][PROGRAM_WORDS:], "architectures": s.get("architectures") or []}
            for s in services
        ],
    }
    try:
        done = subprocess.run(
            [python, "-I", "-c", checker],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=module.params["timeout"],
            check=False,
        )
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = None, "", f"no answer within {module.params['timeout']} s"
    try:
        answer = json.loads(out) if rc == 0 else None
    except ValueError:
        answer = None
    if answer is None:
        last = [line for line in err.splitlines() if line.strip()][-1:] or [f"exit status {rc}"]
        reason = f"{engine} in {os.path.dirname(os.path.dirname(python))} could not be asked: {last[0]}"
        return {s["name"]: (None, [{"what": "engine", "message": reason}]) for s in services}
    return {s["name"]: (answer["version"], s["refusals"]) for s in answer["services"]}


def refusal_line(service, version, refusal):
    engine = f"{service['engine']} {version}" if version else service["engine"]
    if refusal["what"] == "architecture":
        return (
            f"{service['name']}: architecture {refusal['message']} is not in {engine}'s model registry "
            f"(config.json of {service.get('model_path') or 'the checkpoint'}); "
            f"fix: pin a release of {service['engine']} that has it (python_env_environments) or serve another model"
        )
    if refusal["what"] == "engine":
        return f"{service['name']}: {refusal['message']}; fix: rebuild the environment (python_env)"
    return (
        f"{service['name']}: {engine} refuses its command line: {refusal['message']}; "
        "fix: the service's args (inference_service_services) or the engine's pin (python_env_environments)"
    )


def main():
    module = AnsibleModule(
        argument_spec={
            "services": {"type": "list", "elements": "dict", "required": True},
            "active": {"type": "str", "default": ""},
            "cache": {"type": "path", "default": "/var/cache/inferhost/engine-check.json"},
            "timeout": {"type": "int", "default": 600},
        },
        supports_check_mode=True,
    )
    # Imported here, after argument parsing (see inference_service_plan): Ansiballz ships the file.
    from ansible.module_utils.inference import engine_check  # noqa: PLC0415

    checker = inspect.getsource(engine_check)
    checker_id = hashlib.sha256(checker.encode()).hexdigest()
    params = module.params
    cache = read_cache(params["cache"])
    results, to_ask, keys = {}, {}, {}
    for service in params["services"]:
        name = service["name"]
        result = results[name] = {"name": name, "engine": service["engine"], "version": None}
        result.update(checked=False, cached=False, refusals=[])
        environment = str(service["virtualenv"]).rstrip("/")
        python = os.path.join(environment, "bin", "python")
        if not os.access(python, os.X_OK):
            message = f"{name}: no Python in {environment}: the environment is not built yet"
            if name == params["active"] and not module.check_mode:
                result["refusals"].append(f"{message}; fix: build it first (python_env_environments)")
            else:
                module.warn(f"{message}; the engine checks it once it exists")
            continue
        keys[name] = verdict_key(service, checker_id)
        if cache.get(name) == keys[name]:
            result.update(checked=True, cached=True)
            continue
        to_ask.setdefault((python, service["engine"]), []).append(service)

    by_name = {s["name"]: s for s in params["services"]}
    for (python, engine), services in to_ask.items():
        for name, (version, refusals) in ask_engine(module, python, engine, services, checker).items():
            results[name].update(checked=True, version=version)
            results[name]["refusals"] += [refusal_line(by_name[name], version, r) for r in refusals]

    ordered = [results[s["name"]] for s in params["services"]]
    passed = {r["name"]: keys[r["name"]] for r in ordered if r["checked"] and not r["refusals"]}
    if passed != cache and not module.check_mode:
        write_cache(params["cache"], passed)
    refused = [line for r in ordered for line in r["refusals"]]
    if refused:
        module.fail_json(msg="\n".join(refused), services=ordered)
    module.exit_json(
        changed=False, services=ordered, msg=f"{len(passed)} of {len(ordered)} services checked by their engine"
    )


if __name__ == "__main__":
    main()
