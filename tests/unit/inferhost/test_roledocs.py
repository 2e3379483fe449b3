"""docs/roles is generated from the argument specs and kept current."""

import yaml

from inferhost import roledocs


def test_every_option_of_every_role_is_on_its_page():
    for role in roledocs.roles():
        page = roledocs.render(role)
        spec = yaml.safe_load((roledocs.ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
        for name in spec["argument_specs"]["main"]["options"]:
            assert f"| `{name}` |" in page, f"{role}: {name} missing from its generated page"


def test_markup_becomes_code():
    assert roledocs._text("see C(/etc/nccl.conf) and I(x)") == "see `/etc/nccl.conf` and `x`"


def test_the_committed_pages_are_current():
    assert roledocs.main(["--check"]) == 0, "docs/roles is stale: run `python -m inferhost.roledocs`"
