"""The ABI guard: the packages an environment's spec pins are still the ones installed.

A CUDA extension built against one torch crashes with ``undefined symbol`` against another, and a
dependency resolved in a later step can silently replace a nightly ``torch ...+cu130`` with a release
build. After every change the installed versions are read from the environment's ``.dist-info``
metadata and compared with each ``name==version`` pin of the spec.

Comparison follows PEP 440 ``==`` closely enough for pins: release segments compare with zero padding
(``2.1`` == ``2.1.0``), ``==X.*`` is a prefix match, and a local label (``+cu130``) in the pin must match
exactly, while a pin without one accepts any local label, as pip and uv do. Pin torch *with* its CUDA
label to guard the CUDA build too.
"""

from __future__ import annotations

import os
import re

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")
_RELEASE = re.compile(r"^v?(\d+(?:\.\d+)*)(.*)$")


def normalize_name(name):
    """PEP 503 normalisation: case-insensitive, runs of -_. are one dash."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(text):
    """(normalized name, version) for a ``name==version`` pin, (name, None) for anything else.

    Markers after ``;`` and URL requirements (``name @ url``) give no pin.
    """
    spec = text.split(";", 1)[0].strip()
    match = _NAME.match(spec)
    if not match:
        raise ValueError(f"not a requirement: {text!r}")
    name, rest = normalize_name(match.group(1)), match.group(3).strip()
    if rest.startswith("@"):
        return name, None
    clauses = [c.strip() for c in rest.split(",") if c.strip()]
    pins = [c[2:].strip() for c in clauses if c.startswith("==") and not c.startswith("===")]
    pins += [c[3:].strip() for c in clauses if c.startswith("===")]
    return name, (pins[0] if len(pins) == 1 and len(clauses) == 1 else None)


def pins_from_requirements(requirements):
    """{name: version} for every exact pin in a list of requirement strings (the last pin of a name wins)."""
    pins = {}
    for text in requirements:
        name, version = parse_requirement(text)
        if version:
            pins[name] = version
    return pins


def _split(version):
    version = version.strip().lower()
    public, _, local = version.partition("+")
    match = _RELEASE.match(public)
    if not match:
        return (), public, local
    release = [int(part) for part in match.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    suffix = re.sub(r"^[-_.]", "", match.group(2))
    return tuple(release), suffix, local.replace("_", ".").replace("-", ".")


def version_matches(pin, installed):
    """True when ``installed`` satisfies ``==pin`` (see the module docstring)."""
    if installed is None:
        return False
    if pin.endswith(".*"):
        want = [int(p) for p in pin[:-2].lstrip("v").split(".") if p.isdigit()]
        release = _RELEASE.match(installed.strip().lower())
        have = [int(p) for p in release.group(1).split(".")] if release else []
        have += [0] * max(0, len(want) - len(have))
        return have[: len(want)] == want
    pin_release, pin_suffix, pin_local = _split(pin)
    release, suffix, local = _split(installed)
    if (pin_release, pin_suffix) != (release, suffix):
        return False
    return not pin_local or pin_local == local


def metadata_fields(path):
    """{field: value} of the header of a distribution's METADATA (or PKG-INFO), up to its first blank line.

    The first value of a field counts. Raises OSError when the file cannot be read.
    """
    fields = {}
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields.setdefault(key, value.strip())
    return fields


def installed_versions(site_packages):
    """{normalized name: version} from the .dist-info (and .egg-info) metadata in a site-packages directory."""
    found = {}
    try:
        entries = sorted(os.listdir(site_packages))
    except FileNotFoundError:
        return found
    for entry in entries:
        if entry.endswith(".dist-info"):
            meta = os.path.join(site_packages, entry, "METADATA")
        elif entry.endswith(".egg-info"):
            meta = os.path.join(site_packages, entry, "PKG-INFO")
        else:
            continue
        try:
            fields = metadata_fields(meta)
        except OSError:
            continue
        name, version = fields.get("Name"), fields.get("Version")
        if name and version:
            found[normalize_name(name)] = version
    return found


def check(pins, installed):
    """Violations of the pins: [{name, pinned, installed}] (installed is None for a missing package)."""
    violations = []
    for name in sorted(pins):
        have = installed.get(normalize_name(name))
        if not version_matches(pins[name], have):
            violations.append({"name": name, "pinned": pins[name], "installed": have})
    return violations


def describe(violations):
    """One line per violation, naming the package and both versions."""
    lines = []
    for v in violations:
        if v["installed"] is None:
            lines.append(f"{v['name']}: the spec pins {v['pinned']}, but it is not installed")
        else:
            lines.append(f"{v['name']}: the spec pins {v['pinned']}, installed is {v['installed']}")
    return lines
