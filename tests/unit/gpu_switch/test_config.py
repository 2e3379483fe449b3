"""Configuration: the schema (config.py, docs/gpu-switch.md), strict validation, env overrides, exit 2 on errors, and
`gpu-switch check-config FILE`."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from gpu_switch import cli
from gpu_switch.config import (
    SCHEMA,
    Field,
    Section,
    _Reader,
    load_config,
    normalise_address,
    parse_config,
    read_secret,
)
from gpu_switch.errors import EXIT_USAGE, ConfigError

BASE = {
    "proxmox": {
        "host": "127.0.0.1",
        "port": 8006,
        "user": "root@pam",
        "password_file": "/etc/gpu-switch/password",
        "verify_ssl": True,
        "ca_file": None,
        "node": "pve1",
    },
    "container": {"vmid": 101},
    "vm": {"vmid": 201},
    "gpus": ["0000:01:00.0", "0000:02:00.0"],
    "drivers": {"host": "nvidia", "passthrough": "vfio-pci"},
    "roots": {"sysfs": "/sys", "proc": "/proc", "run": "/run"},
}


def with_(path, value):
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    keys = path.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    if value is KeyError:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return data


def test_the_documented_example_loads_with_its_values():
    cfg = parse_config(BASE, "c.yml", environ={})
    assert cfg.proxmox.node == "pve1" and cfg.proxmox.is_root_pam and cfg.proxmox.verify_ssl
    assert (cfg.container_vmid, cfg.vm_vmid) == (101, 201)
    assert cfg.gpus == ("0000:01:00.0", "0000:02:00.0")
    assert (cfg.host_driver, cfg.passthrough_driver) == ("nvidia", "vfio-pci")
    assert (cfg.roots.sysfs, cfg.roots.proc, cfg.roots.run) == ("/sys", "/proc", "/run")
    # The journal must survive a reboot, so with the default /run it does not live there.
    assert cfg.journal_path == "/var/lib/gpu-switch/journal.json"
    assert cfg.lock_path == "/run/gpu-switch/lock"


def test_environment_roots_win_over_the_file_and_the_journal_follows_a_moved_run_root():
    env = {"GPU_SWITCH_SYSFS_ROOT": "/tmp/s", "GPU_SWITCH_PROC_ROOT": "/tmp/p", "GPU_SWITCH_RUN_ROOT": "/tmp/r"}
    cfg = parse_config(BASE, "c.yml", environ=env)
    assert (cfg.roots.sysfs, cfg.roots.proc, cfg.roots.run) == ("/tmp/s", "/tmp/p", "/tmp/r")
    assert cfg.journal_path == "/tmp/r/gpu-switch/journal.json"


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("0000:01:00.0", "0000:01:00.0"),
        ("01:00.0", "0000:01:00.0"),
        (" 0000:C1:00.1\n", "0000:c1:00.1"),
        ("0000:01:20.0", None),  # slot beyond 1f
        ("0000:01:00.8", None),  # function beyond 7
        ("1:00.0", None),
        ("gpu0", None),
    ],
)
def test_an_address_is_spelt_one_way_or_refused(text, canonical):
    assert normalise_address(text) == canonical


def test_short_addresses_are_normalised_and_gpu_match_is_accepted():
    assert parse_config(with_("gpus", ["01:00.0"]), environ={}).gpus == ("0000:01:00.0",)
    data = with_("gpus", KeyError)
    data["gpu_match"] = {"vendor": "0x10DE", "class": "0x0300"}
    assert parse_config(data, environ={}).gpu_match == {"vendor": "0x10de", "class": ["0x0300"]}


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("proxmox.node", KeyError, "proxmox.node: is required"),
        ("proxmox.colour", "red", "proxmox: unknown key 'colour'"),
        ("proxmox.port", "8006", "proxmox.port: must be an integer"),
        ("proxmox.verify_ssl", "yes", "proxmox.verify_ssl: must be true or false"),
        ("proxmox.user", "root@pam!tok", "is not a user@realm"),
        ("proxmox.password_file", "password", "is not an absolute path"),
        ("container.vmid", 42, "container.vmid: 42 is not a vmid"),
        ("vm.vmid", 101, "same vmid 101"),
        ("gpus", ["0000:01:00"], "gpus[0]: '0000:01:00' is not a PCI address"),
        ("gpus", ["0000:01:00.0", "01:00.0"], "gpus[1]: 0000:01:00.0 is listed twice"),
        ("gpus", [], "must be a non-empty list"),
        ("drivers.passthrough", "nvidia", "host and passthrough drivers must differ"),
        ("drivers.host", "nv idia", "is not a driver name"),
        ("roots.sysfs", "sys", "roots.sysfs: 'sys' is not an absolute path"),
        ("vm.hostpci_options", "pcie=1,x-vga=maybe", "vm.hostpci_options"),
        ("timeouts.shutdown", -1, "timeouts.shutdown: must be a positive number"),
        ("persistenced_unit", "nvidia persistenced", "is not a systemd service name"),
        ("proxmox.ca_file", "/etc/ca.pem", "ca_file is set but verify_ssl is false"),
        ("colour", 1, "unknown key 'colour'"),
    ],
)
def test_each_bad_value_is_named_in_one_line(path, value, message):
    data = with_(path, value)
    if path == "proxmox.ca_file":
        data["proxmox"]["verify_ssl"] = False
    with pytest.raises(ConfigError) as err:
        parse_config(data, "c.yml", environ={})
    assert message in err.value.reason
    assert "\n" not in err.value.reason
    assert err.value.exit_code == EXIT_USAGE


def test_gpus_and_gpu_match_together_or_neither_are_refused():
    data = with_("gpu_match", {"vendor": "0x10de"})
    with pytest.raises(ConfigError, match="either gpus or gpu_match"):
        parse_config(data, environ={})
    with pytest.raises(ConfigError, match="name the GPUs"):
        parse_config(with_("gpus", KeyError), environ={})


def test_relative_environment_root_is_refused():
    with pytest.raises(ConfigError, match="GPU_SWITCH_RUN_ROOT"):
        parse_config(BASE, environ={"GPU_SWITCH_RUN_ROOT": "run"})


def test_yaml_errors_and_missing_files(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("proxmox: {node: [\n")
    with pytest.raises(ConfigError, match=r"not valid YAML \(line"):
        load_config(str(bad), environ={})
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "missing.yml"), environ={})


def test_secret_is_one_line_and_never_in_the_message(tmp_path):
    cfg = parse_config(with_("proxmox.password_file", str(tmp_path / "pw")), environ={})
    with pytest.raises(ConfigError, match="no such file"):
        read_secret(cfg.proxmox)
    (tmp_path / "pw").write_text("hunter2\nsecond line\n")
    with pytest.raises(ConfigError) as err:
        read_secret(cfg.proxmox)
    assert "hunter2" not in err.value.reason
    (tmp_path / "pw").write_text("hunter2\n")
    assert read_secret(cfg.proxmox) == "hunter2"


@pytest.mark.parametrize(
    "argv",
    [["--config", "/nonexistent/config.yml", "status"], ["--config", "/nonexistent/config.yml", "--json", "to-vm"]],
)
def test_cli_exits_2_with_a_final_reason_line(argv):
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(argv, stdout=out, stderr=err) == EXIT_USAGE
    lines = err.getvalue().splitlines()
    assert lines[-1] == "gpu-switch: config /nonexistent/config.yml: no such file"


def test_cli_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["to-somewhere"])
    assert exc.value.code == EXIT_USAGE
    assert "invalid choice" in capsys.readouterr().err.splitlines()[-1]
    with pytest.raises(SystemExit) as exc:
        cli.main(["to-vm", "--timeout", "soon"])
    assert exc.value.code == EXIT_USAGE


def test_a_file_that_spells_out_every_default_reads_as_one_that_gives_none():
    def defaults(section):
        out = {}
        for key, entry in section.fields.items():
            if isinstance(entry, Section):
                if not entry.optional:
                    out[key] = defaults(entry)
            elif entry.default is not None:
                out[key] = list(entry.default) if isinstance(entry.default, tuple) else entry.default
        return out

    minimal = {"proxmox": {"node": "pve1"}, "container": {"vmid": 101}, "vm": {"vmid": 201}, "gpus": ["01:00.0"]}
    full = defaults(SCHEMA)
    for key, value in minimal.items():
        full[key] = {**full[key], **value} if isinstance(value, dict) else value
    assert parse_config(full, environ={}) == parse_config(minimal, environ={})


def test_a_field_with_choices_takes_only_those():
    section = Section({"mode": Field("str", "fast", choices=("fast", "safe"))})
    assert _Reader("c.yml", {}, "", section, {}).read() == {"mode": "fast"}
    assert _Reader("c.yml", {"mode": "safe"}, "", section, {}).read() == {"mode": "safe"}
    with pytest.raises(ConfigError, match=r"^config c.yml: mode: must be one of fast, safe, not 'slow'$"):
        _Reader("c.yml", {"mode": "slow"}, "", section, {}).read()


# --- gpu-switch check-config FILE: the role's validate ------------------------------------------------------


def check(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def config_file(tmp_path, content, name="config.yml"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return str(path)


def test_check_config_accepts_a_valid_file_and_reads_nothing_else(tmp_path, monkeypatch):
    path = config_file(tmp_path, BASE)

    def no_switcher(*args, **kwargs):
        raise AssertionError("check-config built a Switcher")

    monkeypatch.setattr(cli, "Switcher", no_switcher)
    monkeypatch.setenv("GPU_SWITCH_RUN_ROOT", "relative")  # the file alone is checked, not the environment
    assert check("check-config", path) == (0, f"{path}: valid\n", "")
    code, out, err = check("--json", "check-config", path)
    assert (code, err) == (0, "")
    assert json.loads(out) == {"command": "check-config", "config": path, "valid": True, "changed": False}


BAD_FILES = [
    ("required-key-missing", with_("proxmox.node", KeyError), "proxmox.node: is required"),
    ("unknown-key", with_("vm.colour", "red"), "vm: unknown key 'colour' (known: vmid, hostpci_options)"),
    ("wrong-type", with_("container.vmid", "101"), "container.vmid: must be an integer, not '101'"),
    ("value-refused", with_("proxmox.port", 70000), "proxmox.port: 70000 is not a TCP port"),
    ("list-item-refused", with_("gpus", ["0000:01:00.0", "1:0.0"]), "gpus[1]: '1:0.0' is not a PCI address"),
    ("section-not-a-mapping", with_("timeouts", [30]), "timeouts: must be a mapping, not list"),
    ("null-not-a-value", with_("gpus", None), "gpus: must be a non-empty list of PCI addresses"),
    ("fields-disagree", with_("drivers.passthrough", "nvidia"), "drivers.passthrough: host and passthrough drivers"),
    ("empty-file", "", "proxmox: is required"),
    ("not-yaml", "proxmox: {node: [\n", "not valid YAML (line 2)"),
    ("not-a-mapping", "- proxmox\n", "must be a mapping, not list"),
]


@pytest.mark.parametrize(("content", "message"), [b[1:] for b in BAD_FILES], ids=[b[0] for b in BAD_FILES])
def test_check_config_refuses_each_kind_of_bad_file_in_one_line_naming_the_file_and_the_field(
    tmp_path, content, message
):
    path = config_file(tmp_path, content)
    code, out, err = check("check-config", path)
    assert (code, out) == (EXIT_USAGE, "")
    assert len(err.splitlines()) == 1 and err.startswith(f"gpu-switch: config {path}: ") and message in err
    code, out, _ = check("--json", "check-config", path)
    result = json.loads(out)
    assert code == EXIT_USAGE and result["valid"] is False and message in result["error"]


def test_check_config_without_a_file_checks_the_one_the_command_reads(tmp_path, monkeypatch):
    path = config_file(tmp_path, with_("vm.vmid", 101))
    assert check("--config", path, "check-config")[2].startswith(f"gpu-switch: config {path}: vm.vmid: ")
    monkeypatch.setenv("GPU_SWITCH_CONFIG", path)
    assert check("check-config")[0] == EXIT_USAGE
    assert (
        check("check-config", str(tmp_path / "none.yml"))[2]
        == f"gpu-switch: config {tmp_path}/none.yml: no such file\n"
    )


def test_a_file_argument_belongs_to_check_config_only(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["status", "/etc/gpu-switch/config.yml"])
    assert exc.value.code == EXIT_USAGE
    assert "FILE is for check-config only" in capsys.readouterr().err
