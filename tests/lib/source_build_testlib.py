"""Helpers of the source_build tests: a git work tree like an upstream checkout (fixture source)."""

import subprocess

import pytest


def git(cwd, *args, data=None):
    return subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def source(tmp_path):
    """A git work tree with two committed files, like an upstream checkout at a pinned commit."""
    repo = tmp_path / "src"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.org")
    git(repo, "config", "user.name", "t")
    (repo / "sgl-kernel").mkdir()
    (repo / "sgl-kernel" / "CMakeLists.txt").write_text(
        'if ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "12.4")\n'
        "    set(SGL_KERNEL_ENABLE_FA3 ON)\n"
        "    list(APPEND SGL_KERNEL_CUDA_FLAGS\n"
        '        "-gencode=arch=compute_90a,code=sm_90a"\n'
        "    )\n"
        "endif()\n"
    )
    (repo / "sgl-kernel" / "flash_attn.py").write_text(
        "import torch\n\ntry:\n    from sgl_kernel import flash_ops\nexcept:\n    raise ImportError(\n"
        '        "Can not import FA3 in sgl_kernel. Please check your installation."\n    )\n\n\n'
        "def is_fa3_supported(device=None) -> bool:\n    return False\n"
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "upstream")
    return repo
