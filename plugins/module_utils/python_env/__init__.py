# Pure Python of the python_env role's modules (venv_audit, venv_abi_guard): the pins of an environment's spec
# and the RECORD audit. No Ansible imports here, so the same code runs in modules (shipped by Ansiballz), on the
# controller and under pytest. source_build's plan and inference_service's plan read installed versions with it.
