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
* a free ``salt`` to force a rebuild by hand.
"""

from __future__ import annotations

import hashlib
import json

KEY_SCHEMA = 1
KEY_LENGTH = 20


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
        "salt": salt or "",
    }


def cache_key(inputs):
    """A short, stable hex digest of key_inputs(): dict order and formatting do not matter."""
    return hashlib.sha256(canonical_json(inputs).encode("ascii")).hexdigest()[:KEY_LENGTH]
