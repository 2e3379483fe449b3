#!/usr/bin/env bash
# Real-GPU layer (run by hand on a machine with NVIDIA GPUs, PyTorch and NCCL; results go to docs/):
# prove that the NCCL settings the stack writes reach NCCL, and measure all-reduce with and without them.
#
#   tests/gpu/nccl-proof.sh OUTDIR
#
# Runs, in order, with NCCL_DEBUG=INFO:
#   baseline   nothing of the stack applied
#   conf-file  /etc/nccl.conf only (the process environment has no NCCL_* set)
#   stack      /etc/nccl.conf + the .pth hook in the Python environment
#   validate   playbooks/validate.yml (driver, device nodes, CUDA init, NCCL settings in the environment)
#   override   the stack, with NCCL_PROTO=Simple set by the user (the user's value must win)
# then removes everything the role placed (nccl_tuning_install=false).
set -euo pipefail
# shellcheck source=tests/gpu/common.sh
. "$(dirname "$0")/common.sh"
venv=$env_root
[ "$venv" != "$("$py" -c 'import sys; print(sys.base_prefix)')" ] || { echo "python3 is not in a venv" >&2; exit 2; }
[ -z "${NCCL_PROTO:-}${NCCL_ALGO:-}${NCCL_P2P_LEVEL:-}" ] || { echo "unset NCCL_PROTO/ALGO/P2P_LEVEL first" >&2; exit 2; }

bench() {
  local label=$1; shift
  echo "== $label"
  # benchmark.yml's all-reduce program, timing back-to-back calls from 1 KiB to 1 GiB for the bandwidth.
  env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV "$@" "$py" playbooks/files/allreduce-latency.py --label "$label" \
      --method eager --dtype float32 --iters 20 --warmup 3 --sizes $(for k in $(seq 10 2 30); do echo $((1 << k)); done) \
      --json "$out/$label.json" >"$out/$label.log" 2>&1 || { tail -n 40 "$out/$label.log"; return 1; }
  grep -E "^$label allreduce-latency:" "$out/$label.log"
  grep -hoE "NCCL_(PROTO|ALGO|P2P_LEVEL) set by environment to [A-Za-z]+" "$out/$label.log" | sort | uniq -c || true
}

apply_nccl -e nccl_tuning_install=false -e nccl_proof_env="$venv"
bench baseline
apply_nccl -e nccl_proof_env=
echo "-- /etc/nccl.conf:"; grep -v '^#' /etc/nccl.conf | grep .
bench conf-file
apply_nccl -e nccl_proof_env="$venv"
echo "-- hook: $(ls "$("$py" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"/*nccl*.pth)"
bench stack
echo "== validate.yml (driver, devices, cuda, nccl) in the environment $venv"
ansible-playbook -i localhost, -c local -e ansible_python_interpreter="$py" -e validate_hosts=localhost \
  -e '{"validate_checks": ["driver", "devices", "cuda", "nccl"]}' -e validate_environment="$venv" \
  -e @inventory/example/group_vars/inference_guests/nccl_tuning.yml playbooks/validate.yml >"$out/validate.log" 2>&1 \
  || { tail -n 60 "$out/validate.log"; echo "validate.yml failed"; }
grep -E '"msg"|^localhost|failed=' "$out/validate.log" || true
bench override NCCL_PROTO=Simple
apply_nccl -e nccl_proof_env="$venv" >/dev/null
echo "-- second apply: $(grep -oE 'changed=[0-9]+' "$out/nccl-apply.log" | tail -n1)"
apply_nccl -e nccl_tuning_install=false -e nccl_proof_env="$venv"
test ! -e /etc/nccl.conf && echo "-- removed: /etc/nccl.conf and the hook"
