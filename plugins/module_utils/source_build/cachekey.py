"""The key of the wheel cache: every input that changes the binary a source build produces, and nothing else.

A re-run with the same inputs must find its wheel and start no compiler; a changed input (a nightly
torch bump, a patch, another CUDA toolkit, another arch list) must miss. What goes in:

* the source: resolved commit (never the ref name, which can move) and sub-directory;
* the patch set: each patch's name and the SHA-256 of its text, in order;
* the build environment as written in the data (placeholders unexpanded), minus the variables that
  only set parallelism (MAX_JOBS, NVCC_THREADS, ...): they change the build's speed, not its output;
* the build arguments and the build requirements as resolved (cmake 3.31.6, not ``cmake>=3.31``);
* the versions of the packages the binary links against, torch with its CUDA build (``+cu130``) above all;
* the CUDA toolkit version, the Python tag and the machine;
* the host compilers' versions (``CC``, ``CXX``, and ``CUDAHOSTCXX``/``NVCC_CCBIN`` when the build sets them;
  gcc and g++ otherwise), as each one's ``--version`` names itself;
* the versions of a declared list of system packages a build detects (libnuma-dev, libibverbs-dev: the
  latter turns on mscclpp's InfiniBand transport), with "not installed" for those that are not;
* a free ``salt`` to force a rebuild by hand.
"""

from __future__ import annotations

import hashlib
import json

KEY_SCHEMA = 2
KEY_LENGTH = 20

# The compilers of a build: the variable a build system reads, and what it runs when the variable is unset.
DEFAULT_COMPILERS = {"CC": "gcc", "CXX": "g++"}
# Read only when set: the host compiler CMake and nvcc hand CUDA files to, when it is not CXX.
OPTIONAL_COMPILERS = ("CUDAHOSTCXX", "NVCC_CCBIN")
NOT_INSTALLED = "not installed"
# One line per installed instance (architecture) of a package.
DPKG_QUERY_FORMAT = "${Package}\t${Architecture}\t${db:Status-Abbrev}\t${Version}\n"
# dpkg's status letters (second of db:Status-Abbrev) under which a package's files are on disk.
_DPKG_FILES_PRESENT = frozenset("iUFWt")


def sha256_text(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def patch_digests(patches):
    """[{name, sha256}] for a patch set; the order stays, it changes the result."""
    return [{"name": p["name"], "sha256": sha256_text(normalise_patch(p["diff"]))} for p in patches]


def normalise_patch(text):
    """The patch as git applies it: ending in a newline, so ``|`` and ``|-`` YAML blocks give the same key.

    Only a missing newline is added: blank lines at the end may be context lines of the last hunk.
    """
    return text if text.endswith("\n") else text + "\n"


def key_inputs(
    *,
    name,
    commit,
    subdirectory="",
    patches=(),
    environment=None,
    parallelism_variables=(),
    build_args=(),
    build_requirements=None,
    linked_packages=None,
    cuda_version="",
    python_tag="",
    machine="",
    compilers=None,
    system_packages=None,
    salt="",
):
    """The dict that is hashed, also written next to the wheel so a key can be explained later."""
    skipped = set(parallelism_variables)
    env = {k: str(v) for k, v in (environment or {}).items() if k not in skipped}
    return {
        "schema": KEY_SCHEMA,
        "name": name,
        "commit": commit,
        "subdirectory": subdirectory or "",
        "patches": patch_digests(patches),
        "environment": env,
        "build_args": [str(a) for a in build_args],
        "build_requirements": dict(sorted((build_requirements or {}).items())),
        "linked_packages": dict(sorted((linked_packages or {}).items())),
        "cuda_version": cuda_version or "",
        "python_tag": python_tag or "",
        "machine": machine or "",
        "compilers": dict(sorted((compilers or {}).items())),
        "system_packages": dict(sorted((system_packages or {}).items())),
        "salt": salt or "",
    }


def cache_key(inputs):
    """A short, stable hex digest of key_inputs(): dict order and formatting do not matter."""
    return hashlib.sha256(canonical_json(inputs).encode("ascii")).hexdigest()[:KEY_LENGTH]


def compiler_commands(environment):
    """{variable: command} of the host compilers a build runs, as its environment names them."""
    env = environment or {}
    commands = {var: str(env.get(var) or default) for var, default in DEFAULT_COMPILERS.items()}
    commands.update({var: str(env[var]) for var in OPTIONAL_COMPILERS if env.get(var)})
    return dict(sorted(commands.items()))


def compiler_version(stdout, stderr=""):
    """The line a compiler names itself with (``gcc (Debian 12.2.0-14+deb12u1) 12.2.0``), or ""."""
    for text in (stdout, stderr):
        for line in (text or "").splitlines():
            if line.strip():
                return line.strip()
    return ""


def key_package_names(names):
    """The declared packages, each once, sorted: the list's order and repeats do not change the key."""
    return sorted({str(n).strip() for n in names or () if str(n).strip()})


def dpkg_versions(names, query_output):
    """{package: version} from ``dpkg-query -W -f DPKG_QUERY_FORMAT`` output, for each declared name.

    A package with its files on disk is ``<version> <arch>`` (several architectures joined by ``, ``);
    one that is unknown, removed or only configured is ``not installed``.
    """
    found = {}
    for line in (query_output or "").splitlines():
        parts = line.split("\t")
        if len(parts) != 4:
            continue
        package, arch, status, version = parts
        if len(status) >= 2 and status[1] in _DPKG_FILES_PRESENT:
            found.setdefault(package, set()).add(f"{version} {arch}")
    return {
        name: ", ".join(sorted(found[name])) if name in found else NOT_INSTALLED for name in key_package_names(names)
    }
