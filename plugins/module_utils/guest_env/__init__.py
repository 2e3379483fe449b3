# Pure Python shared by the guest-environment modules (python_env, source_build): no Ansible imports
# here, so the same code runs in modules (shipped by Ansiballz), on the controller and under pytest.
