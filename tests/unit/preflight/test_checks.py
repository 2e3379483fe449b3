"""The inventory checks of the validation play (plugins/plugin_utils/preflight/), on plain data."""

from pathlib import Path

import pytest
from inference import known_bad
from preflight import checks, inventory

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "roles"


def load_roles():
    specs, declared, rules = {}, set(), {}
    for role in inventory.role_names():
        specs[role], names = inventory.load_role(str(ROLES / role))
        rules[role] = inventory.load_rules(str(ROLES / role))
        declared |= names
    return specs, declared, rules


SPECS, DECLARED, RULES = load_roles()
ROLE_MAP = {
    "pve": ["pve_host_gpu", "pve_api", "pve_guest_gpu", "gpu_switch"],
    "ct": ["nvidia_userspace", "cuda_toolkit", "python_env", "source_build", "nccl_tuning", "inference_service"],
}
GPUS = [{"address": f"0000:0{n + 1}:00.0", "numa_node": n // 4} for n in range(8)]
# What a Proxmox host must set (the roles' required options).
PVE = {
    "inferhost_gpus": GPUS,
    "pve_host_gpu_driver_version": "590.48.01",
    "pve_api_password": "pw-1234",
    "pve_api_node": "pve1",
    "gpu_switch_container_vmid": 101,
    "gpu_switch_vm_vmid": 201,
    "gpu_switch_gpus": [g["address"] for g in GPUS],
}


def view(name, groups, **variables):
    def get(key):
        value = variables[key]
        if isinstance(value, inventory.TemplateFailure):
            raise value
        return value

    return inventory.HostView(name, variables, get, groups)


def problems(pve=None, ct=None, targets=("pve", "ct"), validator=None, known_bad=()):
    views = {
        "pve": view("pve", ["pve_hosts"], **{**PVE, **(pve or {})}),
        "ct": view(
            "ct",
            ["inference_guests", "inference_containers"],
            inferhost_pve_host="pve",
            inference_service_api_key="key-5678",
            **{"nvidia_userspace_version": "590.48.01", **(ct or {})},
        ),
    }
    checker = checks.Checker(
        views, list(targets), ROLE_MAP, SPECS, DECLARED, validator=validator, known_bad=known_bad, rules=RULES
    )
    return checker.run()


def only(found):
    assert len(found) == 1, [p.line() for p in found]
    return found[0]


def service(**fields):
    base = {"name": "a", "engine": "vllm", "environment": "/opt/venvs/a", "model": {"path": "/srv/a"}, "gpus": [0, 1]}
    return {**base, **fields}


def test_a_consistent_inventory_has_no_problem():
    assert problems(ct={"inference_service_services": [service()], "inference_service_active": "a"}) == []


def test_a_misspelt_variable_is_refused_with_the_closest_name():
    found = only(problems(ct={"inference_service_activ": "qwen35"}))
    assert found.variable == "inference_service_activ"
    assert found.fix == "rename it to inference_service_active"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("gpu_switch_proxmox_verify_ssl", "pve_api_validate_certs"),
        ("pve_guest_gpu_ca_path", "pve_api_ca_path"),
        ("gpu_switch_proxmox_password", "pve_api_password"),
        ("pve_guest_gpu_api_runner", "pve_guest_gpu_delegate_to"),
        ("gpu_switch_source_dir", "gpu_switch_lib_modules"),
    ],
)
def test_a_removed_name_is_refused_naming_the_variable_that_replaced_it(old, new):
    found = only(problems(pve={old: "pw-1234" if "password" in old else True}))
    assert found.variable == old and found.fix.startswith(f"rename it to {new} ")
    assert "pw-1234" not in found.line()


@pytest.mark.parametrize(
    ("target", "old", "value", "new"),
    [
        ("pve", "pve_host_gpu_swap_expected", True, "pve_host_gpu_allow_swap"),
        ("pve", "pve_host_gpu_driver_change_allowed", True, "pve_host_gpu_allow_driver_change"),
        ("pve", "gpu_switch_parallel", False, "gpu_switch_move_in_parallel"),
        ("ct", "nvidia_userspace_enabled", False, "nvidia_userspace_install"),
        ("ct", "inference_service_wait", False, "inference_service_wait_until_served"),
        ("ct", "nccl_tuning_state", "absent", "nccl_tuning_install"),
    ],
)
def test_a_switch_set_by_its_former_name_is_refused_naming_the_verb_phrase(target, old, value, new):
    found = only(problems(**{target: {old: value}}))
    assert found.variable == old and found.fix.startswith(f"rename it to {new}")
    assert new in DECLARED


def test_the_former_state_names_its_two_values():
    found = only(problems(ct={"nccl_tuning_state": "present"}))
    assert "true for present, false for absent" in found.fix


def test_every_removed_name_points_at_a_declared_variable():
    for new in inventory.RENAMED.values():
        assert new.split()[0] in DECLARED, new
    assert not set(inventory.RENAMED) & DECLARED, "a renamed variable is still declared by a role"
    assert set(inventory.PROXMOX_MOVED.values()) <= DECLARED


def test_a_connection_setting_left_in_inferhost_proxmox_is_moved_to_pve_api():
    proxmox = {"container_vmid": 101, "vm_vmid": 201, "verify_ssl": True, "api_password": "pw-1234", "extra": 1}
    found = problems(pve={"inferhost_proxmox": proxmox})
    fixes = {p.variable: p.fix for p in found}
    assert fixes == {
        "inferhost_proxmox.api_password": "move it to pve_api_password (group_vars/pve_hosts/pve_api.yml)",
        "inferhost_proxmox.extra": "remove extra",
        "inferhost_proxmox.verify_ssl": "move it to pve_api_validate_certs (group_vars/pve_hosts/pve_api.yml)",
    }
    assert "pw-1234" not in "\n".join(p.line() for p in found)


def test_the_api_secret_is_required_once_for_both_roles():
    found = only(problems(pve={"pve_api_password": ""}))
    assert found.variable == "pve_api_password" and "vault_proxmox_password" in found.fix
    found = only(
        problems(pve={"pve_api_token_id": "switch", "pve_api_user": "root@pam", "gpu_switch_attach_hookscripts": False})
    )
    assert found.variable == "pve_api_token_secret"


def test_gpu_switch_needs_the_password_even_where_the_modules_use_pvesh():
    found = only(problems(pve={"pve_api_password": "", "pve_api_backend": "local"}))
    assert found.variable == "pve_api_password"


def test_hookscripts_need_root_at_pam():
    found = only(problems(pve={"pve_api_user": "admin@pve"}))
    assert found.variable == "pve_api_user" and "root@pam" in found.fix


def test_private_and_unprefixed_names_are_not_checked():
    assert problems(ct={"__inference_service_whatever": 1, "benchmark_rounds": 3, "lab_image_release": "x"}) == []


def test_the_active_service_must_exist():
    found = only(problems(ct={"inference_service_services": [service()], "inference_service_active": "b"}))
    assert found.variable == "inference_service_active" and found.fix == "inference_service_active: a"


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [("0,1", "a string is not a list"), ([0, 0], "distinct"), ([0, 8], "beyond the 8"), ([True], "integers")],
)
def test_service_gpus_are_distinct_integers_within_the_hosts_gpus(gpus, expected):
    found = only(problems(ct={"inference_service_services": [service(gpus=gpus)]}))
    assert found.variable == "inference_service_services[0].gpus"
    assert expected in found.given + found.expected


def test_gpu_count_comes_from_the_guests_proxmox_host():
    found = problems(
        pve={"inferhost_gpus": GPUS[:2]}, ct={"inference_service_services": [service(gpus=[0, 2])]}, targets=["ct"]
    )
    assert "beyond the 2" in only(found).given


@pytest.mark.parametrize(
    ("gpus", "variable"),
    [
        ("0000:01:00.0", "inferhost_gpus"),
        ([*GPUS[:2], {"address": "0000:01:00.0"}], "inferhost_gpus[2].address"),
        ([{"address": "1:0.0"}], "inferhost_gpus[0].address"),
    ],
)
def test_gpu_addresses_are_well_formed_and_unique(gpus, variable):
    found = problems(pve={"inferhost_gpus": gpus}, targets=["pve"])
    assert variable in [p.variable for p in found]


def test_a_gpu_string_says_so_instead_of_failing_on_an_attribute():
    found = problems(pve={"inferhost_gpus": "0000:01:00.0"}, targets=["pve"])
    assert "(a string)" in only(found).given


def test_gpu_addresses_must_be_in_the_published_inventory_when_known():
    facts = {"inferhost_gpu_facts": {"gpus": [{"address": g["address"]} for g in GPUS[:7]]}}
    found = only(problems(pve={"ansible_local": facts}, targets=["pve"]))
    assert found.variable == "inferhost_gpus[7].address" and "0000:08:00.0" in found.given


@pytest.mark.parametrize(
    "template",
    [
        "{{ ansible_local['inferhost_gpus']['gpus'] | default([]) }}",
        '{{ ansible_local["inferhost_gpus"].gpus }}',
        "{{ (ansible_local | default({})).inferhost_gpus.gpus }}",
    ],
)
def test_a_template_that_reads_the_gpu_facts_by_their_former_name_is_refused(template):
    # The host's published facts were ansible_local.inferhost_gpus: read so, pve_guest_gpu_gpus renders its default.
    variables = {**PVE, "pve_guest_gpu_gpus": []}
    views = {
        "pve": inventory.HostView(
            "pve", variables, variables.get, ["pve_hosts"], raw=lambda n: template if n == "pve_guest_gpu_gpus" else ""
        )
    }
    found = only(checks.Checker(views, ["pve"], ROLE_MAP, SPECS, DECLARED, rules=RULES).run())
    assert found.variable == "pve_guest_gpu_gpus" and "inferhost_gpus" in found.given
    assert "ansible_local['inferhost_gpu_facts']" in found.fix


def test_the_gpu_facts_read_by_their_name_are_no_problem():
    variables = {**PVE, "pve_guest_gpu_gpus": []}
    raw = {"pve_guest_gpu_gpus": "{{ ansible_local['inferhost_gpu_facts']['gpus'] | default([]) }}"}
    views = {"pve": inventory.HostView("pve", variables, variables.get, ["pve_hosts"], raw=lambda n: raw.get(n, ""))}
    assert checks.Checker(views, ["pve"], ROLE_MAP, SPECS, DECLARED, rules=RULES).run() == []


def test_switch_gpus_must_be_gpus_of_the_host_once():
    found = problems(pve={"gpu_switch_gpus": ["0000:01:00.0", "0000:01:00.0", "0000:09:00.0"]}, targets=["pve"])
    assert [p.variable for p in found] == ["gpu_switch_gpus[1]", "gpu_switch_gpus[2]"]


def test_max_jobs_must_be_positive():
    found = only(problems(ct={"source_build_max_jobs": -4}))
    assert found.variable == "source_build_max_jobs" and found.fix == "source_build_max_jobs: 20"


def test_a_build_arch_list_variable_must_be_set_in_its_environment():
    build = {"name": "flash-attn", "target": "/opt/venvs/sglang", "gb_per_thread": 5, "threads_per_job": 4}
    named = {**build, "environment": {"FLASH_ATTN_CUDA_ARCHS": "120"}, "arch_list_variable": "FLASH_ATTN_CUDA_ARCHS"}
    assert problems(ct={"source_build_builds": [named]}) == []
    found = only(problems(ct={"source_build_builds": [{**named, "arch_list_variable": "FLASH_ATTN_ARCHS"}]}))
    assert found.variable == "source_build_builds[0].arch_list_variable" and "FLASH_ATTN_ARCHS" in found.given


def test_the_guest_driver_must_be_the_hosts():
    found = only(problems(pve={"pve_host_gpu_driver_version": "590.48.01"}, ct={"nvidia_userspace_version": "580.1.2"}))
    assert found.variable == "nvidia_userspace_version" and "590.48.01" in found.expected


def test_a_template_failure_caused_by_a_misspelt_name_is_not_a_second_problem():
    failing = inventory.TemplateFailure("'inferhost_gpus' is undefined")
    views = {
        "pve": inventory.HostView(
            "pve",
            ["inferhost_gpu", "gpu_switch_gpus", "pve_api_password"],
            lambda n: (
                {"inferhost_gpu": GPUS, "pve_api_password": "x"}.get(n)
                if n != "gpu_switch_gpus"
                else (_ for _ in ()).throw(failing)
            ),
            ["pve_hosts"],
            raw=lambda n: "{{ inferhost_gpus | map(attribute='address') }}" if n == "gpu_switch_gpus" else "",
        )
    }
    found = checks.Checker(views, ["pve"], ROLE_MAP, SPECS, DECLARED, rules=RULES).run()
    assert [p.variable for p in found] == ["inferhost_gpu"]


def test_secrets_are_never_shown():
    found = problems(ct={"inference_service_api_kee": "key-5678", "inference_service_hardware": {"token": "key-5678"}})
    text = "\n".join(p.line() for p in found)
    assert "key-5678" not in text and inventory.SECRET_SHOWN in text
    assert inventory.show({"api_password": "pw", "node": "pve1"}) == '{"api_password": "(secret)", "node": "pve1"}'


def test_argument_spec_errors_name_the_variable_and_the_expected_type():
    def validator(options, params):
        name = "inference_service_load_timeout_s"
        said = f"argument '{name}' is of type str and we were unable to convert to int"
        return [(name, said)] if name in params else []

    found = only(problems(ct={"inference_service_load_timeout_s": "soon"}, validator=validator))
    assert found.variable == "inference_service_load_timeout_s" and found.expected == "an integer"
    assert "2700" in found.fix


def test_broken_yaml_is_named_with_file_and_line(tmp_path):
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "hosts.yml").write_text("all:\n  hosts: {a: {}}\n")
    (tmp_path / "group_vars" / "all" / "x.yml").write_text("a: 1\nb: [1\nc: 2\n")
    (errors,) = inventory.yaml_errors([str(tmp_path)])
    assert "group_vars/all/x.yml:3:" in errors and "YAML error" in errors


def test_vault_tagged_values_are_not_yaml_errors(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("vault_x: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  3130\n")
    assert inventory.yaml_errors([str(tmp_path)]) == []


def test_the_file_of_a_variable_is_the_most_specific(tmp_path):
    for rel, text in {
        "group_vars/all/a.yml": "inferhost_cpu_vendor: amd\n",
        "host_vars/pve/hw.yml": "inferhost_cpu_vendor: intel\n",
        "hosts.yml": "all:\n  hosts:\n    pve:\n      inferhost_pve_host: x\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    files = inventory.VariableFiles([str(tmp_path)])
    assert files.file_of("inferhost_cpu_vendor", "pve", ["pve_hosts"]).endswith("host_vars/pve/hw.yml")
    assert files.file_of("inferhost_cpu_vendor", "other", []).endswith("group_vars/all/a.yml")
    assert files.file_of("inferhost_pve_host", "pve", []).endswith("hosts.yml")


WIRING = inventory.load_wiring()


def test_the_wiring_hands_the_site_data_to_the_roles():
    """Each wired variable is a role's, and reads the site's data (or the host's published facts)."""
    assert WIRING, inventory.WIRING_FILE
    for name, template in WIRING.items():
        assert name in DECLARED, name
        assert "inferhost_" in str(template), (name, template)


def test_a_wired_variable_without_its_site_data_names_the_site_variable():
    pve = {k: v for k, v in PVE.items() if not k.startswith("gpu_switch_") or k == "gpu_switch_gpus"}
    template = WIRING["gpu_switch_container_vmid"]

    def get(key):
        if key == "gpu_switch_container_vmid":
            raise inventory.TemplateFailure("'inferhost_proxmox' is undefined")
        return pve[key]

    variables = {**pve, "gpu_switch_container_vmid": template}
    views = {"pve": inventory.HostView("pve", variables, get, ["pve_hosts"], raw=lambda n: variables.get(n, ""))}
    found = checks.Checker(views, ["pve"], ROLE_MAP, SPECS, DECLARED, rules=RULES, wiring=WIRING).run()
    assert [p.variable for p in found] == ["inferhost_proxmox"], [p.line() for p in found]
    assert "set inferhost_proxmox in the inventory" in found[0].fix


def test_a_wired_variable_set_in_the_inventorys_group_vars_all_is_refused(tmp_path):
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "mine.yml").write_text("gpu_switch_gpus: ['0000:01:00.0']\n")
    (tmp_path / "group_vars" / "pve_hosts").mkdir(parents=True)
    (tmp_path / "group_vars" / "pve_hosts" / "ok.yml").write_text("pve_host_gpu_addresses: ['0000:01:00.0']\n")
    views = {"pve": view("pve", ["pve_hosts"], **PVE, pve_host_gpu_addresses=["0000:01:00.0"])}
    files = inventory.VariableFiles([str(tmp_path)])
    found = checks.Checker(views, ["pve"], ROLE_MAP, SPECS, DECLARED, files=files, rules=RULES, wiring=WIRING).run()
    problem = only(found)
    assert problem.variable == "gpu_switch_gpus" and problem.file.endswith("group_vars/all/mine.yml")
    assert problem.fix.startswith("move it to group_vars/pve_hosts/")


KNOWN_BAD = known_bad.rules()


def sglang_nvfp4(**args):
    return service(
        engine="sglang",
        model={"path": "/srv/q", "quantization": "nvfp4"},
        args={"attention-backend": "triton", **args},
        env={"SGLANG_ENABLE_JIT_DEEPGEMM": "0"},
    )


def test_the_moe_runner_backend_rule_stops_the_run_before_any_change():
    """The known-bad matrix of the role, applied by the validation play: the model's quantization comes from
    the inventory there (the role checks the checkpoint's own on the guest)."""
    ct = {"inference_service_hardware": {"compute_capability": "12.0"}, "inference_service_services": [sglang_nvfp4()]}
    found = only(problems(ct=ct, targets=["ct"], known_bad=KNOWN_BAD))
    assert found.variable == "inference_service_services[0].known_bad"
    assert "produces NaN" in found.given and found.fix == "args: {moe-runner-backend: flashinfer_cutlass}"
    ct["inference_service_services"] = [sglang_nvfp4(**{"moe-runner-backend": "flashinfer_cutlass"})]
    assert problems(ct=ct, targets=["ct"], known_bad=KNOWN_BAD) == []


def test_a_rule_bounded_by_engine_version_waits_for_the_version():
    """A rule with engine_version_max (or _below) holds only for some versions: without the service's
    engine_version the validation play leaves it to the role's plan, which reads the installed one."""
    rule = {
        "id": "bounded",
        "engine": "sglang",
        "engine_version_max": "0.5.9",
        "when": [{"flag": "attention-backend", "in": ["flashinfer"]}],
        "reason": "bad up to 0.5.9",
        "fix": "args: {attention-backend: triton}",
    }

    def with_version(version):
        svc = service(engine="sglang", args={"attention-backend": "flashinfer"})
        if version:
            svc["engine_version"] = version
        return problems(ct={"inference_service_services": [svc]}, targets=["ct"], known_bad=[rule])

    assert with_version(None) == []
    assert with_version("0.5.10") == []
    found = only(with_version("0.5.9"))
    assert found.variable == "inference_service_services[0].known_bad"
    assert "bad up to 0.5.9" in found.given and found.fix == "args: {attention-backend: triton}"


# What Ansible's argument spec check converts without a word, and the cross references the roles check late.


def test_a_string_where_a_list_is_meant_is_refused_with_the_list_to_write():
    found = only(problems(pve={"pve_host_gpu_kernel_args_extra": "pcie_aspm=off"}, targets=["pve"]))
    assert found.variable == "pve_host_gpu_kernel_args_extra" and "a string is not a list" in found.expected
    assert found.fix == "pve_host_gpu_kernel_args_extra: [pcie_aspm=off]"
    assert problems(pve={"pve_host_gpu_kernel_args_extra": ["pcie_aspm=off"]}, targets=["pve"]) == []


def test_a_string_where_a_list_is_meant_inside_an_entry_is_refused_by_its_path():
    env = {"name": "a", "path": "/opt/venvs/a", "python": "3.12", "steps": [{"name": "s", "packages": "torch,einops"}]}
    found = only(problems(ct={"python_env_environments": [env]}, targets=["ct"]))
    assert found.variable == "python_env_environments[0].steps[0].packages"
    assert found.fix == "packages: [torch, einops]"


@pytest.mark.parametrize(("python", "fix"), [(3.1, 'python: "3.10"'), (3.12, 'python: "3.12"'), (3, 'python: "3"')])
def test_a_python_version_that_is_not_a_string_is_refused(python, fix):
    env = {"name": "a", "path": "/opt/venvs/a", "python": python, "steps": [{"name": "s", "packages": ["torch"]}]}
    found = only(problems(ct={"python_env_environments": [env]}, targets=["ct"]))
    assert found.variable == "python_env_environments[0].python" and found.fix == fix


def test_a_number_where_a_string_is_meant_is_refused():
    settings = [{"name": "NCCL_MIN_NCHANNELS", "value": 1.10, "reason": "measured"}]
    found = only(problems(ct={"nccl_tuning_settings": settings}, targets=["ct"]))
    assert found.variable == "nccl_tuning_settings[0].value" and found.fix.startswith('value: "1.1"')


def test_a_partial_mapping_of_an_option_with_defaults_is_refused_with_the_whole_mapping():
    found = only(problems(pve={"gpu_switch_timeouts": {"shutdown": 300}}, targets=["pve"]))
    assert found.variable == "gpu_switch_timeouts" and "task, sysfs_write, command missing" in found.expected
    assert found.fix == "gpu_switch_timeouts: {shutdown: 300, task: 600, sysfs_write: 15, command: 60}"
    whole = {"shutdown": 300, "task": 600, "sysfs_write": 15, "command": 60}
    assert problems(pve={"gpu_switch_timeouts": whole}, targets=["pve"]) == []


def test_a_value_wired_from_a_refused_variable_is_not_named_again():
    values = {"inferhost_cpu_vendor": 1.5, "pve_host_gpu_cpu_vendor": 1.5, **PVE, "pve_api_password": "x"}
    views = {
        "pve": inventory.HostView(
            "pve",
            values,
            values.get,
            ["pve_hosts"],
            raw=lambda n: "{{ inferhost_cpu_vendor }}" if n == "pve_host_gpu_cpu_vendor" else values.get(n),
        )
    }
    found = checks.Checker(views, ["pve"], ROLE_MAP, SPECS, DECLARED, rules=RULES).run()
    assert [p.variable for p in found] == ["inferhost_cpu_vendor"]


@pytest.mark.parametrize(
    ("capability", "fix"),
    [("120", '"12.0"'), (12.0, '"12.0"'), (12, '"12.0"'), ("sm_89", '"8.9"'), ("twelve", '"12.0"')],
)
def test_a_compute_capability_is_a_quoted_major_minor(capability, fix):
    found = only(problems(ct={"inference_service_hardware": {"compute_capability": capability}}, targets=["ct"]))
    assert found.variable == "inference_service_hardware.compute_capability"
    assert found.fix == f"compute_capability: {fix}"
    assert problems(ct={"inference_service_hardware": {"compute_capability": "12.0"}}, targets=["ct"]) == []


def test_a_gpu_is_named_by_its_function_zero():
    gpus = [{"address": "0000:01:00.1", "numa_node": 0}, *GPUS[1:]]
    # The other roles' addresses are wired from inferhost_gpus, as in the inventories: only the data is named.
    wired = [g["address"] for g in gpus]
    found = only(problems(pve={"inferhost_gpus": gpus, "gpu_switch_gpus": wired}, targets=["pve"]))
    assert found.variable == "inferhost_gpus[0].address" and "audio" in found.expected
    assert found.fix == 'address: "0000:01:00.0"'
    found = only(problems(pve={"inferhost_gpus": [*GPUS, {"address": "0000:01:00.1"}]}, targets=["pve"]))
    assert found.variable == "inferhost_gpus[8].address" and found.fix == "remove entry 8 (entry 0 names the GPU)"


def test_a_service_environment_is_one_of_the_guests_environments_when_it_declares_any():
    env = {"name": "a", "path": "/opt/venvs/a", "python": "3.12", "steps": [{"name": "s", "packages": ["torch"]}]}
    typo = {"inference_service_services": [service(environment="/opt/venv/a")]}
    # No environments declared (the lab's stand-in engine has one made outside python_env): not checked.
    assert problems(ct=typo, targets=["ct"]) == []
    found = only(problems(ct={**typo, "python_env_environments": [env]}, targets=["ct"]))
    assert found.variable == "inference_service_services[0].environment"
    assert found.fix == "environment: /opt/venvs/a"
    assert problems(ct={"inference_service_services": [service()], "python_env_environments": [env]}) == []


@pytest.mark.parametrize(
    ("cuda_home", "default", "refused"),
    [
        ("/usr/local/cuda-13.0", "13.0", False),
        ("/usr/local/cuda", "13.0", False),
        ("/usr/local/cuda", "", True),
        ("/usr/local/cuda-12.4", "13.0", True),
        ("", "13.0", False),
    ],
)
def test_a_build_cuda_home_is_a_toolkit_the_guest_installs(cuda_home, default, refused):
    build = {"name": "fa", "target": "/opt/venvs/a", "gb_per_thread": 5, "cuda_home": cuda_home}
    ct = {"source_build_builds": [build], "cuda_toolkit_versions": ["12.8", "13.0"], "cuda_toolkit_default": default}
    found = problems(ct=ct, targets=["ct"])
    assert [p.variable for p in found] == (["source_build_builds[0].cuda_home"] if refused else [])


def test_two_hosts_of_a_cluster_never_share_a_guest_id():
    views = {
        "pve": view("pve", ["pve_hosts"], **PVE, inferhost_proxmox={"container_vmid": 101, "vm_vmid": 201}),
        "pve2": view(
            "pve2",
            ["pve_hosts"],
            **{**PVE, "pve_api_node": "pve2"},
            inferhost_proxmox={"container_vmid": 102, "vm_vmid": 101},
        ),
    }
    found = only(checks.Checker(views, ["pve", "pve2"], ROLE_MAP, SPECS, DECLARED, rules=RULES).run())
    assert found.variable == "inferhost_proxmox.container_vmid" and found.hosts == ["pve"]
    assert "pve2 has 101 as its vm_vmid" in found.expected
    views["pve2"] = view(
        "pve2",
        ["pve_hosts"],
        **{**PVE, "pve_api_node": "pve2"},
        inferhost_proxmox={"container_vmid": 102, "vm_vmid": 202},
    )
    assert checks.Checker(views, ["pve", "pve2"], ROLE_MAP, SPECS, DECLARED, rules=RULES).run() == []
