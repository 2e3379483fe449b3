"""pve_host_gpu's published GPU facts (tasks/facts.yml) run by ansible-playbook on this machine, in tmp_path: the
file ansible_local.inferhost_gpu_facts is read from, the file of the former name taken away, the minors kept."""

import json

import yaml
from localhost import ROOT, run_playbook

FACTS = ROOT / "roles/pve_host_gpu/tasks/facts.yml"
DRIVER = "590.48.01"


def gpu(index, address, minor, driver):
    slot = address.rsplit(".", 1)[0]
    return {
        "index": index,
        "address": address,
        "slot": slot,
        "vendor": "10de",
        "device": "2335",
        "functions": [{"address": address, "class": "0x030200", "driver": driver}],
        "iommu_group": 20 + index,
        "numa_node": 0,
        "minor": minor,
        "driver": driver,
    }


# What pve_host_probe reports now: the second GPU is on vfio-pci (the VM has it), so the driver names no minor.
PROBE = {
    "gpus": [gpu(0, "0000:01:00.0", 0, "nvidia"), gpu(1, "0000:41:00.0", None, "vfio-pci")],
    "modules": {"nvidia": {"version": DRIVER}},
    "iommu_active": True,
}


def publish(tmp_path, earlier=None):
    """Run facts.yml with the fact directory in tmp_path, after the facts an earlier run left under `earlier`
    ({file name: content}); the directory's files and ansible_local as the rest of the run sees it."""
    facts_d = tmp_path / "facts.d"
    facts_d.mkdir()
    for name, content in (earlier or {}).items():
        (facts_d / name).write_text(json.dumps(content))
    seen = tmp_path / "ansible_local.json"
    play = [
        {
            "name": "Publish the GPU facts",
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                "pve_host_gpu_fact_dir": str(facts_d),
                "pve_host_gpu_driver_version": DRIVER,
                "__pve_host_gpu_probe": PROBE,
            },
            "tasks": [
                {"ansible.builtin.setup": {"gather_subset": ["!all", "!min", "local"], "fact_path": str(facts_d)}},
                {"ansible.builtin.include_tasks": str(FACTS)},
                {"ansible.builtin.copy": {"content": "{{ ansible_local | to_json }}", "dest": str(seen)}},
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    done = run_playbook(tmp_path / "play.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    return sorted(p.name for p in facts_d.iterdir() if not p.name.endswith("~")), json.loads(seen.read_text())


def written(tmp_path):
    return json.loads((tmp_path / "facts.d/inferhost_gpu_facts.fact").read_text())


def test_a_fresh_host_publishes_its_gpus_under_the_new_name(tmp_path):
    files, local = publish(tmp_path)
    assert files == ["inferhost_gpu_facts.fact"]
    fact = written(tmp_path)
    assert local == {"inferhost_gpu_facts": fact}
    assert fact["driver_version"] == DRIVER and fact["iommu_active"] is True
    assert [(g["index"], g["address"], g["minor"]) for g in fact["gpus"]] == [
        (0, "0000:01:00.0", 0),
        (1, "0000:41:00.0", None),
    ]
    # Stable while the GPUs move: no bound driver in what is published.
    assert all("driver" not in g and all("driver" not in f for f in g["functions"]) for g in fact["gpus"])


def test_the_file_of_the_former_name_goes_and_its_minors_are_kept(tmp_path):
    earlier = {"gpus": [{"address": "0000:01:00.0", "minor": 0}, {"address": "0000:41:00.0", "minor": 1}]}
    files, local = publish(tmp_path, {"inferhost_gpus.fact": earlier, "site.fact": {"rack": "b2"}})
    # A site's own facts beside them stay.
    assert files == ["inferhost_gpu_facts.fact", "site.fact"]
    assert set(local) == {"inferhost_gpu_facts", "site"}
    # The GPU on vfio-pci keeps the minor the nvidia driver gave it, read from the facts of the former name.
    assert [g["minor"] for g in written(tmp_path)["gpus"]] == [0, 1]


def test_the_new_facts_win_over_the_former_ones(tmp_path):
    stale = {"gpus": [{"address": "0000:41:00.0", "minor": 7}]}
    current = {"gpus": [{"address": "0000:41:00.0", "minor": 1}]}
    files, _ = publish(tmp_path, {"inferhost_gpus.fact": stale, "inferhost_gpu_facts.fact": current})
    assert files == ["inferhost_gpu_facts.fact"]
    assert [g["minor"] for g in written(tmp_path)["gpus"]] == [0, 1]
