"""gpu_switch converged: files and modes, the command, the hookscript's refusal, the recover unit."""

import json

import yaml

CONFIG = "/etc/gpu-switch/config.yml"
HOOK = "/var/lib/vz/snippets/gpu-switch-hook.py"


def test_the_password_is_only_in_its_0600_file(host):
    secret = host.file("/etc/gpu-switch/password")
    assert secret.mode == 0o600 and secret.user == "root" and secret.content_string == "molecule-secret\n"
    assert "molecule-secret" not in host.file(CONFIG).content_string


def test_the_configuration_names_the_gpus_and_reads_the_hosts_own_sysfs(host):
    config = yaml.safe_load(host.file(CONFIG).content_string)
    assert config["gpus"] == ["0000:01:00.0", "0000:02:00.0"] and "roots" not in config
    assert config["proxmox"]["password_file"] == "/etc/gpu-switch/password"
    assert config["proxmox"]["verify_ssl"] is True and config["proxmox"]["ca_file"] == "/etc/pve/pve-root-ca.pem"
    assert (config["container"]["vmid"], config["vm"]["vmid"]) == (101, 201)


def test_the_package_and_the_command_are_installed(host):
    assert host.package("python3-proxmoxer").is_installed and host.package("python3-yaml").is_installed
    assert host.file("/usr/local/lib/inferhost/gpu_switch/switch.py").exists
    client = host.file("/usr/local/lib/inferhost/pve_api.py")  # the Proxmox API client, beside the package
    assert client.exists and client.mode == 0o644 and client.user == "root"
    command = host.file("/usr/local/sbin/gpu-switch")
    assert command.mode == 0o755
    assert "{status,to-vm,to-ct,recover,check-config}" in host.check_output("/usr/local/sbin/gpu-switch --help")


def test_the_configuration_passes_check_config_and_a_bad_one_is_refused(host):
    assert host.run(f"/usr/local/sbin/gpu-switch check-config {CONFIG}").rc == 0
    bad = host.run("printf 'proxmox: {node: pve1}\\n' | /usr/local/sbin/gpu-switch check-config /dev/stdin")
    assert bad.rc == 2 and bad.stderr.strip() == "gpu-switch: config /dev/stdin: container: is required"


def test_status_without_an_api_reports_the_gpus_and_the_reason(host):
    out = host.run("/usr/local/sbin/gpu-switch --json status")
    assert out.rc == 1
    result = json.loads(out.stdout)
    assert result["owner"] == "ct" and [g["address"] for g in result["gpus"]] == ["0000:01:00.0", "0000:02:00.0"]
    assert result["gpus"][0]["functions"] == [
        {"address": "0000:01:00.0", "driver": "nvidia"},
        {"address": "0000:01:00.1", "driver": "snd_hda_intel"},
    ]
    assert out.stderr.strip().splitlines()[-1].startswith("gpu-switch: ")


def test_the_hookscript_refuses_the_vm_while_the_container_has_the_gpus(host):
    vm = host.run(f"{HOOK} 201 pre-start")
    assert vm.rc == 1 and "refusing to start VM 201" in vm.stderr and "gpu-switch to-vm" in vm.stderr
    assert host.run(f"{HOOK} 101 pre-start").rc == 0
    assert host.run(f"{HOOK} 201 post-stop").rc == 0


def test_the_recover_unit_is_enabled_before_the_guests_start(host):
    unit = host.file("/etc/systemd/system/gpu-switch-recover.service").content_string
    assert "ExecStart=/usr/local/sbin/gpu-switch --config /etc/gpu-switch/config.yml recover" in unit
    assert "Before=pve-guests.service" in unit
    assert host.run("systemctl is-enabled gpu-switch-recover.service").stdout.strip() == "enabled"
