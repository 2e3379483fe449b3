"""Reference data of the inference tests: checkpoint config excerpts and the example inventory's services."""

import contextlib
import importlib.util
import io
import json
import shutil
from pathlib import Path

import ansible.module_utils
import pytest
import yaml
from ansible.module_utils.testing import patch_module_args

ROOT = Path(__file__).resolve().parents[3]
MODELS = Path(__file__).with_name("fixtures") / "models"
EXAMPLE_VARS = ROOT / "inventory/example/group_vars/inference_containers/inference_service.yml"
ROLE = ROOT / "roles/inference_service"

# Inventory service name -> checkpoint directory under fixtures/models.
REFERENCE = {
    "qwen35": "Qwen3.5-397B-A17B-NVFP4",
    "kimi-k25": "Kimi-K2.5",
    "minimax-m25": "MiniMax-M2.5",
}


def load_config(model):
    return json.loads((MODELS / model / "config.json").read_text())


@pytest.fixture(scope="session")
def example_vars():
    return yaml.safe_load(EXAMPLE_VARS.read_text())


@pytest.fixture(scope="session")
def hardware(example_vars):
    return example_vars["inference_service_hardware"]


@pytest.fixture(scope="session")
def services(example_vars):
    return {s["name"]: s for s in example_vars["inference_service_services"]}


@pytest.fixture
def checkpoint(tmp_path):
    """Copy a reference checkpoint into a temporary directory, so a test may edit it."""

    def make(model):
        target = tmp_path / model
        shutil.copytree(MODELS / model, target)
        return target

    return make


def load_module(name):
    """Import one of our Ansible modules, with plugins/module_utils reachable as ansible.module_utils."""
    utils = str(ROOT / "plugins/module_utils")
    if utils not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(utils)
    spec = importlib.util.spec_from_file_location(f"inferhost_{name}", ROOT / "plugins/modules" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_module(module, args):
    """Run a module's main() with args; return its JSON result (failed results included)."""
    out = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        module.main()
    return json.loads(out.getvalue())
