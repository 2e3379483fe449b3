"""Unit test folders mirror the code tree, so the test of a file is found by its path (docs/layout.md).

tests/unit/<folder>/test_<name>.py tests <name> (a file, its suffix dropped and dashes read as underscores, or
a folder) in the code folder that <folder> mirrors; deeper test folders mirror deeper code folders. Inside a
role, the file may sit in any of the role's own folders (files/, tasks/, templates/, ...).
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "tests" / "unit"
pytestmark = pytest.mark.static

# First folder under tests/unit -> the code folder it mirrors ("" is tests/unit itself: files at the root).
MIRRORS = {
    "": ROOT,
    "action": ROOT / "plugins" / "action",
    "filter": ROOT / "plugins" / "filter",
    "module_utils": ROOT / "plugins" / "module_utils",
    "modules": ROOT / "plugins" / "modules",
    "inferhost": ROOT / "src" / "inferhost",
    "sim": ROOT / "src" / "inferhost" / "sim",
    "playbooks": ROOT / "playbooks",
    "roles": ROOT / "roles",
    "scripts": ROOT / "scripts",
    # Every package of plugins/module_utils (gpu_switch, inference, python_env, source_build) under its own name.
    **{p.parent.name: p.parent for p in (ROOT / "plugins" / "module_utils").glob("*/__init__.py")},
    # And every package of plugins/plugin_utils, the controller's code (preflight).
    **{p.parent.name: p.parent for p in (ROOT / "plugins" / "plugin_utils").glob("*/__init__.py")},
}

# Test files of a topic that spans several code files, each with the reason it is kept whole.
SPANNING = {
    "preflight/test_mutations.py": "every option of every role's argument spec, mutated and run through the whole "
    "preflight (the inventory's reader, the checks, the roles' rules)",
    "action/test_config_files_packages.py": "config_files' packages: the action (plugins/action/config_files.py) "
    "reads them and the module (plugins/modules/config_files.py) writes and prunes them, run together as a task",
    "gpu_switch/test_pve_entries.py": "the API client's task waiting and retries (pve.py) and the hostpciN and "
    "devN grammar (entries.py) that gpu-switch sends through it",
    "gpu_switch/test_recover.py": "the crash matrix: a move (execute.py, rebind.py, journal.py) dies after each "
    "step in turn, then recover (recovery.py, through cli.py) must leave every function on one driver",
    "gpu_switch/test_role_schema.py": "the gpu_switch role and config.py's schema held to each other",
    "gpu_switch/test_sysfs.py": "sysfs read and written: pci.py, rebind.py and writer.py against the simulated kernel",
    "inference/test_multinode.py": "a service across several nodes: each rank's command line (command.py), the "
    "plan's refusals (plan.py) and the module inference_service_plan rendering only what a node runs",
    "modules/test_inference_modules.py": "inference_service_plan and inference_checkpoint_edit, the modules around "
    "the pure checks, on the same reference services",
    "modules/test_pve_host_modules.py": "pve_kernel_cmdline and pve_host_probe on the same fake host trees",
    "modules/test_source_build_modules.py": "source_build_plan and source_build_wait on one checkout and build job",
    "playbooks/test_inference_playbooks.py": "validate.yml's checks (NCCL, NCCL init, smoke) against one stand-in "
    "server",
    "roles/test_argument_specs.py": "every role's meta/argument_specs.yml against its defaults/main.yml",
}


def unit_tests():
    return sorted(p.relative_to(UNIT).as_posix() for p in UNIT.rglob("test_*.py"))


def key(path: Path) -> str:
    name = path.name if path.is_dir() else path.name.split(".", 1)[0]
    return name.replace("-", "_")


def code_under_test(test: str) -> list[Path]:
    """The code files (or folders) that the unit test at `test` (relative to tests/unit) tests by the rule."""
    *folders, filename = test.split("/")
    if not filename.startswith("test_") or (folders[:1] or [""])[0] not in MIRRORS:
        return []
    code = MIRRORS[folders[0]].joinpath(*folders[1:]) if folders else ROOT
    if not code.is_dir():
        return []
    name = filename.removeprefix("test_").removesuffix(".py")
    entries = list(code.iterdir())
    if folders[:1] == ["roles"] and len(folders) > 1:
        entries += [p for d in code.iterdir() if d.is_dir() for p in d.iterdir()]
    return sorted(p for p in entries if key(p) == name and p.name != "__pycache__")


@pytest.mark.parametrize("test", unit_tests())
def test_each_unit_test_is_found_by_the_path_of_the_code_it_tests(test):
    found = code_under_test(test)
    if test in SPANNING:
        assert not found, (
            f"tests/unit/{test} tests {', '.join(str(p.relative_to(ROOT)) for p in found)} by the rule: "
            "remove it from SPANNING"
        )
        return
    folder = test.rsplit("/", 1)[0] if "/" in test else ""
    where = MIRRORS.get(folder.split("/")[0])
    assert found, (
        f"tests/unit/{test} names no code: tests/unit/<folder>/test_<name>.py tests <name> in the folder that "
        f"<folder> mirrors ({where.relative_to(ROOT) if where else 'no code folder: ' + ', '.join(sorted(MIRRORS))}"
        "); move or rename it (docs/layout.md, 'Where a test lives'), or list it in SPANNING with its reason"
    )


def test_each_spanning_test_exists_and_says_why():
    tests = set(unit_tests())
    stale = sorted(t for t in SPANNING if t not in tests)
    assert not stale, f"SPANNING names tests that are gone: {stale}"
    assert all(reason.strip() for reason in SPANNING.values())


def test_test_modules_have_distinct_names():
    # pytest imports a test file outside a package under its bare file name: two of one name cannot both run.
    seen: dict[str, str] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        parts = [path.stem]
        parent = path.parent
        while (parent / "__init__.py").exists():
            parts.insert(0, parent.name)
            parent = parent.parent
        name = ".".join(parts)
        if name in seen:
            clashes.append(f"{seen[name]} and {path.relative_to(ROOT)}")
        seen[name] = str(path.relative_to(ROOT))
    assert not clashes, f"test modules of one name: {clashes}"
