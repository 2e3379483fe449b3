"""Audit a Python environment against the RECORD files of its installed wheels.

Every installer writes ``<name>.dist-info/RECORD``: one CSV row per installed file with its hash
(``sha256=<urlsafe base64, no padding>``) and size. A file whose content no longer matches, a recorded
file that is gone, and a file that no RECORD lists are the three ways an environment drifts from what
was installed: a debugging edit left in a model file, a hand-copied module, a half-removed package.

The stack's own changes (a ``.pth`` hook, a patch it applied from data) are declared as *expected*:
by a glob relative to site-packages (or an absolute path), optionally with the SHA-256 the file must
have, and by the manifest ``<env>/.inferhost/patched.json`` that roles write when they change an
installed file. Everything else is drift.
"""

from __future__ import annotations

import base64
import csv
import fnmatch
import hashlib
import io
import json
import os

from .pins import metadata_fields, normalize_name

# Files a virtualenv creator puts into site-packages itself; no wheel installs them.
VENV_FILES = ("_virtualenv.pth", "_virtualenv.py")
MANIFEST = os.path.join(".inferhost", "patched.json")
CHUNK = 1024 * 1024


def record_hash(path, algorithm="sha256"):
    """A file's digest in RECORD notation: urlsafe base64 without padding."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")


def sha256_hex(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def parse_record(text):
    """Rows of a RECORD file as (path, algorithm or None, digest or None, size or None)."""
    rows = []
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        path = row[0]
        algorithm = digest = size = None
        if len(row) > 1 and "=" in row[1]:
            algorithm, _, digest = row[1].partition("=")
        if len(row) > 2 and row[2].strip().isdigit():
            size = int(row[2])
        rows.append((path, algorithm, digest, size))
    return rows


def dist_name(dist_info_dir):
    """The project name of a .dist-info directory, from METADATA, else from the directory name."""
    try:
        fields = metadata_fields(os.path.join(dist_info_dir, "METADATA"))
    except OSError:
        fields = {}
    return fields["Name"] if "Name" in fields else os.path.basename(dist_info_dir).rsplit("-", 1)[0]


def load_manifest(env_root):
    """Entries of the stack's patch manifest: [{path, sha256, reason}], paths relative to site-packages."""
    path = os.path.join(env_root, MANIFEST)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable JSON manifest ({err})") from None
    entries = data.get("files", []) if isinstance(data, dict) else data
    return [e for e in entries if isinstance(e, dict) and e.get("path")]


class Expected:
    """The declared changes: a path glob, an optional SHA-256 the file must have, and why."""

    def __init__(self, entries, site_packages):
        self.site_packages = site_packages
        self.entries = []
        for entry in entries:
            pattern = entry["path"]
            if not os.path.isabs(pattern):
                pattern = os.path.join(site_packages, pattern)
            self.entries.append((os.path.normpath(pattern), entry.get("sha256") or None, entry.get("reason", "")))

    def match(self, path):
        """(reason, None) when declared, (None, why not) when a glob matched but the hash did not, else None."""
        mismatch = None
        for pattern, sha, reason in self.entries:
            if not fnmatch.fnmatchcase(path, pattern):
                continue
            if sha is None:
                return reason or "declared", None
            try:
                actual = sha256_hex(path)
            except OSError:
                actual = None
            if actual == sha:
                return reason or "declared", None
            mismatch = f"declared with sha256 {sha[:12]}..., found {(actual or 'unreadable')[:12]}..."
        return (None, mismatch) if mismatch else None


def _ignored(name, ignore):
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in ignore)


def _check_recorded(path, row, record_mtime, hash_mode):
    """(kind, detail) for a recorded file that differs from its RECORD row, else None."""
    _, algorithm, digest, size = row
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return "missing", "listed in RECORD, not on disk"
    if size is not None and stat.st_size != size:
        return "modified", f"size {stat.st_size}, RECORD says {size}"
    if not algorithm or not digest:
        return None  # RECORD itself, and installer files written without a hash
    if hash_mode == "mtime" and stat.st_mtime <= record_mtime:
        return None
    try:
        actual = record_hash(path, algorithm)
    except (OSError, ValueError) as err:
        return "modified", f"cannot hash: {err}"
    return ("modified", f"{algorithm} differs from RECORD") if actual != digest else None


def _recorded_findings(site_packages, ignore, hash_mode):
    """Walk every RECORD: ({path: package}, findings, number of packages)."""
    recorded, findings, packages = {}, [], 0
    for entry in sorted(os.listdir(site_packages)):
        dist_info = os.path.join(site_packages, entry)
        record = os.path.join(dist_info, "RECORD")
        if not entry.endswith(".dist-info") or not os.path.isfile(record):
            continue
        packages += 1
        package = dist_name(dist_info)
        record_mtime = os.stat(record).st_mtime
        with open(record, encoding="utf-8", errors="replace") as handle:
            rows = parse_record(handle.read())
        for row in rows:
            path = os.path.normpath(os.path.join(site_packages, row[0]))
            recorded[path] = package
            if _ignored(os.path.basename(path), ignore):
                continue
            found = _check_recorded(path, row, record_mtime, hash_mode)
            if found:
                findings.append((path, found[0], package, found[1]))
    return recorded, findings, packages


def _unrecorded_findings(site_packages, recorded, ignore):
    findings = []
    for directory, subdirs, files in os.walk(site_packages):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for name in sorted(files):
            path = os.path.join(directory, name)
            if path in recorded or _ignored(name, ignore):
                continue
            if directory == site_packages and name in VENV_FILES:
                continue
            findings.append((path, "unrecorded", None, "in no RECORD"))
    return findings


def audit(site_packages, env_root=None, *, expected=(), ignore=("*.pyc",), use_manifest=True, hash_mode="full"):
    """Compare an environment with its RECORDs.

    site_packages: the directory that holds the .dist-info directories.
    env_root: the environment root (for the manifest and for reporting paths); defaults to site_packages.
    expected: [{path, sha256?, reason?}] declared changes (see the module docstring).
    ignore: basename globs never reported (byte code by default; ``__pycache__`` is always skipped).
    hash_mode: ``full`` hashes every recorded file; ``mtime`` hashes only files changed after their RECORD
    was written (a quick pass for big environments; an edit keeps its mtime only if forged).

    Returns {"drift": [...], "expected": [...], "packages": n, "files": n}; each finding is
    {"path", "kind" (modified|missing|unrecorded), "package", "detail"} plus "reason" when expected.
    """
    site_packages = os.path.normpath(site_packages)
    env_root = os.path.normpath(env_root or site_packages)
    declared = list(expected)
    if use_manifest:
        declared += load_manifest(env_root)
    wanted = Expected(declared, site_packages)

    recorded, findings, packages = _recorded_findings(site_packages, ignore, hash_mode)
    findings += _unrecorded_findings(site_packages, recorded, ignore)

    result = {"drift": [], "expected": [], "packages": packages, "files": len(recorded)}
    for path, kind, package, detail in sorted(findings):
        item = {"path": os.path.relpath(path, env_root), "kind": kind, "package": package, "detail": detail}
        match = wanted.match(path) if kind != "missing" else None
        if match and match[0]:
            item["reason"] = match[0]
            result["expected"].append(item)
        else:
            if match and match[1]:
                item["detail"] += f"; {match[1]}"
            result["drift"].append(item)
    return result


def find_site_packages(env_root):
    """The purelib directory of a virtual environment (``lib/pythonX.Y/site-packages``), or None."""
    lib = os.path.join(env_root, "lib")
    try:
        candidates = sorted(
            os.path.join(lib, d, "site-packages")
            for d in os.listdir(lib)
            if d.startswith("python") and os.path.isdir(os.path.join(lib, d, "site-packages"))
        )
    except FileNotFoundError:
        return None
    return candidates[-1] if candidates else None


def venv_site_packages(env_root):
    """find_site_packages of a directory that must be a virtual environment; ValueError saying so when it is not."""
    site = find_site_packages(env_root)
    if site is None:
        raise ValueError(f"{env_root} is not a virtual environment: no lib/python*/site-packages in it")
    return site


# The option of the modules that read a virtual environment (venv_audit, venv_abi_guard); the doc fragment
# plugins/doc_fragments/venv.py documents it.
VENV_OPTIONS = {"path": {"type": "path", "required": True}}


def module_venv(module):
    """(root, site-packages) of the environment a module's ``path`` names; the module fails when it is none."""
    root = module.params["path"]
    try:
        site = venv_site_packages(root)
    except ValueError as err:
        module.fail_json(msg=str(err))
    return root, site


def fingerprint(site_packages, project):
    """(version, digest) of an installed distribution, or None when it is not installed.

    The digest covers the RECORD rows of the package's own files (paths, hashes, sizes), not its
    .dist-info: so it tells two builds of one version apart (PyPI's torch 2.11.0 is a CUDA 13.0 build
    whose version carries no +cu130 label), and stays the same whichever installer or request put it there.
    """
    wanted = normalize_name(project)
    try:
        entries = sorted(os.listdir(site_packages))
    except FileNotFoundError:
        return None
    for entry in entries:
        if not entry.endswith(".dist-info") or normalize_name(entry[: -len(".dist-info")].rsplit("-", 1)[0]) != wanted:
            continue
        record = os.path.join(site_packages, entry, "RECORD")
        try:
            with open(record, encoding="utf-8", errors="replace") as handle:
                rows = parse_record(handle.read())
        except OSError:
            return None
        own = sorted(f"{p},{a}={d},{s}" for p, a, d, s in rows if ".dist-info/" not in p and a and d)
        digest = hashlib.sha256("\n".join(own).encode("utf-8")).hexdigest()
        return metadata_fields(os.path.join(site_packages, entry, "METADATA")).get("Version"), digest
    return None
