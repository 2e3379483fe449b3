"""The pieces of a source build's plan that are not the job count or the key: placeholders, the CUDA
version of a toolkit, and whether an environment already has a given wheel installed."""

from __future__ import annotations

import json
import os
import re
from urllib.parse import unquote, urlparse

# python_env owns the normalisation of project names (its pins); this package imports it, never the reverse:
# relatively as ansible.module_utils.source_build in a module (Ansible then ships python_env with it), and
# absolutely as plain source_build, with plugins/module_utils on sys.path (the unit tests).
if __package__.startswith("ansible."):
    from ..python_env.pins import normalize_name
else:
    from python_env.pins import normalize_name

PLACEHOLDERS = ("jobs", "threads", "cuda_home", "site_packages", "build_env", "src")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


def expand(value, values):
    """Replace ``{jobs}``, ``{threads}``, ``{cuda_home}``, ... in a string; other braces (CMake's ``${X}``) stay."""

    def one(match):
        got = values.get(match.group(1))
        if got is None or got == "":
            raise ValueError(f"{value!r} uses {{{match.group(1)}}}, which has no value in this build")
        return str(got)

    return _PLACEHOLDER.sub(one, str(value))


def expand_environment(template, values):
    return {key: expand(val, values) for key, val in template.items()}


def variables_using(template, names=("jobs", "threads")):
    """Names of the variables whose value mentions only-parallelism placeholders: they stay out of the key."""
    pattern = re.compile(r"\{(" + "|".join(names) + r")\}")
    return sorted(key for key, val in template.items() if pattern.search(str(val)))


def strip_parallelism(template, names=("jobs", "threads")):
    """The environment with ``{jobs}``/``{threads}`` blanked, for the key: ``-DX={threads} -DY=1`` keeps ``-DY=1``."""
    pattern = re.compile(r"\{(" + "|".join(names) + r")\}")
    return {key: pattern.sub("*", str(val)) for key, val in template.items()}


def nvcc_release(text):
    """The full version from ``nvcc --version`` output ("... release 13.0, V13.0.88" -> "13.0.88"), or ""."""
    match = re.search(r"release (\d+\.\d+), V(\d+\.\d+(?:\.\d+)*)", text or "")
    return match.group(2) if match else ""


def cuda_version(cuda_home, nvcc_output=None):
    """Full toolkit version (``13.0.1``) from ``version.json`` (CUDA >= 11.1), ``version.txt``, or the output
    of ``nvcc --version`` (a callable returning it, for toolkits installed without those files); "" if unknown."""
    if not cuda_home:
        return ""
    try:
        with open(os.path.join(cuda_home, "version.json"), encoding="utf-8") as handle:
            return str(json.load(handle)["cuda"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        with open(os.path.join(cuda_home, "version.txt"), encoding="utf-8") as handle:
            match = re.search(r"(\d+\.\d+(?:\.\d+)?)", handle.read())
            if match:
                return match.group(1)
    except OSError:
        pass
    return nvcc_release(nvcc_output()) if nvcc_output else ""


def wheel_project(filename):
    """The normalized project name of a wheel file name (``flash_attn-2.8.3-cp312-...whl`` -> ``flash-attn``)."""
    return normalize_name(os.path.basename(filename).split("-", 1)[0])


def installed_from(site_packages, wheel_path):
    """True when the project of ``wheel_path`` is installed in ``site_packages`` from exactly that file.

    uv and pip record the source of a local-file install in ``direct_url.json`` (PEP 610); the cache
    path embeds the key, so the URL says which build is installed.
    """
    project = wheel_project(wheel_path)
    try:
        entries = os.listdir(site_packages)
    except FileNotFoundError:
        return False
    for entry in entries:
        if not entry.endswith(".dist-info") or normalize_name(entry[: -len(".dist-info")].rsplit("-", 1)[0]) != project:
            continue
        try:
            with open(os.path.join(site_packages, entry, "direct_url.json"), encoding="utf-8") as handle:
                url = json.load(handle).get("url", "")
        except (OSError, ValueError):
            return False
        parsed = urlparse(url)
        return parsed.scheme == "file" and os.path.normpath(unquote(parsed.path)) == os.path.normpath(wheel_path)
    return False
