"""inferhost.envresolve: python_env's steps as uv resolutions, offline against local indexes of generated wheels."""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

import jinja2
import pytest
import yaml

from inferhost import envresolve

UV = envresolve.BOOTSTRAP_UV
ROLE_VARS = envresolve.ROOT / "roles" / "python_env" / "vars" / "main.yml"


def wheel(folder: Path, name: str, version: str, requires=()) -> Path:
    stem = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{stem}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{stem}.dist-info/METADATA", metadata)
        archive.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{stem}.dist-info/RECORD", "")
    return path


def simple_index(root: Path, wheels: dict[str, list[tuple]]) -> str:
    """A PEP 503 index on disk: {name: [(version, requires), ...]} -> its file:// URL."""
    files = root / "files"
    files.mkdir(parents=True)
    for name, versions in wheels.items():
        page = root / "simple" / name
        page.mkdir(parents=True)
        links = [wheel(files, name, version, requires).name for version, requires in versions]
        page.joinpath("index.html").write_text(
            "<html><body>" + "".join(f'<a href="../../files/{f}">{f}</a>' for f in links) + "</body></html>"
        )
    return (root / "simple").as_uri()


@pytest.fixture
def env(tmp_path):
    """Offline, with a cache of the test's own: the local indexes are the only source."""
    return {**envresolve.process_environment({}), "UV_OFFLINE": "1", "UV_CACHE_DIR": str(tmp_path / "uv-cache")}


@pytest.fixture
def indexes(tmp_path):
    """A nightly-like index that holds the +cu9 build only, and a main index with the engine and a release."""
    nightly = simple_index(tmp_path / "nightly", {"torchlike": [("2.0.dev5+cu9", [])]})
    main = simple_index(
        tmp_path / "main",
        {
            "torchlike": [("1.0", [])],
            "enginelike": [("1.0", ["torchlike==1.0", "helper>=1"])],
            "helper": [("1.0", []), ("1.1", [])],
        },
    )
    return nightly, main


def step(name, index, *packages, **keys):
    """One step of python_env_environments: packages from the index at that URL (keys: no_deps, ...)."""
    return {"name": name, "packages": list(packages), "index_url": index, **keys}


def resolve(env, tmp_path, *steps, **keys):
    """The verdict on an environment "engine" of Python 3.12 with these steps (keys: overrides, constraints, ...)."""
    environment = {"name": "engine", "python": "3.12", "steps": list(steps), **keys}
    return envresolve.resolve_environment(environment, uv=str(UV), env=env, workdir=tmp_path)


def role_install_argv(environment, step, records: Path) -> list[str]:
    """The role's own uv pip install command for one step (roles/python_env/vars/main.yml), rendered here."""
    template = yaml.safe_load(ROLE_VARS.read_text())["__python_env_step_argv"]
    jinja = jinja2.Environment(undefined=jinja2.StrictUndefined)
    jinja.filters["regex_replace"] = lambda value, pattern, replacement: re.sub(pattern, replacement, value)
    rendered = jinja.from_string(template).render(
        python_env_uv_bin="uv",
        python_env_environment=environment,
        python_env_step=step,
        __python_env_records=str(records),
        ansible_check_mode=False,
    )
    return yaml.safe_load(rendered)


FULL_STEP = {
    "name": "everything a step can say",
    "packages": ["torchlike==2.0.dev5+cu9", "helper[extra]>=1"],
    "index_url": "https://nightly.example/simple",
    "extra_index_urls": ["https://one.example/simple", "https://two.example/simple"],
    "index_strategy": "unsafe-best-match",
    "prerelease": "allow",
    "no_deps": True,
}
FULL_ENVIRONMENT = {
    "name": "full",
    "path": "/opt/venvs/full",
    "python": "3.12",
    "steps": [FULL_STEP, {"name": "plain", "packages": ["enginelike"]}],
    "constraints": ["helper<2"],
    "overrides": ["torchlike==2.0.dev5+cu9"],
    "excludes": ["kernel-from-source"],
}


@pytest.mark.parametrize("step", FULL_ENVIRONMENT["steps"], ids=lambda s: s["name"])
def test_each_step_resolves_with_the_options_of_the_roles_install(tmp_path, step):
    files = envresolve.environment_files(FULL_ENVIRONMENT, tmp_path)
    output = tmp_path / "o"
    platform = "x86_64-manylinux_2_39"
    argv = envresolve.step_argv(
        "uv", FULL_ENVIRONMENT, step, files=files, python="3.12", platform=platform, output=output
    )
    install = role_install_argv(FULL_ENVIRONMENT, step, tmp_path)
    assert install[:5] == ["uv", "pip", "install", "--python", "/opt/venvs/full/bin/python"]
    assert install[len(install) - len(step["packages"]) :] == step["packages"]
    role_options = install[5 : len(install) - len(step["packages"])]
    head = ["uv", "pip", "compile", "--no-config", "--python", sys.executable]
    head += ["--python-version", "3.12", "--python-platform", platform]
    assert argv[: len(head)] == head
    assert argv[len(head) : len(head) + len(role_options)] == role_options
    tail = ["--no-header", "--annotation-style", "line", "--output-file", str(output), "-"]
    assert argv[len(head) + len(role_options) :] == tail


def test_the_environment_files_hold_one_line_per_entry_as_the_role_writes_them(tmp_path):
    files = envresolve.environment_files(FULL_ENVIRONMENT, tmp_path)
    assert {k: p.read_text() for k, p in files.items()} == {
        "constraints": "helper<2\n",
        "overrides": "torchlike==2.0.dev5+cu9\n",
        "excludes": "kernel-from-source\n",
    }
    assert envresolve.environment_files({"name": "bare", "steps": []}, tmp_path / "x") == {}


def test_a_pin_the_index_no_longer_holds_fails_naming_environment_step_and_pin(tmp_path, env, indexes):
    _nightly, main = indexes
    verdict = resolve(env, tmp_path, step("Torch nightly", main, "torchlike==2.0.dev5+cu9"))
    assert not verdict.ok
    assert verdict.failure.step == "Torch nightly"
    assert verdict.failure.failed_requirement == "torchlike==2.0.dev5+cu9"
    summary = verdict.summary()
    assert summary.startswith("engine: NOT RESOLVED at step 'Torch nightly': torchlike==2.0.dev5+cu9 cannot be")
    assert "torchlike" in verdict.failure.error


def test_a_later_step_keeps_what_an_earlier_step_installed_from_another_index(tmp_path, env, indexes):
    nightly, main = indexes
    torch = step("Torch nightly", nightly, "torchlike==2.0.dev5+cu9")
    engine = step("Engine", main, "enginelike==1.0")
    verdict = resolve(env, tmp_path, torch, engine, overrides=["torchlike==2.0.dev5+cu9"])
    assert verdict.ok, verdict.summary()
    assert verdict.resolved == {"enginelike": "1.0", "helper": "1.1", "torchlike": "2.0.dev5+cu9"}
    assert verdict.steps[1].resolved["torchlike"] == "2.0.dev5+cu9"
    assert "enginelike 1.0" in verdict.summary(["torchlike", "enginelike"])


def test_without_the_earlier_step_the_override_alone_cannot_be_found(tmp_path, env, indexes):
    # The same second step on its own: the main index lacks the +cu9 build, so only the earlier step's result
    # (as the role's environment has it installed) lets it resolve.
    _nightly, main = indexes
    verdict = resolve(env, tmp_path, step("Engine", main, "enginelike==1.0"), overrides=["torchlike==2.0.dev5+cu9"])
    assert not verdict.ok
    assert verdict.failure.failed_requirement == "torchlike==2.0.dev5+cu9"


def test_conflicting_pins_fail_naming_a_pin_of_the_conflict(tmp_path, env, indexes):
    _nightly, main = indexes
    verdict = resolve(env, tmp_path, step("Engine", main, "enginelike==1.0"), constraints=["helper<1"])
    assert not verdict.ok
    assert verdict.failure.failed_requirement in {"enginelike==1.0", "helper<1"}


def test_a_no_deps_step_resolves_its_packages_only(tmp_path, env, indexes):
    _nightly, main = indexes
    verdict = resolve(env, tmp_path, step("Engine alone", main, "enginelike==1.0", no_deps=True))
    assert verdict.ok, verdict.summary()
    assert verdict.resolved == {"enginelike": "1.0"}


def test_excluded_packages_are_left_out(tmp_path, env, indexes):
    _nightly, main = indexes
    verdict = resolve(env, tmp_path, step("Engine", main, "enginelike==1.0"), excludes=["helper"])
    assert verdict.ok, verdict.summary()
    assert set(verdict.resolved) == {"enginelike", "torchlike"}


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"name": "x y", "steps": [{"name": "s", "packages": ["a"]}]}, "name 'x y' is invalid"),
        ({"name": "e", "steps": []}, "python_env_environments[e].steps: [] given"),
        ({"name": "e", "steps": [{"name": "s", "packages": []}]}, "python_env_environments[e].steps[0].packages: []"),
        ({"name": "e", "steps": [{"name": "s", "packages": ["a"], "index": "u"}]}, "unknown keys ['index']"),
        (
            {"name": "e", "steps": [{"name": "s", "packages": ["{{ pin }}"]}]},
            "python_env_environments[e] holds a Jinja template",
        ),
    ],
)
def test_bad_environments_are_refused_naming_what_is_wrong(environment, message):
    with pytest.raises(envresolve.EnvResolveError, match=re.escape(message)):
        envresolve.check_environment(environment)


def test_an_interpreter_path_needs_its_version_given():
    environment = {"name": "e", "python": "/usr/bin/python3", "steps": [{"name": "s", "packages": ["a"]}]}
    with pytest.raises(envresolve.EnvResolveError, match=r"python_env_environments\[e\]\.python is '/usr/bin/python3'"):
        envresolve.python_version(environment)
    assert envresolve.python_version(environment, "3.11") == "3.11"


def test_the_guests_uv_settings_apply_and_the_controllers_index_does_not(monkeypatch):
    monkeypatch.setenv("UV_INDEX_URL", "https://controller.example/simple")
    env = envresolve.process_environment(
        {"UV_EXTRA_INDEX_URL": "https://mirror.example/simple", "UV_CACHE_DIR": "/var/cache/uv", "HTTPS_PROXY": "p"}
    )
    assert "UV_INDEX_URL" not in env
    assert env["UV_EXTRA_INDEX_URL"] == "https://mirror.example/simple"
    assert env.get("UV_CACHE_DIR") != "/var/cache/uv"
    assert env.get("HTTPS_PROXY") != "p"


def test_a_uv_of_another_version_is_refused_naming_the_pin(tmp_path, capsys):
    inventory = tmp_path / "site"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("all:\n  hosts:\n    guest1:\n")
    (inventory / "group_vars" / "all" / "python_env.yml").write_text(
        yaml.safe_dump(
            {
                "python_env_uv_version": "0.13.9",
                "python_env_environments": [
                    {"name": "e", "python": "3.12", "steps": [{"name": "s", "packages": ["a"]}]}
                ],
            }
        )
    )
    fake = tmp_path / "uv"
    fake.write_text("#!/bin/sh\necho 'uv 0.1.0'\n")
    fake.chmod(0o755)
    assert envresolve.main(["-i", str(inventory / "hosts.yml"), "--uv", str(fake)]) == 2
    err = capsys.readouterr().err
    assert "python_env_uv_version is '0.13.9' for guest1, but" in err
    assert "is uv 0.1.0" in err


def test_the_bootstrap_uv_is_the_roles_pin():
    # The resolver runs the uv that scripts/bootstrap.sh installs: the version the role installs on the guests.
    default = yaml.safe_load(envresolve.ROLE_DEFAULTS.read_text())["python_env_uv_version"]
    assert envresolve.uv_version(str(UV)) == default
