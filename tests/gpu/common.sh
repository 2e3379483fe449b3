# Sourced by the real-GPU scripts of this folder with their arguments ("$@"): makes OUTDIR ($out), works from the
# repository's root, configures Ansible, and names python3 ($py) and the environment it belongs to ($env_root).
# apply_nccl ARGS... applies the nccl_tuning role to this machine (tests/gpu/apply_nccl_tuning.yml), its output
# appended to $out/nccl-apply.log.
out=${1:?usage: $0 OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
export ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_LOCAL_TEMP=/tmp/ansible-local ANSIBLE_NOCOLOR=1
py=$(command -v python3)
env_root=$("$py" -c 'import sys; print(sys.prefix)')

apply_nccl() {
  ansible-playbook -i localhost, -c local -e ansible_python_interpreter="$py" tests/gpu/apply_nccl_tuning.yml "$@" \
    >>"$out/nccl-apply.log" 2>&1
}
