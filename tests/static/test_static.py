"""Static checks of the whole repository: each must report nothing."""

import ast
import subprocess
from pathlib import Path

import pytest
import yaml

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


@pytest.mark.parametrize("module", sorted(p.name for p in (ROOT / "plugins" / "modules").glob("*.py")))
def test_module_documentation_is_yaml(module):
    # ansible-doc and ansible-lint read these blocks as YAML; a stray "key: value" inside prose breaks them.
    tree = ast.parse((ROOT / "plugins" / "modules" / module).read_text())
    blocks = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN")
    }
    assert "DOCUMENTATION" in blocks, f"{module} has no DOCUMENTATION"
    for name, text in blocks.items():
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as err:
            pytest.fail(f"{module} {name} is not valid YAML: {err}")
    assert yaml.safe_load(blocks["DOCUMENTATION"])["module"] == module[:-3]
