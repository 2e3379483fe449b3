#!/usr/bin/env bash
# Real-GPU layer (run by hand on a machine with an NVIDIA GPU, PyTorch and NCCL; results go to docs/):
# playbooks/validate.yml against this machine's real driver, CUDA and NCCL, with the reference NCCL
# settings of inventory/example applied by the nccl_tuning role, and the stand-in server as the service.
#
#   tests/gpu/validate-local.sh OUTDIR        (VALIDATE_CHECKS=nccl,smoke for a subset)
#
# The service environment is the one python3 belongs to (it has torch); the NCCL hook and files the role
# writes are removed again at the end. Variables named in KEEP_ENV (for example NCCL_NVLS_ENABLE) are
# passed on to the NCCL probe, which otherwise runs with an empty environment.
set -euo pipefail
# shellcheck source=tests/gpu/common.sh
. "$(dirname "$0")/common.sh"
work=$(mktemp -d /tmp/inferhost-validate.XXXXXX)
checks=${VALIDATE_CHECKS:-driver,devices,cuda,nccl,nccl_init,smoke}
port=${STANDIN_PORT:-18000}
key=validate-$RANDOM$RANDOM

# A checkpoint directory with a config.json (the plan module reads it) and the unit's secret file.
mkdir -p "$work/models/Standin-H200" "$work/secrets"
printf '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}\n' \
  >"$work/models/Standin-H200/config.json"
printf 'INFERHOST_API_KEY="%s"\n' "$key" >"$work/secrets/standin.secret.env"

"$py" src/inferhost/sim/engine/openai_standin.py serve "$work/models/Standin-H200" --port "$port" --api-key "$key" \
  --load-delay 1 >"$out/standin.log" 2>&1 &
standin=$!
trap 'kill $standin 2>/dev/null; apply_nccl -e nccl_proof_env="$env_root" -e nccl_tuning_install=false || true; rm -rf "$work"' EXIT

apply_nccl -e nccl_proof_env="$env_root"
"$py" - "$work/vars.json" "$env_root" "$work" "$port" "$checks" <<'PY'
import json, os, sys
import yaml
out, env_root, work, port, checks = sys.argv[1:]
nccl = yaml.safe_load(open("inventory/example/group_vars/inference_guests/nccl_tuning.yml"))["nccl_tuning_settings"]
keep = {name: os.environ[name] for name in os.environ.get("KEEP_ENV", "").split(",") if name in os.environ}
json.dump({
    "validate_hosts": "localhost",
    "validate_checks": checks.split(","),
    "validate_nccl_init_env": keep,
    "inference_service_active": "standin",
    "inference_service_config_dir": f"{work}/secrets",
    "inference_service_services": [{
        "name": "standin", "engine": "vllm", "environment": env_root,
        "model": {"path": f"{work}/models/Standin-H200"}, "gpus": [0], "port": int(port),
    }],
    "nccl_tuning_settings": nccl,
    "ansible_python_interpreter": sys.executable,
}, open(out, "w"), indent=2)
PY
sleep 2
set +e
ansible-playbook -i localhost, -c local playbooks/validate.yml -e "@$work/vars.json" 2>&1 | tee "$out/validate.txt"
rc=${PIPESTATUS[0]}
echo "validate.yml exit status: $rc" | tee -a "$out/validate.txt"
exit "$rc"
