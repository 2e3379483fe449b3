# Pure Python shared by the inference_service modules, filters and scripts: no Ansible imports here,
# so the same code runs in modules (shipped by Ansiballz), on the controller and under pytest.
# guard.py is the GPU guard, run in the guest from the library directory the role installs, beside
# client.py and gpu_switch/holders.py (which it imports by its top-level name): never in a module.
