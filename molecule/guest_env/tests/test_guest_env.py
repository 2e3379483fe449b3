"""The guest environment as the roles leave it: uv, the environments, the driver userspace, the CUDA
toolkits and the source-built wheel, checked inside the containers."""

import json
import shlex

SERVE = "/opt/venvs/serve"
PY = f"{SERVE}/bin/python"
VERSIONS = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"


def versions(host, *names):
    return json.loads(host.check_output(shlex.join([PY, "-c", VERSIONS, *names])))


def test_uv_is_the_pinned_version(host):
    assert host.check_output("uv --version").split()[1] == "0.13.9"
    assert host.file("/usr/local/bin/uv").linked_to == "/opt/inferhost/uv/bin/uv"


def test_the_environment_has_exactly_the_pinned_versions(host):
    assert versions(host, "pluggy", "iniconfig", "packaging", "pytest", "requests") == {
        "pluggy": "1.5.0",
        "iniconfig": "2.0.0",
        "packaging": "24.2",
        "pytest": "8.3.4",
        "requests": "2.32.3",
    }


def test_no_deps_step_installed_no_dependencies(host):
    # requests depends on idna, urllib3, certifi and charset-normalizer: --no-deps left them out.
    probe = host.run(shlex.join([PY, "-c", "import importlib.metadata as m; m.version('idna')"]))
    assert probe.rc != 0 and "PackageNotFoundError" in probe.stderr


def test_the_spec_is_recorded_in_the_environment(host):
    spec = json.loads(host.file(f"{SERVE}/.inferhost/environment.json").content_string)
    assert spec["name"] == "serve" and [s["name"] for s in spec["steps"]][0] == "pinned base"
    assert host.file(f"{SERVE}/.inferhost/constraints.txt").content_string == "packaging<25\n"
    assert host.file(f"{SERVE}/.inferhost/overrides.txt").content_string == ""


def test_the_environment_uses_the_system_python(host):
    cfg = host.file(f"{SERVE}/pyvenv.cfg").content_string
    assert "home = /usr/bin" in cfg
    assert host.check_output(f"{PY} -c 'import sys; print(sys.base_prefix)'") == "/usr"
