"""PCI resource mappings for the VM side, against fakepve with the mapping store of the simulation wing
(src/inferhost/sim/pve_mapping.py): the store and PVE's rules checked against the API schema, the modules
pve_pci_mapping and pve_guest_gpu_config with mapping= entries, and role pve_guest_gpu with
pve_guest_gpu_use_pci_mappings, an API token with Mapping.Use doing what raw entries are refused."""

import pytest
from fakepve.pytest_plugin import _Serving
from pve_api import Client, Login
from pve_testlib import load_module, play_with_pve_api, run_module

from inferhost.sim.pve_mapping import MappingPve

MAPPING = load_module("pve_pci_mapping")
GUEST = load_module("pve_guest_gpu_config")
TOKEN = ("ansible@pve", "gpus", "5e1c0a7d")
# The host's GPUs as pve_host_gpu publishes them (ansible_local.inferhost_gpu_facts.gpus).
GPUS = [
    {
        "address": "0000:01:00.0",
        "slot": "0000:01:00",
        "index": 0,
        "minor": 0,
        "vendor": "0x10de",
        "device": "0x2335",
        "subsystem_vendor": "0x10de",
        "subsystem_device": "0x18be",
        "iommu_group": 14,
    },
    {
        "address": "0000:81:00.0",
        "slot": "0000:81:00",
        "index": 1,
        "minor": 1,
        "vendor": "0x10de",
        "device": "0x2335",
        "subsystem_vendor": "0x10de",
        "subsystem_device": "0x18be",
        "iommu_group": 40,
    },
]
ENTRY0 = "node=pve1,path=0000:01:00,id=10de:2335,subsystem-id=10de:18be,iommugroup=14"


@pytest.fixture
def pve(_fakepve_pki):
    """MappingPve served as fakepve's fixture serves its own: root@pam/secret, a token, the host's two GPUs."""
    fake = MappingPve(user="root@pam", password="secret", host="127.0.0.1", port=0)
    fake.time_scale = 0
    fake.apitokens["!".join(TOKEN[:2])] = TOKEN[2]
    for gpu in GPUS:
        for function, group in ((gpu["address"], gpu["iommu_group"]), (gpu["slot"] + ".1", gpu["iommu_group"])):
            fake.add_pci_device("pve1", function, "10de:2335", "10de:18be", group)
    fake.add_vm(201, "inference-vm", node="pve1", status="stopped", config={"machine": "q35", "memory": "65536"})
    serving = _Serving(fake, *_fakepve_pki)
    try:
        yield fake
    finally:
        serving.stop()


def grant_token(pve, *paths_privs):
    for path, privs in paths_privs:
        pve.grant("!".join(TOKEN[:2]), path, *privs)


def client(pve, cafile, token=False):
    user, name, secret = TOKEN if token else ("root@pam", None, "secret")
    login = Login(host=pve.host, port=pve.port, user=user, secret=secret, token_name=name, ca_file=cafile)
    api = Client(login, "pve1")
    api.log_in()
    return api


def conn(pve, cafile, token=False, **kw):
    base = {"api_host": pve.host, "api_port": pve.port, "ca_path": cafile, "node": "pve1"}
    if token:
        base.update(api_user=TOKEN[0], api_token_id=TOKEN[1], api_token_secret=TOKEN[2])
    else:
        base.update(api_user="root@pam", api_password="secret")
    return {**base, **kw}


def mapping_args(gpus=GPUS):
    return [
        {
            "id": "gpu-" + g["slot"].replace(":", "-"),
            "path": g["slot"],
            "device_id": "10de:2335",
            "subsystem_id": "10de:18be",
            "iommu_group": g["iommu_group"],
        }
        for g in gpus
    ]


# --- the simulation wing: the store and PVE's rules, through the schema ----------------------------------------


def test_the_store_creates_lists_updates_and_deletes_mappings_schema_checked(pve, fakepve_cafile):
    api = client(pve, fakepve_cafile)
    api.create_pci_mapping("gpu-a", [ENTRY0], "first GPU")
    assert api.pci_mappings() == [{"id": "gpu-a", "description": "first GPU", "map": [ENTRY0]}]
    one = api.pci_mapping("gpu-a")
    assert one["map"] == [ENTRY0] and one["digest"]
    other = "node=pve2,path=0000:01:00,id=10de:2335"
    api.set_pci_mapping("gpu-a", [ENTRY0, other], one["digest"])
    assert pve.pci_mappings["gpu-a"]["map"] == [ENTRY0, other]
    with pytest.raises(Exception, match="file changed by other user"):
        api.set_pci_mapping("gpu-a", [ENTRY0], one["digest"])  # the digest read before the last write
    with pytest.raises(Exception, match="already defined"):
        api.create_pci_mapping("gpu-a", [ENTRY0])
    with pytest.raises(Exception, match="HTTP 400"):  # the id's format, by the schema
        api.create_pci_mapping("9gpu", [ENTRY0])
    with pytest.raises(Exception, match="HTTP 400"):  # a map entry's id, by the schema's map format
        api.create_pci_mapping("gpu-b", ["node=pve1,path=0000:01:00,id=nvidia"])
    assert sorted(pve.pci_mappings) == ["gpu-a"]
    api.api.cluster.mapping.pci("gpu-a").delete()
    assert pve.pci_mappings == {}
    with pytest.raises(Exception, match="no such pci mapping"):
        api.pci_mapping("gpu-a")


def test_creating_a_mapping_needs_mapping_modify(pve, fakepve_cafile):
    grant_token(pve, ("/mapping/pci", ["Mapping.Use"]))
    with pytest.raises(Exception, match=r"Permission check failed \(/mapping/pci, Mapping.Modify\)"):
        client(pve, fakepve_cafile, token=True).create_pci_mapping("gpu-a", [ENTRY0])
    assert pve.pci_mappings == {}


def test_a_raw_hostpci_is_root_pams_and_a_mapping_needs_mapping_use(pve, fakepve_cafile):
    pve.pci_mappings["gpu-a"] = {"map": [ENTRY0]}
    grant_token(pve, ("/vms/201", ["VM.Config.HWType", "VM.Audit"]))
    token = client(pve, fakepve_cafile, token=True)
    with pytest.raises(Exception, match="only root can set 'hostpci0' config for non-mapped devices"):
        token.set_config("qemu", 201, {"hostpci0": "0000:01:00,pcie=1"})
    with pytest.raises(Exception, match=r"Permission check failed \(/mapping/pci/gpu-a, Mapping.Use\)"):
        token.set_config("qemu", 201, {"hostpci0": "mapping=gpu-a,pcie=1"})
    assert "hostpci0" not in pve.vm(201).config
    grant_token(pve, ("/mapping/pci/gpu-a", ["Mapping.Use"]))
    token.set_config("qemu", 201, {"hostpci0": "mapping=gpu-a,pcie=1"})
    assert pve.vm(201).config["hostpci0"] == "mapping=gpu-a,pcie=1"
    # root@pam logged in with its password sets a raw entry; the token may then neither change nor remove it.
    client(pve, fakepve_cafile).set_config("qemu", 201, {"hostpci1": "0000:81:00,pcie=1"})
    with pytest.raises(Exception, match="only root can set 'hostpci1'"):
        token.set_config("qemu", 201, {}, delete=["hostpci1"])
    assert pve.vm(201).config["hostpci1"] == "0000:81:00,pcie=1"


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (ENTRY0, None),
        (ENTRY0.replace("id=10de:2335", "id=10de:2330"), "'id' does not match for 'gpu-a' (10de:2335 != 10de:2330)"),
        (ENTRY0.replace(",subsystem-id=10de:18be", ""), "no 'subsystem-id' for device '0000:01:00.0'"),
        (ENTRY0.replace("iommugroup=14", "iommugroup=15"), "'iommugroup' does not match for 'gpu-a' (14 != 15)"),
        (ENTRY0.replace("node=pve1", "node=pve2"), "PCI device mapping not found for 'gpu-a'"),
        (ENTRY0.replace("0000:01:00", "0000:02:00"), "pci device '0000:02:00.0' not found"),
    ],
)
def test_the_vm_start_checks_its_mapping_against_the_nodes_hardware(pve, fakepve_cafile, entry, error):
    pve.pci_mappings["gpu-a"] = {"map": [entry]}
    pve.vm(201).config["hostpci0"] = "mapping=gpu-a,pcie=1"
    api = client(pve, fakepve_cafile)
    upid = api.post("qemu", 201, "start")
    status = api.task_status(upid)
    if error is None:
        assert status["exitstatus"] == "OK" and pve.vm(201).status == "running"
    else:
        assert error in status["exitstatus"] and pve.vm(201).status == "stopped"
        assert status["exitstatus"].startswith("PCI device mapping") or "not found" in status["exitstatus"]


# --- the modules ------------------------------------------------------------------------------------------


def test_one_mapping_per_gpu_created_once_and_check_mode_honest(pve, fakepve_cafile):
    args = conn(pve, fakepve_cafile, mappings=mapping_args())
    check = run_module(MAPPING, args, check_mode=True, diff=True)
    assert check["changed"] is True and check["created"] == ["gpu-0000-01-00", "gpu-0000-81-00"]
    assert pve.pci_mappings == {}, "check mode wrote nothing"
    assert f"gpu-0000-01-00: {ENTRY0}\n" in check["diff"]["after"] and check["diff"]["before"] == ""
    result = run_module(MAPPING, args)
    assert result["changed"] is True
    assert pve.pci_mappings["gpu-0000-01-00"]["map"] == [ENTRY0]
    assert pve.pci_mappings["gpu-0000-81-00"]["map"] == [ENTRY0.replace("01:00", "81:00").replace("=14", "=40")]
    writes = len([r for r in pve.requests if r[0] in ("POST", "PUT") and "/cluster/mapping" in r[1]])
    again = run_module(MAPPING, args, check_mode=True, diff=True)
    assert again["changed"] is False and again["diff"]["before"] == again["diff"]["after"]
    assert run_module(MAPPING, args)["changed"] is False
    assert len([r for r in pve.requests if r[0] in ("POST", "PUT") and "/cluster/mapping" in r[1]]) == writes == 2


def test_the_nodes_own_entry_changes_and_other_nodes_stay(pve, fakepve_cafile):
    pve2 = "node=pve2,path=0000:41:00,id=10de:2335,subsystem-id=10de:18be,iommugroup=7"
    pve.pci_mappings["gpu-0000-01-00"] = {"map": [pve2, ENTRY0.replace("iommugroup=14", "iommugroup=3")]}
    result = run_module(MAPPING, conn(pve, fakepve_cafile, mappings=mapping_args(GPUS[:1])), diff=True)
    assert result["updated"] == ["gpu-0000-01-00"]
    assert pve.pci_mappings["gpu-0000-01-00"]["map"] == [pve2, ENTRY0]
    assert "-gpu-0000-01-00" not in result["diff"]["after"] and "iommugroup=3" in result["diff"]["before"]


def test_a_malformed_device_id_is_refused_before_any_call(pve, fakepve_cafile):
    calls = len(pve.requests)
    bad = [{**mapping_args()[0], "device_id": "nvidia"}]
    result = run_module(MAPPING, conn(pve, fakepve_cafile, mappings=bad, context="pve_guest_gpu_gpus"))
    assert result["failed"] is True
    assert result["msg"].startswith("pve_guest_gpu_gpus: mappings[0]: id='nvidia' in mapping entry")
    assert len(pve.requests) == calls


def test_a_token_with_mapping_use_wires_the_vm_where_raw_entries_are_refused(pve, fakepve_cafile):
    run_module(MAPPING, conn(pve, fakepve_cafile, mappings=mapping_args()))
    grant_token(pve, ("/vms/201", ["VM.Config.HWType", "VM.Audit"]))
    raw = {"vmid": 201, "type": "qemu", "hostpci": [{"host": "0000:01:00"}]}
    refused = run_module(GUEST, conn(pve, fakepve_cafile, token=True, **raw))
    assert refused["failed"] is True and "only root can set 'hostpci0' config for non-mapped devices" in refused["msg"]
    assert "mapping=<id>" in refused["msg"] and "hostpci0" not in pve.vm(201).config
    grant_token(pve, ("/mapping/pci", ["Mapping.Use"]))
    mapped = {
        "vmid": 201,
        "type": "qemu",
        "hostpci": [{"mapping": "gpu-0000-01-00"}, {"mapping": "gpu-0000-81-00"}],
        "managed_hosts": ["0000:01:00", "0000:81:00"],
    }
    result = run_module(GUEST, conn(pve, fakepve_cafile, token=True, **mapped))
    assert result["changed"] is True, result
    assert (pve.vm(201).config["hostpci0"], pve.vm(201).config["hostpci1"]) == (
        "mapping=gpu-0000-01-00,pcie=1",
        "mapping=gpu-0000-81-00,pcie=1",
    )
    assert run_module(GUEST, conn(pve, fakepve_cafile, token=True, **mapped))["changed"] is False
    api = client(pve, fakepve_cafile)
    assert api.task_status(api.post("qemu", 201, "start"))["exitstatus"] == "OK"


# --- the role ---------------------------------------------------------------------------------------------


@pytest.fixture
def play(pve, fakepve_cafile, tmp_path):
    def run(*extra, token=True, **given):
        role = {
            "role": "pve_guest_gpu",
            "pve_guest_gpu_gpus": GPUS,
            "pve_guest_gpu_vms": [{"vmid": 201}],
            "pve_guest_gpu_use_pci_mappings": True,
            **given,
        }
        connection = {
            "pve_api_node": "pve1",
            "pve_api_host": pve.host,
            "pve_api_port": pve.port,
            "pve_api_ca_path": fakepve_cafile,
            "pve_api_packages": [],
            **(
                {"pve_api_user": TOKEN[0], "pve_api_token_id": TOKEN[1], "pve_api_token_secret": TOKEN[2]}
                if token
                else {"pve_api_password": "secret"}
            ),
        }
        return play_with_pve_api(tmp_path, connection, role, *extra)

    return run


def test_the_role_maps_each_gpu_and_wires_the_vm_with_a_token(pve, play):
    grant_token(
        pve,
        ("/mapping/pci", ["Mapping.Modify", "Mapping.Use", "Mapping.Audit"]),
        ("/vms/201", ["VM.Config.HWType", "VM.Audit"]),
        ("/nodes/pve1", ["Sys.Audit"]),
    )
    changed, failed, out = play("--check", "--diff")
    assert (changed, failed) == (2, 0), out[-4000:]
    assert "+gpu-0000-01-00: node=pve1,path=0000:01:00" in out and pve.pci_mappings == {}
    changed, failed, out = play()
    assert (changed, failed) == (2, 0), out[-4000:]
    assert pve.pci_mappings["gpu-0000-01-00"]["map"] == [ENTRY0]
    vm = pve.vm(201).config
    assert (vm["hostpci0"], vm["hostpci1"]) == ("mapping=gpu-0000-01-00,pcie=1", "mapping=gpu-0000-81-00,pcie=1")
    assert play("--check", "--diff")[:2] == (0, 0), "--check on the mapped guests reports nothing"
    api_start = [r for r in pve.requests if "status/start" in r[1]]
    assert api_start == [], "the role starts nothing"


def test_raw_entries_stay_the_default_for_root_pam(pve, play):
    changed, failed, out = play(token=False, pve_guest_gpu_use_pci_mappings=False)
    assert (changed, failed) == (1, 0), out[-4000:]
    assert pve.pci_mappings == {}
    vm = pve.vm(201).config
    assert (vm["hostpci0"], vm["hostpci1"]) == ("0000:01:00,pcie=1", "0000:81:00,pcie=1")


def test_a_token_without_mappings_and_a_container_are_refused_in_preflight(pve, play):
    before = dict(pve.vm(201).config)
    changed, failed, out = play(pve_guest_gpu_use_pci_mappings=False, pve_guest_gpu_containers=[{"vmid": 101}])
    assert (changed, failed) == (0, 1)
    assert "pve_guest_gpu_use_pci_mappings: given false" in out
    assert "pve_guest_gpu_containers: given" in out and "no resource mapping" in out
    assert pve.vm(201).config == before and pve.pci_mappings == {}
