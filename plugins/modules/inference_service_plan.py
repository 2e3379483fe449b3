#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

import glob
import hashlib
import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: inference_service_plan
short_description: Check inference services before anything is installed, and render their command lines
description:
  - Reads each service's checkpoint configuration (C(config.json), C(hf_quant_config.json)) and the installed
    engine version from the service's virtual environment on the target.
  - Refuses, with the reason and the fix, backend combinations known to fail on the GPU's compute capability,
    tensor-parallel sizes that do not divide the model's dimensions (FP8 weight blocks and quantization groups
    included), weights per GPU that leave no room for a minimum KV cache, a quantized KV cache without an
    explicit opt-in, and checkpoint edits the engine no longer needs.
  - Returns each service's engine command line (quoted for systemd), environment and unit name, and in C(api)
    what its API serves beyond answers, the tool-call and reasoning parsers and whether C(/metrics) has the
    engine's metrics. SGLang command lines get C(--enable-metrics) unless the service's C(args) set it.
  - Changes nothing on the target.
version_added: "0.1.0"
author: inferhost contributors
options:
  services:
    description: The service definitions (role variable C(inference_service_services)).
    type: list
    elements: dict
    required: true
  active:
    description:
      - Name of the service that will be started. Its checkpoint must exist; for the others a missing
        checkpoint is only a warning (they are checked again when they become active).
    type: str
    default: ""
  known_bad_extra:
    description:
      - A site's own known-bad backend rules, checked after the built-in ones (C(module_utils/inference/known_bad.py)
        holds those and documents the format).
    type: list
    elements: dict
    default: []
  compute_capability:
    description: Compute capability of the GPUs, for example C("12.0"); rules name the ones they apply to.
    type: str
  gpu_count:
    description: GPUs of the machine; GPU indices of the services must be below it.
    type: int
  memory_gb:
    description:
      - Memory of one GPU in GiB (96 for an RTX PRO 6000). With it, the weights each GPU holds (the checkpoint's
        size from its C(model.safetensors.index.json), or estimated from C(model.active_params_b); weights every
        rank keeps whole counted on each) plus C(min_kv_cache_tokens) of KV cache must fit the share of it the
        engine takes (C(gpu-memory-utilization), C(mem-fraction-static); 0.9 when not set).
    type: float
  hardware:
    description:
      - The hardware profile (role variable C(inference_service_hardware)). With it, a service with
        C(expert_parallel) is warned with its single-stream decode ceiling with and without expert parallel.
    type: dict
  min_kv_cache_tokens:
    description: Tokens of KV cache that must fit next to the weights on each GPU.
    type: int
    default: 32768
  unit_prefix:
    description: Prefix of the systemd unit names (C(<prefix><name>.service)).
    type: str
    default: inference-
  load_timeout_s:
    description: Default seconds a model load may take (a service's C(load_timeout_s) wins).
    type: int
    default: 2700
  drain_timeout_s:
    description:
      - Seconds a stop lets the requests in flight finish. vLLM 0.18.0 and later get C(--shutdown-timeout) with it (a
        service whose C(args) set the flag keeps its own); an older vLLM cannot drain, which the plan warns of.
        C(0) drains nothing.
    type: int
    default: 60
  sglang_launcher:
    description:
      - Path of the role's SGLang launcher, which SGLang command lines run with the environment's Python. It
        hands the API key from the environment to SGLang in-process, so that the key is on no command line.
    type: path
    default: /usr/local/libexec/inferhost/sglang-launch
  common_env:
    description: Environment variables for every service (a service's C(env) wins).
    type: dict
    default: {}
  fail_on_refusal:
    description: Fail when a service is refused; with C(false) the refusals are only returned.
    type: bool
    default: true
  node:
    description:
      - This container's inventory hostname. A service with C(nodes) is rendered here only when it names this
        container, with this container's rank (its place in C(nodes)); the others are returned in C(elsewhere).
      - Needed when a service has C(nodes).
    type: str
    default: ""
  node_addresses:
    description:
      - The address of each inventory host that a service names in C(nodes) (its C(ansible_host)); a node's own
        C(address) wins. The head's is the one the other ranks connect to.
    type: dict
    default: {}
  inventory_hosts:
    description: The inventory's hosts; every node a service names must be one of them (not checked when omitted).
    type: list
    elements: str
extends_documentation_fragment:
  - attributes.read_only
"""

EXAMPLES = r"""
- name: Check the services and build their command lines
  inference_service_plan:
    services: "{{ inference_service_services }}"
    active: qwen35
    known_bad_extra: "{{ inference_service_known_bad_extra }}"
    compute_capability: "12.0"
    gpu_count: 8
  register: __inference_service_plan
"""

RETURN = r"""
services:
  description: One entry per service, in order.
  returned: always
  type: list
  elements: dict
  sample:
    - name: qwen35
      unit: inference-qwen35.service
      engine: sglang
      engine_version: 0.5.9
      virtualenv: /opt/venvs/sglang
      packages_id: 3f9a0c1d2e4b5a69
      model_path: /srv/models/Qwen3.5-397B-A17B-NVFP4
      architectures: [Qwen3_5MoeForConditionalGeneration]
      refusals: []
      warnings: []
      edits: []
      exec_start: /opt/venvs/sglang/bin/python /usr/local/libexec/inferhost/sglang-launch --model-path /srv/models/Q ...
      environment: {CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7"}
      environment_lines: ['"CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"']
      secret_names: [INFERHOST_API_KEY]
      served_name: Qwen3.5-397B-A17B
      url: http://127.0.0.1:8000
      api: {tool_call_parser: qwen3_coder, reasoning_parser: qwen3, metrics: true}
      load_timeout_s: 2700
      conflicts: [inference-kimi-k25.service]
      group: null
elsewhere:
  description: Services whose C(nodes) do not name this container; it runs none of them.
  returned: always
  type: list
  elements: str
active:
  description: The service to start here; C("") when the active service does not run on this container.
  returned: always
  type: str
refused:
  description: Whether any service was refused.
  returned: always
  type: bool
"""


def installed_version(environment, engine):
    """Version of the engine's distribution in a venv, from its dist-info METADATA (nothing is executed)."""
    from ansible.module_utils.python_env.pins import metadata_fields  # noqa: PLC0415 - see plan_one

    pattern = os.path.join(environment, "lib", "python*", "site-packages", f"{engine}-*.dist-info", "METADATA")
    for path in sorted(glob.glob(pattern)):
        version = metadata_fields(path).get("Version")
        if version is not None:
            return version
    return None


def packages_id(environment):
    """A short hash of every package installed in a venv, by its RECORD (file hashes included), or None.

    The unit carries it: a rebuilt environment (a new engine or torch, a rebuilt extension) rewrites the unit,
    which restarts the service once the engine has accepted it, instead of leaving the old code running.
    """
    records = sorted(glob.glob(os.path.join(environment, "lib", "python*", "site-packages", "*.dist-info", "RECORD")))
    if not records:
        return None
    digest = hashlib.sha256()
    for path in records:
        digest.update(os.path.basename(os.path.dirname(path)).encode() + b"\0")
        with open(path, "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()[:16]


def checkpoint_size(modelconfig, path):
    """The checkpoint's weight bytes from its safetensors index, or None (unreadable counts as absent)."""
    try:
        return modelconfig.checkpoint_bytes(path)
    except (OSError, ValueError):
        return None


def plan_one(params, service, units, where=None):
    # Imported here, after argument parsing: ansible-lint's args rule validates task arguments by running
    # main() up to AnsibleModule() without our module_utils on its path. Ansiballz still ships them.
    from ansible.module_utils.inference import command, known_bad, modelconfig, plan  # noqa: PLC0415

    name = service.get("name", "?")
    result = {"name": name, "refusals": [], "warnings": [], "edits": []}
    detected = installed_version(str(service.get("environment", "")), service.get("engine", ""))
    declared = service.get("engine_version")
    if declared and detected and declared != detected:
        result["warnings"].append(f"engine_version {declared} is set but {detected} is installed; checking {declared}")
    version = declared or detected
    config = quant = None
    model_path = str((service.get("model") or {}).get("path", ""))
    try:
        config, quant = modelconfig.load_checkpoint(model_path)
    except FileNotFoundError:
        if name != params["active"]:
            result["warnings"].append(f"no checkpoint at {model_path} yet: model checks run when {name} is active")
            config = {}
    except ValueError as exc:
        result["refusals"].append(plan.refusal("tensor_parallel", "config", str(exc), "fix the checkpoint"))
    checked = plan.plan_service(
        service,
        config=config or None,
        quant_config=quant,
        known_bad=known_bad.rules(params["known_bad_extra"]),
        compute_capability=params["compute_capability"],
        engine_version=version,
        gpu_count=params["gpu_count"],
        memory_gb=params["memory_gb"],
        checkpoint_bytes=checkpoint_size(modelconfig, model_path) if config else None,
        min_kv_tokens=params["min_kv_cache_tokens"],
        hardware=params["hardware"],
        inventory_hosts=params["inventory_hosts"],
    )
    if config == {}:  # inactive and not downloaded: drop the refusal about the missing config
        checked["refusals"] = [r for r in checked["refusals"] if r["id"] != "config"]
        checked["edits"] = []
    result["refusals"] += checked["refusals"]
    result["warnings"] += checked["warnings"]
    result["edits"] = [{**edit, "path": os.path.join(model_path, edit["file"])} for edit in checked["edits"]]
    result["engine_version"] = version
    if result["refusals"]:
        return result
    unit = units[name]
    timeout = int(service.get("load_timeout_s") or params["load_timeout_s"])
    host = str(service.get("bind_address", "127.0.0.1"))
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    url = (
        f"http://[{host}]:{service.get('port', 8000)}" if ":" in host else f"http://{host}:{service.get('port', 8000)}"
    )
    drain, drain_warning = command.drain_args(service, version, params["drain_timeout_s"])
    if drain_warning:
        result["warnings"].append(drain_warning)
    argv = command.build_argv(
        service, load_timeout_s=timeout, sglang_launcher=params["sglang_launcher"], where=where, drain=drain
    )
    env = command.build_environment(
        service, unit=unit, load_timeout_s=timeout, common=params["common_env"], where=where
    )
    result.update(
        unit=unit,
        engine=service.get("engine"),
        virtualenv=str(service.get("environment", "")),
        packages_id=packages_id(str(service.get("environment", ""))),
        model_path=model_path,
        # What the engine's model registry must know (inference_engine_check); none before a download.
        architectures=list((config or {}).get("architectures") or []),
        exec_start=command.systemd_command(argv),
        argv=command.display_argv(argv),
        environment=env,
        environment_lines=[command.systemd_environment(k, v) for k, v in sorted(env.items())],
        secret_names=command.secret_names(service),
        served_name=command.served_name(service),
        url=url,
        # What validate.yml's smoke check asks beyond the prompts: tool calls, reasoning, /metrics.
        api=command.served_api(service),
        load_timeout_s=timeout,
        conflicts=sorted(u for n, u in units.items() if n != name),
        # Across several nodes: the nodes in rank order and this one's rank; only rank 0 serves the API.
        group=None
        if where is None
        else {"service": name, "nodes": [n["host"] for n in command.node_list(service)], "rank": where["rank"]},
        serves=where is None or where["rank"] == 0,
    )
    return result


def main():
    module = AnsibleModule(
        argument_spec={
            "services": {"type": "list", "elements": "dict", "required": True},
            "active": {"type": "str", "default": ""},
            "known_bad_extra": {"type": "list", "elements": "dict", "default": []},
            "compute_capability": {"type": "str"},
            "gpu_count": {"type": "int"},
            "memory_gb": {"type": "float"},
            "hardware": {"type": "dict"},
            "min_kv_cache_tokens": {"type": "int", "default": 32768},
            "unit_prefix": {"type": "str", "default": "inference-"},
            "load_timeout_s": {"type": "int", "default": 2700},
            "drain_timeout_s": {"type": "int", "default": 60},
            "sglang_launcher": {"type": "path", "default": "/usr/local/libexec/inferhost/sglang-launch"},
            "common_env": {"type": "dict", "default": {}},
            "fail_on_refusal": {"type": "bool", "default": True},
            "node": {"type": "str", "default": ""},
            "node_addresses": {"type": "dict", "default": {}},
            "inventory_hosts": {"type": "list", "elements": "str"},
        },
        supports_check_mode=True,
    )
    from ansible.module_utils.inference import command, known_bad, plan  # noqa: PLC0415  (see plan_one)

    params = module.params
    try:
        known_bad.rules(params["known_bad_extra"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    services = params["services"]
    names = [s.get("name") for s in services]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        module.fail_json(msg=f"inference_service_services names {', '.join(map(str, duplicates))} more than once")
    if params["active"] and params["active"] not in names:
        module.fail_json(msg=f"inference_service_active {params['active']!r} is not one of the services: {names}")
    here, elsewhere, placements = [], [], {}
    for service in services:
        hosts = [n["host"] for n in command.node_list(service)]
        if hosts and not params["node"]:
            module.fail_json(msg=f"service {service.get('name')} names nodes {hosts}: node (this host) is needed")
        if hosts and params["node"] not in hosts:
            elsewhere.append(service.get("name"))
            continue
        here.append(service)
        if len(hosts) > 1 and len(set(hosts)) == len(hosts):
            placements[service.get("name")] = command.placement(service, params["node"], params["node_addresses"])
    units = {s.get("name"): f"{params['unit_prefix']}{s.get('name')}.service" for s in here}
    results = [plan_one(params, s, units, placements.get(s.get("name"))) for s in here]
    for result in results:
        for warning in result["warnings"]:
            module.warn(f"{result['name']}: {warning}")
    refused = [r for r in results if r["refusals"]]
    message = "\n".join(plan.format_refusals(r["name"], r["refusals"]) for r in refused)
    active = params["active"] if params["active"] in units else ""
    if refused and params["fail_on_refusal"]:
        module.fail_json(msg=message, services=results, refused=True, elsewhere=elsewhere, active=active)
    module.exit_json(
        changed=False,
        services=results,
        refused=bool(refused),
        elsewhere=elsewhere,
        active=active,
        msg=message or "all services accepted",
    )


if __name__ == "__main__":
    main()
