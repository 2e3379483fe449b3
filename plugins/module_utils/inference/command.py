"""Build an engine's command line and environment from a service definition, and quote it for systemd.

The same service data gives ``vllm serve ...`` or ``python -m sglang.launch_server ...``. Flags the
role owns (model, name, address, port, parallelism, KV-cache type, API key, load timeout) come from
service fields; everything else comes from ``args`` as ``{flag: value}``: ``true`` gives a bare flag,
``false``/``null`` leaves it out, a list repeats values after one flag, a mapping becomes JSON.

The API key is on no command line (every user reads ``/proc/<pid>/cmdline``) and not in the unit file:
systemd loads it as root from the service's root-only secret file into the engine's environment, which
only its owner and root can read. vLLM reads ``VLLM_API_KEY`` itself. SGLang takes the key only as
``--api-key``, so an SGLang unit runs the role's launcher (``inferhost-sglang-launch``) with the
environment's Python: it hands ``INFERHOST_API_KEY`` to SGLang in-process.

SGLang serves ``/metrics`` only with ``--enable-metrics``; the role adds it unless the service's ``args`` set
it (``enable-metrics: false`` leaves it out). vLLM serves its metrics without a flag.

A service with ``nodes`` spans several containers (inventory hosts, the head first): each node runs its own
unit from the same service data, with the group's size, its own rank and the head's address (``placement``).
vLLM: ``--nnodes --node-rank --master-addr --master-port``, and ``--headless`` on every rank above 0 (no API
there); SGLang: ``--nnodes --node-rank --dist-init-addr <head>:<port>``. The node's network interface becomes
``NCCL_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME``. ``gpus`` are the GPUs of each node.
"""

from __future__ import annotations

import json
import os

API_KEY_VAR = "INFERHOST_API_KEY"
UNIT_MARKER_VAR = "INFERHOST_UNIT"
SGLANG_LAUNCHER = "/usr/local/libexec/inferhost/sglang-launch"

KV_CACHE_SPELLING = {
    "vllm": {"bf16": "bfloat16", "auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"},
    "sglang": {"bf16": "bf16", "auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"},
}


def served_name(service):
    model = service["model"]
    return model.get("served_name") or os.path.basename(str(model["path"]).rstrip("/"))


def _flag(key):
    return str(key).lstrip("-").replace("_", "-")


def _arg(service, name):
    """The value the service's ``args`` give flag ``name`` (any spelling of the key), or None."""
    return next((v for k, v in (service.get("args") or {}).items() if _flag(k) == name), None)


def _sets(service, name):
    return any(_flag(k) == name for k in service.get("args") or {})


def _args(extra):
    # Sorted: the engines' parsers take flags in any order, so the same mapping in another order (another
    # inventory file, extra vars) gives the same unit and never restarts a model for nothing.
    out = []
    for key, value in sorted((extra or {}).items()):
        flag = "--" + str(key).lstrip("-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            out += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            out += [flag, json.dumps(value, separators=(",", ":"), sort_keys=True)]
        else:
            out += [flag, str(value)]
    return out


DEFAULT_DIST_PORT = 29501
FABRICS = ("pcie", "nvlink", "infiniband", "ethernet")
FAST_FABRICS = ("nvlink", "infiniband")


def node_list(service):
    """The service's nodes, head first, each ``{"host", "address", "network_interface"}`` (None when not given).

    A node is an inventory hostname or a mapping with ``host`` and optionally ``address`` and
    ``network_interface``; the service's ``network_interface`` is the default of every node. [] for a service
    without ``nodes``.
    """
    out = []
    for entry in service.get("nodes") or []:
        node = dict(entry) if isinstance(entry, dict) else {"host": entry}
        out.append(
            {
                "host": None if node.get("host") is None else str(node["host"]),
                "address": None if node.get("address") in (None, "") else str(node["address"]),
                "network_interface": node.get("network_interface") or service.get("network_interface") or None,
            }
        )
    return out


def multi_node(service):
    """Whether the service spans more than one node."""
    return len(service.get("nodes") or []) > 1


def parallel_sizes(service):
    """``(tensor_parallel_size, pipeline_parallel_size)``: TP defaults to the GPUs of one node; PP to the GPUs of
    every node divided by TP (1 when that does not divide)."""
    gpus = len(service.get("gpus") or []) or 1
    tp = int(service.get("tensor_parallel_size") or gpus)
    if service.get("pipeline_parallel_size"):
        return tp, int(service["pipeline_parallel_size"])
    total = gpus * max(1, len(service.get("nodes") or []))
    return tp, total // tp if tp > 0 and total % tp == 0 and multi_node(service) else 1


def placement(service, host, addresses=None):
    """Where ``host`` stands in the service's group: ``{"rank", "nnodes", "head", "head_address", "port",
    "network_interface"}``; None for a service on one node. ``addresses``: {inventory host: address} (the
    inventory's ``ansible_host``); a node's own ``address`` wins, the hostname is the last resort.

    ValueError when ``host`` is not one of the service's nodes (a container the service does not name runs none
    of it: the caller leaves the service out there).
    """
    nodes = node_list(service)
    if len(nodes) < 2:
        return None
    hosts = [n["host"] for n in nodes]
    if host not in hosts:
        raise ValueError(f"{host} is not one of the nodes of service {service.get('name')}: {hosts}")
    head = nodes[0]
    rank = hosts.index(host)
    return {
        "rank": rank,
        "nnodes": len(nodes),
        "head": head["host"],
        "head_address": head["address"] or (addresses or {}).get(head["host"]) or head["host"],
        "port": int(service.get("dist_port") or DEFAULT_DIST_PORT),
        "network_interface": nodes[rank]["network_interface"],
    }


def _node_args(engine, where):
    if not where:
        return []
    common = ["--nnodes", str(where["nnodes"]), "--node-rank", str(where["rank"])]
    address = where["head_address"]
    if engine == "vllm":
        argv = [*common, "--master-addr", address, "--master-port", str(where["port"])]
        return [*argv, "--headless"] if where["rank"] > 0 else argv
    host = f"[{address}]" if ":" in address else address
    return [*common, "--dist-init-addr", f"{host}:{where['port']}"]


# vLLM drains on SIGTERM from 0.18.0: it refuses new requests and lets those in flight finish for up to
# --shutdown-timeout seconds (its default, 0, aborts them). SGLang's main process drains on SIGTERM without a flag.
VLLM_DRAIN_SINCE = "0.18.0"


def drain_args(service, engine_version, drain_timeout_s):
    """``(flags, warning)``: the engine's flags for a drain of ``drain_timeout_s`` seconds before a stop, and what
    to say when the engine cannot drain. A service whose ``args`` set the flag keeps its own."""
    if service.get("engine") != "vllm" or not drain_timeout_s or _sets(service, "shutdown-timeout"):
        return [], ""
    from .plan import version_below  # noqa: PLC0415 - plan imports this module

    where = f"vLLM {engine_version}" if engine_version else "vLLM of an unknown version"
    if not engine_version or version_below(engine_version, VLLM_DRAIN_SINCE):
        return [], (
            f"{where} cannot drain: a stop (a move, a unit change, a key rotation) aborts the requests in flight; "
            f"vLLM {VLLM_DRAIN_SINCE} and later drain them for inference_service_drain_timeout_s (--shutdown-timeout)"
        )
    return ["--shutdown-timeout", str(int(drain_timeout_s))], ""


def build_argv(service, *, load_timeout_s=2700, sglang_launcher=SGLANG_LAUNCHER, where=None, drain=()):
    """The engine's argv (a list of str). It never holds the API key (see the module's docstring).

    ``where``: the node's ``placement`` in a service that spans several nodes (None on one node); ``drain``: the
    flags of ``drain_args``.
    """
    engine = service["engine"]
    if engine not in KV_CACHE_SPELLING:
        raise ValueError(f"unknown engine {engine!r}")
    venv = str(service["environment"]).rstrip("/")
    tp, pp = parallel_sizes(service)
    kv = KV_CACHE_SPELLING[engine].get(service.get("kv_cache_dtype", "bf16"), service.get("kv_cache_dtype"))
    common = [
        "--served-model-name",
        served_name(service),
        "--host",
        str(service.get("bind_address", "127.0.0.1")),
        "--port",
        str(service.get("port", 8000)),
    ]
    if engine == "vllm":
        argv = [f"{venv}/bin/vllm", "serve", str(service["model"]["path"]), *common, "--tensor-parallel-size", str(tp)]
        if pp > 1:
            argv += ["--pipeline-parallel-size", str(pp)]
        if service.get("expert_parallel"):
            argv.append("--enable-expert-parallel")
        argv += ["--kv-cache-dtype", kv]
    else:
        argv = [f"{venv}/bin/python", sglang_launcher, "--model-path", str(service["model"]["path"])]
        argv += [*common, "--tp-size", str(tp)]
        if pp > 1:
            argv += ["--pp-size", str(pp)]
        if service.get("expert_parallel"):
            argv += ["--ep-size", str(tp)]
        # torch.distributed waits at init for the slowest rank's load: raise it above the load time.
        argv += ["--kv-cache-dtype", kv, "--dist-timeout", str(int(load_timeout_s))]
        if not _sets(service, "enable-metrics"):
            argv.append("--enable-metrics")
    argv += _node_args(engine, where)
    argv += list(drain)
    argv += _args(service.get("args"))
    return argv


def served_api(service):
    """What the service's engine does beyond plain answers, by its command line, for the checks that ask it.

    ``tool_call_parser``: the parser that turns the model's tool calls into ``message.tool_calls`` (vLLM parses
    them only with ``--enable-auto-tool-choice`` as well), else None; ``reasoning_parser``: the parser that
    moves the reasoning out of ``content``, else None; ``metrics``: whether ``/metrics`` has the engine's
    metrics (vLLM's unless ``--disable-log-stats``; SGLang's with ``--enable-metrics``, which the role adds).
    """
    engine = service.get("engine")
    tool = _arg(service, "tool-call-parser") or None
    if engine == "vllm" and _arg(service, "enable-auto-tool-choice") is not True:
        tool = None
    if engine == "vllm":
        metrics = _arg(service, "disable-log-stats") is not True
    else:
        metrics = not _sets(service, "enable-metrics") or _arg(service, "enable-metrics") is True
    return {
        "tool_call_parser": str(tool) if tool else None,
        "reasoning_parser": str(_arg(service, "reasoning-parser") or "") or None,
        "metrics": metrics,
    }


def build_environment(service, *, unit, load_timeout_s=2700, common=None, where=None):
    """Environment variables of the unit; secrets (``secret_names``) go to a separate file.

    ``where``: the node's ``placement``; its network interface carries NCCL's and gloo's traffic between the
    nodes (a service's own ``env`` wins).
    """
    env = {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in service["gpus"]),
        UNIT_MARKER_VAR: unit,
    }
    if service["engine"] == "vllm":
        # vLLM gives up on the engine core after 600 s by default; a 30-minute load needs more.
        env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(int(load_timeout_s))
    interface = (where or {}).get("network_interface")
    if interface:
        env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"] = str(interface)
    env.update({str(k): str(v) for k, v in (common or {}).items()})
    env.update({str(k): str(v) for k, v in (service.get("env") or {}).items()})
    return env


def systemd_quote(arg):
    """Quote one argument for ExecStart= (systemd.service "Command lines"); nothing is left to expand."""
    text = str(arg).replace("%", "%%").replace("$", "$$")
    if text and not any(c in text for c in " \t\n\"'\\;"):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


def systemd_command(argv):
    return " ".join(systemd_quote(a) for a in argv)


def secret_names(service):
    """Variables that carry the API key: the probe's and the SGLang launcher's, and vLLM's own."""
    return [API_KEY_VAR, "VLLM_API_KEY"] if service["engine"] == "vllm" else [API_KEY_VAR]


def systemd_environment(name, value):
    """One ``Environment=`` assignment, quoted; systemd expands % specifiers there but not $."""
    text = f"{name}={value}".replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def env_file_line(name, value):
    """One ``EnvironmentFile=`` line: NAME="value" with backslash escapes (no expansion happens there)."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{name}="{text}"'


def display_argv(argv):
    """The argv for humans and logs (it holds no secret)."""
    return [str(a) for a in argv]
