"""make test's closing verdict (scripts/run-tests.sh), with a stand-in pytest that prints what each stream would."""

import shutil
import subprocess

import pytest
from inference_refdata import ROOT

CONTAINERS = ("static", "unit", "api", "engines", "molecule")
MACHINES = ("kernel", "lab")


def summary(counts, closing):
    """pytest's tail as tests/conftest.py writes it: one line per layer that reported, then the closing line."""
    lines = ["============================= time per test layer =============================="]
    for layer, passed, skipped in counts:
        lines.append(f"{layer:<10} {passed:>5} passed   0 failed {skipped:>3} skipped       1.0 s")
    return "\n".join([*lines, f"======================== {closing} ========================"]) + "\n"


def all_passed(layers):
    return summary([(layer, 3, 0) for layer in layers], f"{3 * len(layers)} passed in 1.00s")


@pytest.fixture
def run(tmp_path):
    """run(containers_out, machines_out, containers_rc=0, machines_rc=0) -> (exit status, last line)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts/run-tests.sh", tmp_path / "scripts/run-tests.sh")
    (tmp_path / ".venv/bin").mkdir(parents=True)
    stand_in = tmp_path / ".venv/bin/pytest"
    # The machines stream starts with tests/kernel, the containers stream with tests/static.
    stand_in.write_text(
        '#!/bin/sh\nstream=containers; [ "$1" = tests/kernel ] && stream=machines\n'
        'cat "$(dirname "$0")/$stream.out"; exit "$(cat "$(dirname "$0")/$stream.rc")"\n'
    )
    stand_in.chmod(0o755)

    def go(containers_out, machines_out, containers_rc=0, machines_rc=0):
        for stream, out, rc in (("containers", containers_out, containers_rc), ("machines", machines_out, machines_rc)):
            (tmp_path / f".venv/bin/{stream}.out").write_text(out)
            (tmp_path / f".venv/bin/{stream}.rc").write_text(str(rc))
        done = subprocess.run(
            ["bash", str(tmp_path / "scripts/run-tests.sh")], capture_output=True, text=True, timeout=60, check=False
        )
        return done.returncode, done.stdout.rstrip().splitlines()[-3:]

    return go


def test_every_layer_passing_is_passed(run):
    rc, tail = run(all_passed(CONTAINERS), all_passed(MACHINES))
    assert rc == 0, tail
    assert tail[-1] == "make test: PASSED, every layer"


def test_a_layer_of_skips_alone_fails_the_run(run):
    counts = [("static", 2, 0), ("unit", 37, 0), ("api", 3, 0), ("engines", 3, 0), ("molecule", 0, 5)]
    rc, tail = run(summary(counts, "45 passed, 5 skipped in 9.00s"), all_passed(MACHINES))
    assert rc == 5
    assert tail == [
        "make test: static, unit, API contract, real engines, molecule: 45 passed, 5 skipped in 9.00s; "
        "ran no test: molecule",
        "make test: real kernel, lab: 6 passed in 1.00s",
        "make test: FAILED",
    ]


def test_a_stream_of_skips_or_deselections_alone_fails_the_run(run):
    machines = summary([(layer, 0, 2) for layer in MACHINES], "4 skipped in 0.50s")
    rc, tail = run(all_passed(CONTAINERS), machines)
    assert rc == 5
    assert tail[-2:] == [
        "make test: real kernel, lab: 4 skipped in 0.50s; ran no test: kernel lab",
        "make test: FAILED",
    ]
    # Every test deselected: pytest reports no layer at all and exits 5.
    rc, tail = run(all_passed(CONTAINERS), "===== 40 deselected in 0.20s =====\n", machines_rc=5)
    assert rc == 5
    assert tail[-2:] == [
        "make test: real kernel, lab: pytest collected no tests; ran no test: kernel lab",
        "make test: FAILED",
    ]


def test_a_failing_stream_keeps_its_exit_status(run):
    containers = summary([(layer, 3, 0) for layer in CONTAINERS], "1 failed, 9 passed in 2.00s")
    rc, tail = run(containers, "", containers_rc=1)
    assert rc == 1 and tail[-1] == "make test: FAILED"
