"""Helpers of the python_env tests: a fake installed environment laid out as an installer does (fixture venv)."""

import base64
import hashlib
from pathlib import Path

import pytest


def record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install(site: Path, name: str, version: str, files: dict[str, bytes], scripts: dict[str, bytes] | None = None):
    """Lay out a package as an installer would: its files, a METADATA, and a RECORD of everything."""
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
    rows = []
    for rel, data in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        rows.append(f"{rel},{record_digest(data)},{len(data)}")
    for rel, data in (scripts or {}).items():
        path = (site / rel).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        rows.append(f"{rel},{record_digest(data)},{len(data)}")
    meta = (dist / "METADATA").read_bytes()
    rows.append(f"{dist.name}/METADATA,{record_digest(meta)},{len(meta)}")
    rows.append(f"{dist.name}/RECORD,,")
    (dist / "RECORD").write_text("\n".join(rows) + "\n")
    return dist


@pytest.fixture
def venv(tmp_path):
    """An environment root with a site-packages holding two packages, one with a console script."""
    root = tmp_path / "venv"
    site = root / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    (root / "bin").mkdir()
    install(
        site,
        "vllm",
        "0.11.0",
        {
            "vllm/__init__.py": b"__version__ = '0.11.0'\n",
            "vllm/model_executor/models/deepseek_v2.py": b"def forward(x):\n    return x\n",
        },
        scripts={"../../../bin/vllm": b"#!/usr/bin/python\nimport vllm\n"},
    )
    install(site, "torch", "2.10.0.dev20251215+cu130", {"torch/__init__.py": b"cuda = '13.0'\n"})
    (site / "_virtualenv.pth").write_text("import _virtualenv\n")
    (site / "_virtualenv.py").write_text("# venv helper\n")
    return root, site
