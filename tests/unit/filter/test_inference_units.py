"""Which changed units restart their service (plugins/filter/inference_units.py)."""

from inference_units import inference_units_to_restart

UNIT = "[Unit]\nDescription=a\nConflicts={conflicts}\n\n[Service]\nExecStart=/opt/{exec}\n"
DIR = "/etc/systemd/system"
SERVICES = [{"name": "a", "unit": "inference-a.service"}, {"name": "b", "unit": "inference-b.service"}]


def path(name):
    return f"{DIR}/inference-{name}.service"


def result(*changes, diff=True):
    """A config_files result: each change is (service name, before text, after text)."""
    out = {"changed": bool(changes), "changed_paths": [path(name) for name, _, _ in changes]}
    if diff:
        out["diff"] = [
            {"before": before, "after": after, "before_header": path(name), "after_header": path(name)}
            for name, before, after in changes
        ]
    return out


def restart(res):
    return inference_units_to_restart(res, SERVICES, DIR)


def test_a_new_conflict_alone_restarts_nothing():
    before = UNIT.format(conflicts="inference-b.service", exec="vllm")
    after = UNIT.format(conflicts="inference-b.service inference-c.service", exec="vllm")
    assert restart(result(("a", before, after))) == []


def test_the_first_or_last_conflict_with_its_comment_restarts_nothing():
    alone = "[Unit]\nDescription=a\n\n[Service]\nExecStart=/opt/vllm\n"
    paired = alone.replace(
        "Description=a\n", "Description=a\n# Only one owns the GPUs.\nConflicts=inference-b.service\n"
    )
    assert restart(result(("a", alone, paired), ("b", paired, alone))) == []


def test_any_other_change_restarts_only_that_service():
    before = UNIT.format(conflicts="inference-b.service", exec="vllm")
    after = UNIT.format(conflicts="inference-b.service inference-c.service", exec="sglang")
    assert restart(result(("a", before, after), ("b", before, before.replace("a\n", "a\n", 1)))) == ["a"]


def test_a_change_without_a_text_diff_counts_as_changed():
    assert restart(result(("b", "", "x"), diff=False)) == ["b"]
    mode_only = {
        "changed": True,
        "changed_paths": [path("a")],
        "diff": [{"before": {"path": path("a"), "mode": "0600"}, "after": {"path": path("a"), "mode": "0644"}}],
    }
    assert restart(mode_only) == ["a"]


def test_nothing_changed_or_skipped_restarts_nothing():
    assert restart(result()) == []
    assert restart({"changed": False, "skipped": True}) == []
    assert inference_units_to_restart(None, SERVICES, DIR + "/") == []
