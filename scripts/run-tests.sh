#!/usr/bin/env bash
# make test: every test layer, in two streams that share no machine names or ports, so the whole run takes
# about as long as the longer stream instead of the sum:
#   containers  static, unit, API contract, real engines, molecule  (fakepve on ports the system picks; vLLM
#               and SGLang from PyPI in .cache/engines; podman machines named after each scenario)
#   machines    real kernel (QEMU), local lab  (QEMU on free ports; podman machines inferhost-*, the lab's
#               fakepve on 8006)
# The layers that need no machine of their own (static, unit, the API contract, the engines' parsers) sit in
# the first stream to even out the two: the lab serves with the real vLLM, and its second host added about
# nine minutes (measured on a clean clone: 25.7 min and 36.2 min before the API layer moved).
# The second stream's output is kept in .cache/test-logs/machines.log and printed when both are done.
# Each stream lists its 15 slowest tests, where the time goes. Extra arguments go to both pytest runs (for
# example -x). Exit status: the first stream's failure wins; a layer that passed no test (all skipped or
# deselected) fails the run too, with 5.
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=.venv/bin/pytest
logs=.cache/test-logs
mkdir -p "$logs"

"$pytest" tests/kernel tests/lab --durations=15 "$@" >"$logs/machines.log" 2>&1 &
machines=$!
trap 'kill "$machines" 2>/dev/null' INT TERM

echo "make test: real kernel and lab layers run alongside; their log: $logs/machines.log"
"$pytest" tests/static tests/unit tests/api tests/engines tests/molecule --durations=15 "$@" 2>&1 | tee "$logs/containers.log"
rc_containers=${PIPESTATUS[0]}
wait "$machines"
rc_machines=$?

echo
echo "================ real kernel and lab layers ($logs/machines.log) ================"
cat "$logs/machines.log"

idle_layers() {  # log layer...: the layers that passed no test, by the "time per test layer" lines (tests/conftest.py)
  local log=$1 layer idle=()
  shift
  for layer in "$@"; do
    # A layer whose tests were all skipped or deselected has no such line with a passed test: pytest exits 0
    # on skips alone, so its exit status cannot tell.
    grep -Eq "^$layer +[1-9][0-9]* passed " "$log" || idle+=("$layer")
  done
  echo "${idle[*]}"
}
verdict() {  # name rc log idle: pytest's closing line, or why there is none, and the layers that ran no test
  local line
  line=$(grep -E '(passed|failed|error|skipped|deselected|no tests ran).* in [0-9.]+s' "$3" | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')
  [ "$2" != 5 ] || line="pytest collected no tests"
  echo "$1: ${line:-no summary (rc $2)}${4:+; ran no test: $4}"
}
idle_containers=$(idle_layers "$logs/containers.log" static unit api engines molecule)
idle_machines=$(idle_layers "$logs/machines.log" kernel lab)
echo
echo "make test: $(verdict 'static, unit, API contract, real engines, molecule' "$rc_containers" "$logs/containers.log" "$idle_containers")"
echo "make test: $(verdict 'real kernel, lab' "$rc_machines" "$logs/machines.log" "$idle_machines")"
if [ "$rc_containers" = 0 ] && [ "$rc_machines" = 0 ] && [ -z "$idle_containers$idle_machines" ]; then
  echo "make test: PASSED, every layer"
  exit 0
fi
echo "make test: FAILED"
[ "$rc_containers" != 0 ] && exit "$rc_containers"
[ "$rc_machines" != 0 ] && exit "$rc_machines"
exit 5  # pytest's status for no test run: a layer that tests nothing is a broken suite
