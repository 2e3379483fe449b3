# Pure Python shared by the inference_service modules, filters and scripts: no Ansible imports here,
# so the same code runs in modules (shipped by Ansiballz), on the controller and under pytest.
