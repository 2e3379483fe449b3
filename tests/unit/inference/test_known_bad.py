"""The known-bad matrix as the inference code's data (module_utils/inference/known_bad.py), read through one loader."""

import pytest
from inference import known_bad, plan


def test_every_built_in_rule_has_its_fields_and_a_unique_id():
    rules = known_bad.rules()
    assert len(rules) == len(known_bad.RULES) > 10
    assert len({r["id"] for r in rules}) == len(rules)
    for rule in rules:
        assert all(rule.get(name) for name in known_bad.FIELDS), rule["id"]
        assert rule.get("when"), rule["id"]


def test_a_site_rule_comes_after_the_built_in_ones_and_is_applied():
    site = {
        "id": "site-no-eager",
        "engine": "vllm",
        "when": [{"flag": "enforce-eager", "present": True}],
        "reason": "this site measured eager mode slower",
        "fix": "remove enforce-eager from args",
        "source": "site benchmark",
    }
    rules = known_bad.rules([site])
    assert rules[-1] == site and rules[:-1] == known_bad.rules()
    service = {"name": "a", "engine": "vllm", "model": {"path": "/m"}, "gpus": [0], "args": {"enforce-eager": True}}
    refused = plan.check_known_bad(service, rules, "12.0", None)[0]
    assert [r["id"] for r in refused] == ["site-no-eager"]


def test_the_loader_hands_out_copies():
    known_bad.rules()[0]["id"] = "changed"
    assert known_bad.rules()[0]["id"] != "changed"


@pytest.mark.parametrize("rule", [{"id": "x"}, "not a rule", {"id": "x", "reason": "r", "fix": "f", "source": ""}])
def test_a_malformed_site_rule_is_refused_naming_the_variable(rule):
    needs = r"inference_service_known_bad_extra\[0\]: a rule needs id, reason, fix, source"
    with pytest.raises(ValueError, match=needs):
        known_bad.rules([rule])
