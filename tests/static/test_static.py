"""Static checks of the whole repository: each must report nothing."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.static


def run(*argv):
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (
        f"{' '.join(argv)} (rc {proc.returncode}):\n{proc.stdout[-5000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout + proc.stderr


def test_ansible_lint_production_profile():
    out = run("ansible-lint", "--profile", "production", "--nocolor")
    assert "0 failure(s), 0 warning(s)" in out


def test_no_lint_exceptions_without_a_reason():
    ignore = ROOT / ".ansible-lint-ignore"
    if not ignore.exists():
        return
    lines = ignore.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip() and not line.startswith("#"):
            assert i > 0 and lines[i - 1].startswith("#"), f".ansible-lint-ignore line {i + 1} has no reason above it"


def test_yamllint():
    run("yamllint", "--strict", ".")


def test_ruff_check():
    run("ruff", "check", ".")


def test_ruff_format():
    run("ruff", "format", "--check", ".")


@pytest.mark.parametrize(
    "playbook", ["site.yml", *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("playbooks/*.yml"))]
)
def test_syntax_check(playbook):
    run("ansible-playbook", "--syntax-check", playbook)
