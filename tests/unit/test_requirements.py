"""requirements.yml (for Galaxy users) pins the same collections as the Python lock installs."""

import json
from importlib.util import find_spec
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def installed_version(fqcn):
    namespace, name = fqcn.split(".")
    spec = find_spec("ansible_collections")
    assert spec and spec.submodule_search_locations, "the ansible package is not installed"
    for base in spec.submodule_search_locations:
        manifest = Path(base, namespace, name, "MANIFEST.json")
        if manifest.exists():
            return json.loads(manifest.read_text())["collection_info"]["version"]
    raise AssertionError(f"{fqcn} is not installed by the lock")


def test_every_pinned_collection_matches_the_lock():
    pinned = yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]
    mismatches = {c["name"]: (c["version"], installed_version(c["name"])) for c in pinned}
    mismatches = {k: v for k, v in mismatches.items() if v[0] != v[1]}
    assert not mismatches, f"requirements.yml vs uv.lock (pinned, locked): {mismatches}"


def test_every_collection_the_code_calls_is_pinned():
    pinned = {c["name"] for c in yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]}
    used = set()
    for path in [*ROOT.glob("roles/**/*.yml"), *ROOT.glob("playbooks/*.yml"), *ROOT.glob("molecule/**/*.yml")]:
        for word in path.read_text().split():
            parts = word.rstrip(":").split(".")
            if len(parts) == 3 and word.endswith(":") and parts[0] in {"community", "ansible", "containers"}:
                used.add(".".join(parts[:2]))
    used.discard("ansible.builtin")
    assert used <= pinned, f"collections used but not pinned in requirements.yml: {sorted(used - pinned)}"
