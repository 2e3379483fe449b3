"""Resolve python_env's environments as the role installs them, on the controller, without installing anything.

The role installs an environment in steps, one ``uv pip install`` each (roles/python_env/vars/main.yml builds the
command): the step's packages, its ``--index-url``, ``--extra-index-url``, ``--index-strategy``, ``--prerelease``
and ``--no-deps``, and the environment's constraints, overrides and exclusions, written to files and applied to
every step. Here each step becomes one ``uv pip compile`` with the same arguments, for the guest's platform and
the environment's Python, so a pin that no index holds any more (a nightly removed upstream) or two pins that
cannot live together fail here, naming the environment, the step and the requirement, before a site's first
deployment does.

What an earlier step installed is in the environment when a later step resolves: uv takes an installed package
that satisfies a requirement, even one its own index lacks (a ``+cu130`` torch held by an override while the step
resolves from PyPI). A compile has no environment, so each earlier result stands in for it twice: as a stub wheel
per package (its name, version and the names it depends on) in a ``--find-links`` folder, so the version can be
chosen whatever the step's indexes hold, and as the existing output file, which uv reads as preferences, so the
installed versions are kept where they fit, as ``uv pip install`` keeps them.

python -m inferhost.envresolve -i inventory/<site>/hosts.yml     every environment of every host
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# The uv that scripts/bootstrap.sh installs at the project's pin; `uv` from the PATH otherwise.
BOOTSTRAP_UV = ROOT / ".cache" / "tools" / "bin" / "uv"
ROLE_DEFAULTS = ROOT / "roles" / "python_env" / "defaults" / "main.yml"
# The guests run Ubuntu 24.04 (glibc 2.39) on x86_64: wheels up to manylinux_2_39 install there.
DEFAULT_PLATFORM = "x86_64-manylinux_2_39"
# The files the role writes to <env>/.inferhost/ and names in every step's command.
ENVIRONMENT_FILES = {"constraints": "constraints.txt", "overrides": "overrides.txt", "excludes": "excludes.txt"}
STEP_KEYS = {"name", "packages", "no_deps", "index_url", "extra_index_urls", "index_strategy", "prerelease"}
# python_env_process_environment's variables that are paths or settings of the guest, not of the resolution.
GUEST_ONLY_UV_VARIABLES = {"UV_CACHE_DIR", "UV_LINK_MODE", "UV_PYTHON_INSTALL_DIR", "UV_TOOL_DIR", "UV_TOOL_BIN_DIR"}
# The controller's own index settings must not leak into a resolution of the guest's (uv reads them from the
# environment); the inventory's process environment sets them when the guest has them.
CONTROLLER_INDEX_VARIABLES = {
    "UV_INDEX",
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
    "UV_INDEX_STRATEGY",
    "UV_PRERELEASE",
    "UV_CONSTRAINT",
    "UV_OVERRIDE",
    "UV_EXCLUDE",
    "UV_NO_INDEX",
}
_PIN_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s#;]+)\s*(?:#\s*via\s+(.*))?$")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class EnvResolveError(Exception):
    """Input that cannot be resolved as given (the message names the variable, the value and what is expected)."""


def normalize(name: str) -> str:
    """PEP 503's normal form of a distribution name: the form uv prints."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement)
    return normalize(match.group(1)) if match else ""


@dataclass
class StepResult:
    environment: str
    step: str
    argv: list[str]
    ok: bool
    resolved: dict[str, str] = field(default_factory=dict)
    error: str = ""
    # The requirement of the step, the overrides or the constraints that uv's explanation names first.
    failed_requirement: str = ""


@dataclass
class Verdict:
    environment: str
    steps: list[StepResult]
    # Every package the environment ends with, later steps' versions over earlier ones', as uv pip install leaves
    # them; only meaningful when ok.
    resolved: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(step.ok for step in self.steps)

    @property
    def failure(self) -> StepResult | None:
        return next((step for step in self.steps if not step.ok), None)

    def summary(self, names: list[str] | None = None) -> str:
        failed = self.failure
        if failed is not None:
            what = (
                f"{failed.failed_requirement} cannot be resolved" if failed.failed_requirement else "does not resolve"
            )
            reason = failed.error.strip().splitlines()
            return f"{self.environment}: NOT RESOLVED at step '{failed.step}': {what}" + (
                "\n  " + "\n  ".join(reason) if reason else ""
            )
        shown = [normalize(n) for n in names] if names else sorted(self.resolved)
        versions = ", ".join(f"{n} {self.resolved[n]}" for n in shown if n in self.resolved)
        return f"{self.environment}: resolved ({len(self.steps)} steps): {versions}"


def check_environment(environment, where: str = "python_env_environments") -> None:
    """Refuse data the role's argument spec and preflight would refuse, before any resolution."""
    if not isinstance(environment, dict):
        raise EnvResolveError(f"{where}: each entry must be a mapping, got {environment!r}.")
    name = environment.get("name")
    if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", name):
        raise EnvResolveError(f"{where}: name {name!r} is invalid; expected letters, digits and _.- only.")
    steps = environment.get("steps")
    if not isinstance(steps, list) or not steps:
        raise EnvResolveError(f"{where}[{name}].steps: {steps!r} given; expected a list of at least one step.")
    for index, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("name"), str):
            raise EnvResolveError(f"{where}[{name}].steps[{index}]: {step!r} given; expected a mapping with a name.")
        unknown = sorted(set(step) - STEP_KEYS)
        if unknown:
            raise EnvResolveError(
                f"{where}[{name}].steps[{index}] ({step['name']}): unknown keys {unknown};"
                f" expected some of {sorted(STEP_KEYS)}."
            )
        packages = step.get("packages")
        if not isinstance(packages, list) or not packages or not all(isinstance(p, str) for p in packages):
            raise EnvResolveError(
                f"{where}[{name}].steps[{index}].packages: {packages!r} given; expected a list of requirement strings."
            )
    text = json.dumps(environment)
    if "{{" in text or "{%" in text:
        raise EnvResolveError(
            f"{where}[{name}] holds a Jinja template ({text[text.find('{') :][:60]}...); the resolver reads the"
            " inventory as data and cannot render it: give the values literally."
        )


def python_version(environment, override: str | None = None) -> str:
    """The Python the environment is made with: its version request, or the one given for a path."""
    if override:
        return override
    requested = str(environment.get("python", ""))
    if re.match(r"^[0-9]+\.[0-9]+(\.[0-9]+)?$", requested):
        return requested
    raise EnvResolveError(
        f"python_env_environments[{environment.get('name')}].python is {requested!r}, not a version such as '3.12':"
        " give the interpreter's version with --python-version."
    )


def environment_files(environment, folder: Path) -> dict[str, Path]:
    """Write the constraints, overrides and exclusions as the role does (one line each); only those that are set."""
    written = {}
    for key, filename in ENVIRONMENT_FILES.items():
        lines = environment.get(key) or []
        if lines:
            path = folder / filename
            path.write_text("".join(f"{line}\n" for line in lines))
            written[key] = path
    return written


def step_argv(
    uv: str,
    environment,
    step,
    *,
    files: dict[str, Path],
    python: str,
    platform: str,
    output: Path,
    find_links: Path | None = None,
) -> list[str]:
    """The ``uv pip compile`` of one step: the role's ``uv pip install`` arguments, for the target, into output."""
    # --python names the interpreter that would build a source distribution (the controller's: uv's search for one
    # of the target's version costs seconds per call and may find none); the target is --python-version's.
    argv = [uv, "pip", "compile", "--no-config", "--python", sys.executable]
    argv += ["--python-version", python, "--python-platform", platform]
    if step.get("index_url"):
        argv += ["--index-url", step["index_url"]]
    argv += [f"--extra-index-url={url}" for url in step.get("extra_index_urls") or []]
    if step.get("index_strategy"):
        argv += ["--index-strategy", step["index_strategy"]]
    if step.get("prerelease"):
        argv += ["--prerelease", step["prerelease"]]
    if step.get("no_deps"):
        argv += ["--no-deps"]
    for key, option in (("constraints", "--constraints"), ("overrides", "--overrides"), ("excludes", "--excludes")):
        if key in files:
            argv += [option, str(files[key])]
    if find_links is not None:
        argv += ["--find-links", str(find_links)]
    argv += ["--no-header", "--annotation-style", "line", "--output-file", str(output), "-"]
    return argv


def parse_pins(text: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """A compile's output: {name: version} and {name: names of the packages that depend on it}."""
    pins, dependents = {}, {}
    for line in text.splitlines():
        match = _PIN_LINE.match(line.strip())
        if not match:
            continue
        name = normalize(match.group(1))
        pins[name] = match.group(2)
        via = match.group(3) or ""
        dependents[name] = {normalize(v.strip()) for v in via.split(",") if v.strip() and not v.strip().startswith("-")}
    return pins, dependents


def write_stubs(folder: Path, pins: dict[str, str], dependents: dict[str, set[str]]) -> None:
    """One wheel per installed package, metadata only: its name, version and what it depends on, by name."""
    requires: dict[str, set[str]] = {name: set() for name in pins}
    for name, parents in dependents.items():
        for parent in parents:
            if parent in requires and name in pins:
                requires[parent].add(name)
    for name, version in pins.items():
        stem = f"{name.replace('-', '_')}-{version}"
        path = folder / f"{stem}-py3-none-any.whl"
        metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
            f"Requires-Dist: {dep}\n" for dep in sorted(requires[name])
        )
        wheel = "Wheel-Version: 1.0\nGenerator: inferhost.envresolve\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{stem}.dist-info/METADATA", metadata)
            archive.writestr(f"{stem}.dist-info/WHEEL", wheel)
            archive.writestr(f"{stem}.dist-info/RECORD", "")


def explanation(stderr: str) -> str:
    """uv's error and its causes, without the warnings before them."""
    lines = stderr.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("error:")), 0)
    return "\n".join(lines[start:])


def failed_requirement(error: str, candidates: list[str]) -> str:
    """The requirement (of the step, the overrides, the constraints) that uv's explanation names first."""
    text = error.lower()
    best, where = "", len(text) + 1
    for requirement in candidates:
        name = requirement_name(requirement)
        if not name:
            continue
        forms = {name, name.replace("-", "_")}
        found = [
            m.start() for form in forms for m in re.finditer(rf"(?<![a-z0-9_.-]){re.escape(form)}(?![a-z0-9_-])", text)
        ]
        if found and min(found) < where:
            best, where = requirement.strip(), min(found)
    return best


def resolve_environment(
    environment,
    *,
    uv: str,
    platform: str = DEFAULT_PLATFORM,
    python: str | None = None,
    env: dict[str, str] | None = None,
    workdir: Path | None = None,
) -> Verdict:
    """Every step of one environment, in order; stops at the first step that does not resolve."""
    check_environment(environment)
    version = python_version(environment, python)
    name = environment["name"]
    with tempfile.TemporaryDirectory(prefix=f"envresolve-{name}-", dir=workdir) as scratch:
        folder = Path(scratch)
        files = environment_files(environment, folder)
        installed: dict[str, str] = {}
        dependents: dict[str, set[str]] = {}
        results = []
        for index, step in enumerate(environment["steps"]):
            output = folder / f"step-{index}.txt"
            stubs = None
            if installed:
                stubs = folder / f"installed-before-{index}"
                stubs.mkdir()
                write_stubs(stubs, installed, dependents)
                output.write_text("".join(f"{n}=={v}\n" for n, v in sorted(installed.items())))
            argv = step_argv(
                uv, environment, step, files=files, python=version, platform=platform, output=output, find_links=stubs
            )
            proc = subprocess.run(
                argv,
                input="".join(f"{p}\n" for p in step["packages"]),
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            if proc.returncode != 0:
                candidates = step["packages"] + list(environment.get("overrides") or [])
                candidates += list(environment.get("constraints") or [])
                error = explanation(proc.stderr or proc.stdout)
                results.append(
                    StepResult(
                        name,
                        step["name"],
                        argv,
                        False,
                        error=error,
                        failed_requirement=failed_requirement(error, candidates),
                    )
                )
                return Verdict(name, results)
            pins, via = parse_pins(output.read_text())
            results.append(StepResult(name, step["name"], argv, True, resolved=pins))
            installed.update(pins)
            for package, parents in via.items():
                dependents.setdefault(package, set()).update(parents)
        return Verdict(name, results, resolved=dict(sorted(installed.items())))


def uv_version(uv: str) -> str:
    try:
        out = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise EnvResolveError(f"uv {uv!r} does not run ({exc}): give the path of a uv binary with --uv.") from exc
    return (out.split() + ["", ""])[1]


def process_environment(settings: dict | None) -> dict[str, str]:
    """The controller's environment with the guest's uv settings from python_env_process_environment."""
    env = {k: v for k, v in os.environ.items() if k not in CONTROLLER_INDEX_VARIABLES}
    for key, value in (settings or {}).items():
        if key.startswith("UV_") and key not in GUEST_ONLY_UV_VARIABLES:
            if "{{" in str(value):
                raise EnvResolveError(
                    f"python_env_process_environment.{key} is a template ({value!r}); give the value literally."
                )
            env[key] = str(value)
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    return env


@dataclass
class Target:
    """One distinct environment of an inventory and the hosts that have it."""

    hosts: list[str]
    environment: dict
    uv_version: str
    process_environment: dict


def inventory_targets(inventory: str, hosts: list[str] | None = None) -> list[Target]:
    """Every distinct python_env environment of the inventory's hosts, as ansible-inventory merges their vars."""
    # This environment's ansible-inventory (the locked Ansible), else the PATH's.
    command = Path(sys.executable).parent / "ansible-inventory"
    try:
        proc = subprocess.run(
            [str(command) if command.exists() else "ansible-inventory", "-i", inventory, "--list"],
            capture_output=True,
            text=True,
            check=False,
            # Only what the inventory says: no facts cached by an earlier run.
            env={**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory"},
        )
    except OSError as exc:
        raise EnvResolveError(f"ansible-inventory does not run ({exc}): use the project's environment.") from exc
    if proc.returncode != 0:
        raise EnvResolveError(f"ansible-inventory -i {inventory} failed: {proc.stderr.strip()}")
    hostvars = json.loads(proc.stdout).get("_meta", {}).get("hostvars", {})
    if hosts:
        unknown = sorted(set(hosts) - set(hostvars))
        if unknown:
            raise EnvResolveError(f"--host {unknown}: not in {inventory}; its hosts are {sorted(hostvars)}.")
    default_uv = str(yaml.safe_load(ROLE_DEFAULTS.read_text())["python_env_uv_version"])
    targets: dict[str, Target] = {}
    for host, variables in sorted(hostvars.items()):
        if hosts and host not in hosts:
            continue
        environments = variables.get("python_env_environments") or []
        if not isinstance(environments, list):
            raise EnvResolveError(f"{host}: python_env_environments is {environments!r}; expected a list.")
        for environment in environments:
            check_environment(environment, f"{host}: python_env_environments")
            uv = str(variables.get("python_env_uv_version", default_uv))
            settings = variables.get("python_env_process_environment") or {}
            key = json.dumps([environment, uv, settings], sort_keys=True)
            if key in targets:
                targets[key].hosts.append(host)
            else:
                targets[key] = Target([host], environment, uv, settings)
    if not targets:
        raise EnvResolveError(
            f"{inventory}: no host{' among ' + str(hosts) if hosts else ''} has python_env_environments."
        )
    return list(targets.values())


def pinned_names(environment) -> list[str]:
    """The packages a verdict shows: the guard's names, else every package a step pins with ==."""
    names = list(environment.get("guard") or [])
    for step in environment["steps"]:
        names += [requirement_name(p) for p in step["packages"] if "==" in p]
    return list(dict.fromkeys(normalize(n) for n in names))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferhost.envresolve",
        description="Resolve every python_env environment of an inventory with uv, step by step, installing nothing.",
    )
    parser.add_argument("-i", "--inventory", required=True, help="the site's inventory (inventory/<site>/hosts.yml)")
    parser.add_argument("--host", action="append", help="only this host's environments (repeatable)")
    parser.add_argument("--environment", action="append", help="only the environment of this name (repeatable)")
    parser.add_argument("--uv", help=f"the uv binary (default: {BOOTSTRAP_UV.relative_to(ROOT)}, else uv on the PATH)")
    parser.add_argument("--python-platform", default=DEFAULT_PLATFORM, help="uv's target platform (%(default)s)")
    parser.add_argument("--python-version", help="the Python version, for environments whose python is a path")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every step's command and resolution")
    args = parser.parse_args(argv)
    uv = args.uv or (str(BOOTSTRAP_UV) if BOOTSTRAP_UV.exists() else "uv")
    try:
        targets = inventory_targets(args.inventory, args.host)
        if args.environment:
            targets = [t for t in targets if t.environment["name"] in args.environment]
            if not targets:
                raise EnvResolveError(f"--environment {args.environment}: no such environment in {args.inventory}.")
        found = uv_version(uv)
        failed = 0
        for target in targets:
            if found != target.uv_version:
                raise EnvResolveError(
                    f"python_env_uv_version is {target.uv_version!r} for {', '.join(target.hosts)}, but {uv} is uv"
                    f" {found}: resolve with the uv the hosts run (--uv, or scripts/bootstrap.sh's)."
                )
            verdict = resolve_environment(
                target.environment,
                uv=uv,
                platform=args.python_platform,
                python=args.python_version,
                env=process_environment(target.process_environment),
            )
            print(f"[{', '.join(target.hosts)}] {verdict.summary(pinned_names(target.environment))}")
            if args.verbose:
                for step in verdict.steps:
                    print(f"  step '{step.step}': {' '.join(step.argv)}")
                    for name, version in step.resolved.items():
                        print(f"    {name}=={version}")
            failed += not verdict.ok
    except EnvResolveError as exc:
        print(f"envresolve: {exc}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
