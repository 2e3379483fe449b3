"""Plan-time checks of an inference service: refuse known-bad configurations before anything runs.

A model load takes about 30 minutes; a configuration that is known to fail, produce NaN or silently
lose accuracy must be refused before that, with the reason and the fix. ``plan_service`` returns the
refusals (each with ``check``, ``id``, ``reason``, ``fix``), warnings, and the checkpoint edits that
are still needed. Nothing here touches the machine: the caller reads the checkpoint's configuration.

Checks:

* ``service``: the data itself (name, GPUs, sizes, flags the role manages itself).
* ``nodes``: a service that spans several containers: its node list (no duplicates, hosts of the inventory),
  its GPU count (tensor x pipeline parallel = nodes x the GPUs of each), tensor parallel across hosts only
  over a declared fast fabric (NVLink, InfiniBand).
* ``known_bad``: the backend matrix, kept as data (the role's ``vars/main.yml``), matched against the
  service's flags (or the engine's default for a flag left out; every flag that selects the same backend),
  environment, model (weight quantization, linear attention), engine, compute capability and the range of
  engine versions a rule holds for.
* ``tensor_parallel``: the tensor-parallel size must divide the model's heads, KV heads, linear
  attention heads and intermediate sizes, and each GPU's slice must stay a multiple of the FP8 weight
  block or the quantization group (MiniMax-M2.5: 1536 / 8 = 192 is not a multiple of 128).
* ``kv_cache``: a quantized KV cache needs ``allow_fp8_kv_cache: true``, also when ``auto`` would pick
  up an FP8 KV cache that the checkpoint declares.
* ``memory``: the weights each GPU holds (the checkpoint's size split over the tensor-parallel ranks, the
  weights every rank keeps whole counted on each) plus a minimum KV cache must fit the GPU's memory.
* ``checkpoint_edit``: an edit of the checkpoint's configuration that the installed engine version no
  longer needs is refused (remove it, restore the original from the backup).

Warnings: ``expert_parallel`` on a model with routed experts states the single-stream (concurrency 1) decode
ceiling with and without it (``ceiling.decode_ceiling``, with the hardware profile).
"""

from __future__ import annotations

import json
import re

from . import ceiling, command, modelconfig

ENGINES = ("vllm", "sglang")
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Flags the role sets from service fields; passing them in ``args`` would bypass the checks.
MANAGED_FLAGS = {
    "model": "model.path",
    "model-path": "model.path",
    "served-model-name": "model.served_name",
    "host": "bind_address",
    "port": "port",
    "tensor-parallel-size": "tensor_parallel_size",
    "tp-size": "tensor_parallel_size",
    "tp": "tensor_parallel_size",
    "enable-expert-parallel": "expert_parallel",
    "ep-size": "expert_parallel",
    "expert-parallel-size": "expert_parallel",
    "kv-cache-dtype": "kv_cache_dtype",
    "api-key": "the API key (inference_service_api_key)",
    "pipeline-parallel-size": "pipeline_parallel_size",
    "pp-size": "pipeline_parallel_size",
    "pp": "pipeline_parallel_size",
    "nnodes": "nodes",
    "node-rank": "nodes (the node's place in the list)",
    "master-addr": "nodes (the head's address)",
    "master-port": "dist_port",
    "dist-init-addr": "nodes and dist_port",
    "headless": "nodes (every node but the head runs headless)",
}
# Secrets as flags: every user of the machine reads a command line in /proc/<pid>/cmdline.
SECRET_FLAGS = {
    "admin-api-key": "the role gives no admin key; leave SGLang's admin endpoints off",
    "hf-token": "keep HF_TOKEN in a root-only file listed in inference_service_environment_files",
}
# Secrets as env: the unit file is world-readable and `systemctl show` prints its Environment= lines.
SECRET_ENV = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD)$", re.IGNORECASE)
UNQUANTIZED_KV = ("bf16", "bfloat16", "fp16", "float16", "auto")
# The share of GPU memory the engine takes for weights and KV cache: its flag, and the value assumed when the
# flag is left out (vLLM's default; SGLang works its own out from the GPU, about the same on 96 GB cards).
MEMORY_FRACTION = {"vllm": ("gpu-memory-utilization", 0.9), "sglang": ("mem-fraction-static", 0.9)}
MIN_KV_CACHE_TOKENS = 32768
GIB = 2**30
GB = 1e9


def flag_name(key):
    return str(key).lstrip("-").replace("_", "-").lower()


def refusal(check, ident, reason, fix):
    return {"check": check, "id": ident, "reason": reason, "fix": fix}


def args_in(service, table):
    """(key, flag, table's entry) of each key of the service's args whose flag the table names."""
    for key in service.get("args") or {}:
        entry = table.get(flag_name(key))
        if entry:
            yield key, flag_name(key), entry


def parse_version(text):
    """``"0.17.1rc1.dev5+gabc"`` -> ``((0, 17, 1), True)``: release numbers and whether it is a pre-release."""
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)(.*)$", str(text or ""))
    if not match:
        return None
    release = tuple(int(part) for part in match.group(1).split("."))
    rest = match.group(2).split("+", 1)[0].lower()
    return release, bool(re.search(r"(a|b|rc|dev|alpha|beta|pre)", rest))


def version_below(version, bound):
    """True when ``version`` is before ``bound``; a pre-release of ``bound`` counts as before it."""
    parsed, limit = parse_version(version), parse_version(bound)
    if parsed is None or limit is None:
        raise ValueError(f"cannot compare versions {version!r} and {bound!r}")
    width = max(len(parsed[0]), len(limit[0]))
    left = parsed[0] + (0,) * (width - len(parsed[0]))
    right = limit[0] + (0,) * (width - len(limit[0]))
    return left < right or (left == right and parsed[1])


def version_after(version, bound):
    """True when ``version`` is a later release than ``bound`` (a pre-release or post-release of ``bound`` is not)."""
    parsed, limit = parse_version(version), parse_version(bound)
    if parsed is None or limit is None:
        raise ValueError(f"cannot compare versions {version!r} and {bound!r}")
    width = max(len(parsed[0]), len(limit[0]))
    return parsed[0] + (0,) * (width - len(parsed[0])) > limit[0] + (0,) * (width - len(limit[0]))


def effective_flags(service):
    """Every flag the engine will see, normalised, including those the role sets from service fields."""
    flags = {flag_name(k): v for k, v in (service.get("args") or {}).items()}
    flags["kv-cache-dtype"] = service.get("kv_cache_dtype", "bf16")
    flags["tensor-parallel-size"] = tensor_parallel_size(service)
    if service.get("expert_parallel"):
        flags["enable-expert-parallel"] = True
    return flags


def tensor_parallel_size(service):
    return int(service.get("tensor_parallel_size") or len(service.get("gpus") or []) or 1)


def pipeline_parallel_size(service):
    return command.parallel_sizes(service)[1]


# --- the service data -----------------------------------------------------------------------------


def check_secrets(service):
    """Secrets the service data would put on a command line or in the world-readable unit file."""
    out = []
    for key, flag, fix in args_in(service, SECRET_FLAGS):
        out.append(
            refusal(
                "service",
                f"args.{key}",
                f"args sets --{flag}, a secret on the command line, which every user of the machine "
                "reads in /proc/<pid>/cmdline",
                f"remove it from args; {fix}",
            )
        )
    for key in service.get("env") or {}:
        if SECRET_ENV.search(str(key)):
            out.append(
                refusal(
                    "service",
                    f"env.{key}",
                    f"env sets {key}, which looks like a secret: env goes into the unit file, which every user "
                    "can read (and `systemctl show` prints)",
                    "remove it from env; the API key is inference_service_api_key (the role keeps it in a root-only "
                    "file), other secrets go in a root-only file listed in inference_service_environment_files",
                )
            )
    return out


def check_service_data(service, gpu_count=None):
    out = []
    name = service.get("name", "")
    if not NAME.match(str(name)):
        out.append(
            refusal(
                "service",
                "name",
                f"service name {name!r} is not a valid unit name part",
                "use lower-case letters, digits and dashes (at most 41), starting with a letter or digit",
            )
        )
    if service.get("engine") not in ENGINES:
        out.append(
            refusal("service", "engine", f"engine {service.get('engine')!r} is not supported", "engine: vllm or sglang")
        )
    gpus = service.get("gpus") or []
    if not gpus or len(set(gpus)) != len(gpus) or any((not isinstance(g, int)) or g < 0 for g in gpus):
        out.append(
            refusal("service", "gpus", f"gpus {gpus!r} must be distinct GPU indices", "list GPU indices, e.g. [0, 1]")
        )
    elif gpu_count and max(gpus) >= gpu_count:
        out.append(
            refusal(
                "service",
                "gpus",
                f"gpus {gpus} name a GPU beyond the {gpu_count} of this machine",
                f"use indices 0..{gpu_count - 1}",
            )
        )
    tp = tensor_parallel_size(service)
    if gpus and not command.multi_node(service) and (tp < 1 or len(gpus) % (tp * pipeline_parallel_size(service))):
        out.append(
            refusal(
                "service",
                "tensor_parallel_size",
                f"tensor_parallel_size {tp} x pipeline_parallel_size {pipeline_parallel_size(service)} does not "
                f"divide the {len(gpus)} GPUs of the service",
                f"tensor_parallel_size {len(gpus)} and pipeline_parallel_size 1, or list {tp} GPUs",
            )
        )
    for key, flag, field in args_in(service, MANAGED_FLAGS):
        out.append(
            refusal(
                "service",
                f"args.{key}",
                f"args sets --{flag}, which the role derives from {field}",
                f"remove it from args and set {field}",
            )
        )
    collectives = (service.get("model") or {}).get("collectives_per_layer")
    if collectives is not None and not ceiling.valid_collectives_per_layer(collectives):
        out.append(
            refusal(
                "service",
                "model.collectives_per_layer",
                f"model.collectives_per_layer {collectives!r} is not a whole number of at least 1",
                "the tensor-parallel collectives one token waits for in each layer (docs/ceiling.md), or leave it "
                "out for the count of the model's architecture",
            )
        )
    out += check_secrets(service)
    for key in service.get("env") or {}:
        if not ENV_NAME.match(str(key)):
            out.append(
                refusal(
                    "service",
                    f"env.{key}",
                    f"environment variable name {key!r} is invalid",
                    "use [A-Za-z_][A-Za-z0-9_]*",
                )
            )
    port = service.get("port", 8000)
    if not isinstance(port, int) or not 0 < port < 65536:
        out.append(refusal("service", "port", f"port {port!r} is not a TCP port", "a number in 1..65535"))
    return out


# --- several nodes ---------------------------------------------------------------------------------

INTERFACE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


def check_nodes(service, inventory_hosts=None):
    """Refusals of a service that spans several nodes (``nodes``): the list, the GPU count, the fabric.

    ``inventory_hosts``: the hosts of the inventory (None: not known here, that check is left out). Tensor
    parallel across hosts needs a fast fabric: each layer waits for its all-reduces, and over Ethernet or PCIe
    between hosts they cost more than the layer's work; pipeline parallel sends one activation per stage.
    """
    if not service.get("nodes"):
        for field in ("fabric", "dist_port", "network_interface"):
            if service.get(field) not in (None, ""):
                return [
                    refusal(
                        "nodes",
                        field,
                        f"{field} is set but the service names no nodes: it runs on one container",
                        f"remove {field}, or list the containers the service spans in nodes (the head first)",
                    )
                ]
        return []
    out = []
    nodes = command.node_list(service)
    hosts = [n["host"] for n in nodes]
    if any(not h for h in hosts):
        out.append(
            refusal(
                "nodes",
                "nodes.host",
                f"nodes {service['nodes']!r} has an entry without a host",
                "name each node by its inventory hostname, or as a mapping "
                "{host: <hostname>, address: ..., network_interface: ...}",
            )
        )
        return out
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        out.append(
            refusal(
                "nodes",
                "nodes.duplicate",
                f"nodes {hosts} names {', '.join(twice)} more than once: one container runs one rank",
                "list each container once, the head first",
            )
        )
    if inventory_hosts is not None:
        unknown = [h for h in hosts if h not in inventory_hosts]
        if unknown:
            where = "its head" if unknown[0] == hosts[0] else "nodes"
            out.append(
                refusal(
                    "nodes",
                    "nodes.inventory",
                    f"nodes names {', '.join(unknown)}, not a host of the inventory ({where}); every node is a "
                    "container of the inventory, which runs its own rank",
                    "name containers of the inventory (inventory hostnames), the head first",
                )
            )
    for node in nodes:
        interface = node["network_interface"]
        if interface is not None and not INTERFACE.match(str(interface)):
            out.append(
                refusal(
                    "nodes",
                    "network_interface",
                    f"network_interface {interface!r} of {node['host']} is not a network interface name",
                    "the interface the node reaches the others on, as `ip link` names it (eth1, ib0)",
                )
            )
    fabric = service.get("fabric", "ethernet")
    if fabric not in command.FABRICS:
        out.append(
            refusal(
                "nodes",
                "fabric",
                f"fabric {fabric!r} is not one of {', '.join(command.FABRICS)}",
                "fabric: ethernet (the default), or the link the nodes really have",
            )
        )
    return out + _check_node_sizes(service, nodes, fabric)


def _check_node_sizes(service, nodes, fabric):
    """The port, the GPU count and tensor parallel across hosts of a service with nodes."""
    out = []
    port = service.get("dist_port", command.DEFAULT_DIST_PORT)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536 or port == service.get("port", 8000):
        out.append(
            refusal(
                "nodes",
                "dist_port",
                f"dist_port {port!r} is not a free TCP port of the head (the API has port {service.get('port', 8000)})",
                f"dist_port: {command.DEFAULT_DIST_PORT}",
            )
        )
    if len(nodes) < 2:
        return out
    gpus = len(service.get("gpus") or [])
    tp, pp = command.parallel_sizes(service)
    if gpus and tp * pp != len(nodes) * gpus:
        fix = f"tensor_parallel_size {gpus} and pipeline_parallel_size {len(nodes)}"
        out.append(
            refusal(
                "nodes",
                "nodes.gpus",
                f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} = {tp * pp} GPUs, but the service has "
                f"{len(nodes)} nodes x {gpus} GPUs (gpus lists the GPUs of each node) = {len(nodes) * gpus}",
                fix + " (tensor parallel within each node, pipeline parallel across them)",
            )
        )
    if gpus and tp > 0 and gpus % tp and fabric not in command.FAST_FABRICS:
        out.append(
            refusal(
                "nodes",
                "nodes.tensor_parallel",
                f"tensor_parallel_size {tp} spans hosts (each has {gpus} GPUs) over fabric {fabric}: every layer "
                "waits for tensor-parallel all-reduces between the hosts, which only NVLink or InfiniBand carry fast "
                "enough",
                f"tensor_parallel_size {gpus} and pipeline_parallel_size {len(nodes)} (tensor parallel within one "
                "host, pipeline parallel across hosts), or declare fabric: infiniband or nvlink when the hosts have it",
            )
        )
    return out


# --- the known-bad matrix -------------------------------------------------------------------------


def model_facts(service, config=None, quant_config=None):
    """What known-bad rules may ask about the model: ``quantization`` (the checkpoint's weight format, else
    the service's ``model.quantization``) and ``linear_attention`` (None when there is no config to tell)."""
    declared = (service.get("model") or {}).get("quantization")
    if config is None:
        return {"quantization": declared, "linear_attention": None}
    cfg = modelconfig.text_config(config)
    return {
        "quantization": modelconfig.quantization(config, quant_config).get("method") or declared,
        "linear_attention": modelconfig.has_linear_attention(cfg),
    }


def flag_value(flags, name):
    """``(present, value)`` of a flag in ``effective_flags``; a dotted name (``attention-config.backend``) is the
    flag as written with its dot, or that key of the flag's mapping (a dict, or a JSON object as text)."""
    name = flag_name(name)
    if name in flags and flags[name] not in (None, False, ""):
        return True, flags[name]
    if "." in name:
        parent, key = name.split(".", 1)
        mapping = flags.get(parent)
        if isinstance(mapping, str):
            try:
                mapping = json.loads(mapping)
            except ValueError:
                mapping = None
        if isinstance(mapping, dict):
            value = next((v for k, v in mapping.items() if flag_name(k) == flag_name(key)), None)
            if value not in (None, False, ""):
                return True, value
    return False, None


def _flag_values(cond, flags):
    """``(flag, present, value)`` of each value the engine uses for a flag condition.

    ``flag`` (its engine ``default`` when left out) is replaced by each of ``overridden_by`` for the part of the
    work that flag selects (SGLang's prefill-/decode-attention-backend); it counts for each part left to it.
    ``also`` names flags that select the same thing under another name or for other work (vLLM's
    ``attention-config.backend``, SGLang's speculative draft): each counts when it is set.
    """
    main_name = flag_name(cond["flag"])
    main = (main_name, *flag_value(flags, main_name))
    if not main[1] and "default" in cond:  # the engine's own choice when the flag is left out
        main = (main_name, True, cond["default"])
    parts = [(flag_name(p), *flag_value(flags, p)) for p in cond.get("overridden_by") or []]
    values = [part if part[1] else main for part in parts] if parts else [main]
    return values + [v for v in ((flag_name(a), *flag_value(flags, a)) for a in cond.get("also") or []) if v[1]]


def _value_holds(cond, present, value):
    text = "" if value is None else str(value)
    if "in" in cond:
        return present and text.lower() in {str(v).lower() for v in cond["in"]}
    if "not_in" in cond:
        return not present or text.lower() not in {str(v).lower() for v in cond["not_in"]}
    if "prefix" in cond:
        return present and text.lower().startswith(str(cond["prefix"]).lower())
    if "contains" in cond:
        return present and str(cond["contains"]).lower() in text.lower()
    return present == bool(cond.get("present", True))


def _condition_matches(cond, flags, env, model=None):
    """None when a rule's condition does not hold; else the ``(flag, value)`` pairs that make a flag condition hold
    (it holds when it holds for any value the engine uses), or an empty list for the other conditions."""
    if "flag" in cond:
        values = _flag_values(cond, flags)
        if any(key in cond for key in ("in", "not_in", "prefix", "contains")):
            matches = [(name, value) for name, present, value in values if _value_holds(cond, present, value)]
            return matches or None
        present = [(name, value) for name, found, value in values if found]
        return present if bool(present) == bool(cond.get("present", True)) else None
    if "model" in cond:
        value = (model or {}).get(cond["model"])
        return [] if _value_holds(cond, value not in (None, False, ""), value) else None
    name = cond["env"]
    return [] if _value_holds(cond, name in env and env[name] not in (None, ""), env.get(name)) else None


def _version_gate(rule, engine, engine_version):
    """``(applies, note, warning)`` of a rule's engine-version bounds: ``engine_version_below`` (the rule applies
    before it) and ``engine_version_max`` (up to and including it). An unknown version applies the rule, noted."""
    below, last = rule.get("engine_version_below"), rule.get("engine_version_max")
    if engine_version:
        outside = (below and not version_below(engine_version, below)) or (last and version_after(engine_version, last))
        return not outside, "", None
    if below:
        return (
            True,
            f" (fixed from {engine} {below}; the installed version is unknown)",
            f"{rule['id']}: set engine_version to lift this check if {below} or later is installed",
        )
    if last:
        return (
            True,
            f" (known up to {engine} {last}; the installed version is unknown)",
            f"{rule['id']}: set engine_version to lift this check if a release after {last} is installed",
        )
    return True, "", None


def check_known_bad(service, rules, compute_capability=None, engine_version=None, model=None):
    """Refusals and warnings of the known-bad rules; ``model`` as ``model_facts`` (default: from the service)."""
    out, warnings = [], []
    flags = effective_flags(service)
    env = {str(k): v for k, v in (service.get("env") or {}).items()}
    model = model_facts(service) if model is None else model
    for rule in rules:
        if rule.get("engine", "any") not in ("any", service.get("engine")):
            continue
        capabilities = [str(c) for c in rule.get("compute_capability") or []]
        if capabilities and str(compute_capability) not in capabilities:
            continue
        conditions = rule.get("when") or []
        matches = [_condition_matches(c, flags, env, model) for c in conditions]
        if any(m is None for m in matches):
            continue
        applies, note, warning = _version_gate(rule, service.get("engine"), engine_version)
        if not applies:
            continue
        if warning:
            warnings.append(warning)
        # A value selected by another flag than the one the rule's fix names: say which, and that it needs the fix.
        others = {}
        for cond, found in zip(conditions, matches, strict=True):
            for name, value in found:
                if "flag" in cond and name != flag_name(cond["flag"]):
                    others.setdefault(name, value)
        reason, fix = rule["reason"], rule["fix"]
        if others:
            reason += " (" + ", ".join(f"{name}: {value}" for name, value in others.items()) + ")"
            fix += f"; the same for {', '.join(others)}, or remove it"
        source = f" [{rule['source']}]" if rule.get("source") else ""
        out.append(refusal("known_bad", rule["id"], reason + note + source, fix))
    return out, warnings


# --- tensor parallel against the model's dimensions -----------------------------------------------


def _tp_problems(cfg, quant, tp, expert_parallel):
    """Problems of one tensor-parallel size, as (dimension, text) pairs."""
    problems = []

    def divides(value, what):
        if value and value % tp:
            problems.append((what, f"{what} {value} is not divisible by TP {tp}"))
            return False
        return True

    heads = cfg.get("num_attention_heads")
    divides(heads, "attention heads")
    kv = cfg.get("num_key_value_heads")
    if kv and not modelconfig.is_mla(cfg):
        if kv >= tp:
            divides(kv, "KV heads")
        elif tp % kv:
            problems.append(("KV heads", f"TP {tp} is not a multiple of the {kv} KV heads (each is replicated)"))
    divides(cfg.get("linear_num_key_heads"), "linear-attention key heads")
    divides(cfg.get("linear_num_value_heads"), "linear-attention value heads")

    block = quant.get("block") or []
    granule, granule_name = 0, ""
    if quant.get("method") == "fp8" and block:
        granule, granule_name = max(block), "FP8 weight block"
    elif quant.get("group_size"):
        granule, granule_name = int(quant["group_size"]), f"{quant.get('method') or 'quantization'} group"

    def split(value, what):
        if not value or not divides(value, what):
            return
        per_gpu = value // tp
        if granule and per_gpu % granule:
            problems.append(
                (
                    what,
                    f"{what} {value}/{tp} = {per_gpu} per GPU is not a multiple of the {granule_name} {granule}",
                )
            )

    split(modelconfig.dense_intermediate_size(cfg), "intermediate size")
    split(modelconfig.shared_expert_intermediate_size(cfg), "shared-expert intermediate size")
    experts = modelconfig.num_experts(cfg)
    if experts and expert_parallel:
        if experts % tp:
            problems.append(("experts", f"{experts} experts do not split evenly over expert-parallel size {tp}"))
    else:
        split(modelconfig.expert_intermediate_size(cfg), "expert intermediate size")
    return problems


def check_tensor_parallel(service, config, quant_config=None, gpu_count=None):
    cfg = modelconfig.text_config(config)
    quant = modelconfig.quantization(config, quant_config)
    tp = tensor_parallel_size(service)
    ep = bool(service.get("expert_parallel"))
    problems = _tp_problems(cfg, quant, tp, ep)
    if not problems:
        return []
    limit = gpu_count or max(tp, len(service.get("gpus") or []), 8)
    plain = [n for n in range(1, limit + 1) if not _tp_problems(cfg, quant, n, False)]
    with_ep = [n for n in range(1, limit + 1) if not _tp_problems(cfg, quant, n, True)]
    fixes = []
    smaller = [n for n in plain if n < tp]
    if smaller:
        # The fix must pass check_service_data too: a size that does not divide the GPU list comes with a list.
        gpus = list(service.get("gpus") or [])
        size = max(smaller)
        fixes.append(f"tensor_parallel_size {size}" + (f" and gpus {gpus[:size]}" if gpus and len(gpus) % size else ""))
    if not ep and tp in with_ep:
        fixes.append(f"tensor_parallel_size {tp} with expert_parallel: true (each GPU holds whole experts)")
    if not fixes:
        fixes.append(f"a tensor_parallel_size from {plain or with_ep or 'none'}")
    return [
        refusal("tensor_parallel", f"tp.{dimension.replace(' ', '_')}", text + " (config.json)", " or ".join(fixes))
        for dimension, text in problems
    ]


# --- KV cache -------------------------------------------------------------------------------------


def check_kv_cache(service, config=None, quant_config=None):
    dtype = str(service.get("kv_cache_dtype", "bf16")).lower()
    if service.get("allow_fp8_kv_cache"):
        return []
    if dtype not in UNQUANTIZED_KV:
        return [
            refusal(
                "kv_cache",
                "kv_cache.quantized",
                f"kv_cache_dtype {dtype} quantizes the KV cache; without calibrated scales (scale 1.0) "
                "long-context accuracy degrades silently",
                "kv_cache_dtype: bf16, or set allow_fp8_kv_cache: true after measuring accuracy",
            )
        ]
    if dtype == "auto" and config is not None:
        declared = modelconfig.quantization(config, quant_config).get("kv_cache")
        if declared:
            return [
                refusal(
                    "kv_cache",
                    "kv_cache.declared",
                    f"kv_cache_dtype auto follows the checkpoint, which declares a {declared} KV cache: the "
                    "engine would run a quantized KV cache (scale 1.0 when uncalibrated) without anyone asking for it",
                    "kv_cache_dtype: bf16, or set allow_fp8_kv_cache: true after measuring accuracy",
                )
            ]
    return []


# --- memory fit -----------------------------------------------------------------------------------


def _weights(service, config, checkpoint_bytes):
    """``(stored bytes, bytes whole on every rank, where the size comes from)``, or None when unknown."""
    cfg = modelconfig.text_config(config)
    facts = service.get("model") or {}
    model = None
    if facts.get("active_params_b") and facts.get("quantization"):
        try:
            model = ceiling.Model.from_config(config, {"name": service.get("name", "model"), **facts})
        except ceiling.CeilingError:
            model = None
    if model is not None:
        replicated = model.replicated_bytes()
    else:  # the replicated weights are never quantized in a checkpoint that quantizes only the experts
        replicated = 2.0 * sum(modelconfig.replicated_params(cfg).values())
    if checkpoint_bytes:
        return float(checkpoint_bytes), replicated, modelconfig.SAFETENSORS_INDEX
    if model is not None:
        return model.stored_bytes(), replicated, "estimated from config.json and model.active_params_b"
    return None


def memory_per_gpu(service, config, tp, weights, min_kv_tokens, *, pp=1):
    """``(weight bytes, KV-cache bytes)`` one GPU holds at tensor-parallel size ``tp``; with ``pp`` pipeline
    stages each holds its share of the layers (the weights every rank keeps whole still counted whole)."""
    stored, replicated, _ = weights
    replicated = replicated if tp * pp > 1 else 0.0
    kv_bytes = 1 if str(service.get("kv_cache_dtype", "bf16")).lower().startswith("fp8") else 2
    layout = ceiling.kv_layout(modelconfig.text_config(config))
    kv = ceiling.kv_bytes_per_gpu(layout, tp, kv_bytes) * min_kv_tokens / pp
    return (stored - replicated) / (tp * pp) + replicated, kv


def check_memory_fit(
    service,
    config,
    quant_config=None,
    *,
    memory_gb=None,
    checkpoint_bytes=None,
    min_kv_tokens=MIN_KV_CACHE_TOKENS,
    gpu_count=None,
):
    """Refusals and warnings: each GPU's weights plus a minimum KV cache must fit its memory.

    ``memory_gb``: the GPU's memory in GiB (as nvidia-smi's MiB / 1024 rounds it, 96 for an RTX PRO 6000).
    The stored size is the checkpoint's (``checkpoint_bytes``, from its safetensors index) or, without it,
    estimated from ``model.active_params_b`` and the config. Replicated weights count whole on every GPU.
    """
    if not memory_gb or config is None:
        return [], []
    weights = _weights(service, config, checkpoint_bytes)
    if weights is None:
        return [], [
            "memory fit not checked: the checkpoint has no model.safetensors.index.json and the service sets no "
            "model.active_params_b and model.quantization to estimate its size from"
        ]
    engine = service.get("engine")
    flag, default = MEMORY_FRACTION.get(engine, ("", 0.9))
    fraction = float(effective_flags(service).get(flag) or default)
    usable = float(memory_gb) * GIB * fraction
    tp, pp = tensor_parallel_size(service), pipeline_parallel_size(service)
    per_gpu, kv = memory_per_gpu(service, config, tp, weights, min_kv_tokens, pp=pp)
    if per_gpu + kv <= usable:
        return [], []
    stored, replicated, source = weights
    reason = (
        f"{per_gpu / GB:.1f} GB of weights per GPU at TP {tp}"
        + (f" x PP {pp}" if pp > 1 else "")
        + f" ({stored / GB:.0f} GB in all, {source}; "
        f"{replicated / GB:.2f} GB of them whole on every GPU) and {kv / GB:.1f} GB of KV cache for "
        f"{min_kv_tokens} tokens need {(per_gpu + kv) / GB:.1f} GB, more than the {usable / GB:.1f} GB "
        f"usable of each GPU's {memory_gb} GiB (memory fraction {fraction:g})"
    )
    cfg, quant = modelconfig.text_config(config), modelconfig.quantization(config, quant_config)
    ep = bool(service.get("expert_parallel"))
    gpus = list(service.get("gpus") or [])
    fits = [
        n
        for n in range(tp + 1, (gpu_count or max(tp, 8)) + 1)
        if sum(memory_per_gpu(service, config, n, weights, min_kv_tokens)) <= usable
        and not _tp_problems(cfg, quant, n, ep)
    ]
    if fits:
        size = fits[0]
        needed = f"tensor_parallel_size {size}" + (f" and gpus {list(range(size))}" if len(gpus) % size else "")
        fix = f"{needed}, or a checkpoint with fewer bits per weight"
    else:
        fix = "a checkpoint with fewer bits per weight, or a machine with more GPU memory: it fits no GPU count here"
    return [refusal("memory", "memory.fit", reason, fix)], []


# --- expert parallel at concurrency 1 -------------------------------------------------------------


def check_expert_parallel(service, config, hardware=None, quant_config=None):
    """Warnings: expert parallel lowers the single-stream decode ceiling; say by how much.

    With expert parallel each GPU holds whole experts and a token's routed experts land unevenly, so every step
    waits for the busiest GPU (``ceiling.expected_max_experts``). The comparison is with plain tensor parallel at
    the same size, or at the largest smaller size that fits the model when the same size does not (MiniMax-M2.5 at
    TP 8). ``hardware`` is the hardware profile (``inference_service_hardware``); without it, or without the model
    facts, the warning says what is missing.
    """
    if not service.get("expert_parallel") or config is None:
        return []
    cfg = modelconfig.text_config(config)
    k = modelconfig.experts_per_token(cfg)
    tp = tensor_parallel_size(service)
    if not modelconfig.num_experts(cfg) or not k or tp < 2:
        return []
    quant = modelconfig.quantization(config, quant_config)
    plain = next((n for n in range(tp, 0, -1) if not _tp_problems(cfg, quant, n, False)), None)
    facts = service.get("model") or {}
    try:
        model = ceiling.Model.from_config(config, {"name": service.get("name", "model"), **facts})
        profile = ceiling.Hardware.from_dict(hardware or {})
        with_ep = ceiling.decode_ceiling(model, profile, tp, expert_parallel=True)
        without = ceiling.decode_ceiling(model, profile, plain) if plain else None
    except (ceiling.CeilingError, TypeError, ValueError) as exc:
        return [
            "expert_parallel: each token waits for the GPU that holds most of its routed experts, which lowers the "
            "single-stream speed (concurrency 1); no ceiling to say by how much: "
            f"{exc} (model.active_params_b, model.quantization and inference_service_hardware, docs/ceiling.md)"
        ]
    text = (
        f"expert_parallel: the single-stream decode ceiling (concurrency 1) at TP {tp} is "
        f"{with_ep['tokens_per_s']} tok/s with expert parallel"
    )
    if without is None:
        text += ", and no tensor-parallel size fits the model without it"
    else:
        drop = 100 * (1 - with_ep["tokens_per_s"] / without["tokens_per_s"])
        text += f" and {without['tokens_per_s']} tok/s without it"
        text += f" at TP {plain}, the largest size that fits the model without it" if plain != tp else ""
        text += f" ({abs(drop):.0f} % {'lower' if drop >= 0 else 'higher'})"
    return [
        text + f": each token waits for the GPU that holds most of its {k} routed experts "
        f"({with_ep['routed_experts_on_busiest_gpu']:g} on average, against {k / tp:g} without it); keep it only "
        "where a benchmark at the concurrency you serve shows it helps (docs/ceiling.md)"
    ]


# --- version-gated checkpoint edits ---------------------------------------------------------------


def check_checkpoint_edits(service, engine_version=None):
    """Split the service's checkpoint edits into refusals (no longer needed), needed edits and warnings."""
    refusals, needed, warnings = [], [], []
    for edit in service.get("checkpoint_edits") or []:
        label = f"{edit['file']}:{edit['key']}"
        bound = edit.get("needed_below")
        if bound and engine_version and not version_below(engine_version, bound):
            change = f" ({edit['change']})" if edit.get("change") else ""
            refusals.append(
                refusal(
                    "checkpoint_edit",
                    f"edit.{label}",
                    f"the edit of {label} is not needed with {service['engine']} {engine_version}: "
                    f"fixed from {bound}{change}",
                    f"remove it from checkpoint_edits and restore {edit['file']} from its backup "
                    "(the newest <file>.<timestamp>~ next to it)",
                )
            )
            continue
        if bound and not engine_version:
            warnings.append(f"{label}: engine version unknown, applying the edit needed before {bound}")
        needed.append(edit)
    return refusals, needed, warnings


# --- everything -----------------------------------------------------------------------------------


def plan_service(
    service,
    *,
    config=None,
    quant_config=None,
    known_bad=(),
    compute_capability=None,
    engine_version=None,
    gpu_count=None,
    memory_gb=None,
    checkpoint_bytes=None,
    min_kv_tokens=MIN_KV_CACHE_TOKENS,
    hardware=None,
    inventory_hosts=None,
):
    """Run every check; ``config`` is the checkpoint's config.json (None: model checks are refused);
    ``hardware`` the hardware profile, for the ceilings an expert-parallel warning states; ``inventory_hosts``
    the inventory's hosts, which a service's nodes must be among (None: not checked)."""
    version = engine_version or service.get("engine_version")
    refusals = check_service_data(service, gpu_count)
    refusals += check_nodes(service, inventory_hosts)
    model = model_facts(service, config, quant_config)
    bad, warnings = check_known_bad(service, known_bad, compute_capability, version, model)
    refusals += bad
    if config is None:
        refusals.append(
            refusal(
                "tensor_parallel",
                "config",
                f"no config.json under {service.get('model', {}).get('path')}: the model cannot be checked",
                "download the checkpoint first, or fix model.path",
            )
        )
    else:
        refusals += check_tensor_parallel(service, config, quant_config, gpu_count)
        memory, memory_warnings = check_memory_fit(
            service,
            config,
            quant_config,
            memory_gb=memory_gb,
            checkpoint_bytes=checkpoint_bytes,
            min_kv_tokens=min_kv_tokens,
            gpu_count=gpu_count,
        )
        refusals += memory
        warnings += memory_warnings
        warnings += check_expert_parallel(service, config, hardware, quant_config)
    refusals += check_kv_cache(service, config, quant_config)
    edit_refusals, needed, edit_warnings = check_checkpoint_edits(service, version)
    refusals += edit_refusals
    return {"refusals": refusals, "warnings": warnings + edit_warnings, "edits": needed}


def format_refusals(name, refusals):
    lines = [f"service {name} refused before anything is installed:"]
    lines += [f"- {r['reason']}. Fix: {r['fix']}." for r in refusals]
    return "\n".join(lines)
