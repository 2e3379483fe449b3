"""Which changed units restart their service (plugins/filter/inference_units.py)."""

from inference_units import inference_units_to_restart

UNIT = "[Unit]\nDescription=a\nConflicts={conflicts}\n\n[Service]\nExecStart=/opt/{exec}\n"


def result(name, before, after, changed=True):
    return {
        "changed": changed,
        "inference_service_unit": {"name": name},
        "diff": [{"before": before, "after": after, "before_header": "x", "after_header": "x"}],
    }


def test_a_new_conflict_alone_restarts_nothing():
    before = UNIT.format(conflicts="inference-b.service", exec="vllm")
    after = UNIT.format(conflicts="inference-b.service inference-c.service", exec="vllm")
    assert inference_units_to_restart([result("a", before, after)]) == []


def test_the_first_or_last_conflict_with_its_comment_restarts_nothing():
    alone = "[Unit]\nDescription=a\n\n[Service]\nExecStart=/opt/vllm\n"
    paired = alone.replace(
        "Description=a\n", "Description=a\n# Only one owns the GPUs.\nConflicts=inference-b.service\n"
    )
    assert inference_units_to_restart([result("a", alone, paired), result("a", paired, alone)]) == []


def test_any_other_change_restarts():
    before = UNIT.format(conflicts="inference-b.service", exec="vllm")
    after = UNIT.format(conflicts="inference-b.service inference-c.service", exec="sglang")
    assert inference_units_to_restart([result("a", before, after)]) == ["a"]


def test_a_new_unit_or_a_change_without_diff_counts_as_changed():
    assert inference_units_to_restart([{"changed": True, "inference_service_unit": {"name": "n"}}]) == ["n"]
    assert inference_units_to_restart([result("u", "", "x", changed=False)]) == []
