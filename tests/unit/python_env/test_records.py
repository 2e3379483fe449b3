"""The RECORD audit finds every file that differs from what its wheel installed."""

import hashlib
import json
import os

import pytest
from module_runner import load_module, run_module
from python_env.records import audit, fingerprint, parse_record, record_hash
from python_env_testlib import install


def kinds(result, key="drift"):
    return sorted((item["path"], item["kind"]) for item in result[key])


def test_a_clean_environment_has_no_drift(venv):
    root, site = venv
    result = audit(str(site), str(root))
    assert result["drift"] == [] and result["expected"] == []
    assert result["packages"] == 2


def test_a_file_edited_after_install_is_drift(venv):
    # Lesson 1: debug instrumentation left in an installed model file.
    root, site = venv
    model = site / "vllm/model_executor/models/deepseek_v2.py"
    model.write_text("def forward(x):\n    torch.save(x, '/tmp/x.pt')\n    return x\n")
    result = audit(str(site), str(root))
    assert kinds(result) == [("lib/python3.12/site-packages/vllm/model_executor/models/deepseek_v2.py", "modified")]
    assert result["drift"][0]["package"] == "vllm"


def test_same_size_edit_is_found_by_hash(venv):
    root, site = venv
    init = site / "vllm/__init__.py"
    init.write_bytes(init.read_bytes().replace(b"0.11.0", b"0.11.9"))
    result = audit(str(site), str(root))
    assert [d["detail"] for d in result["drift"]] == ["sha256 differs from RECORD"]


def test_missing_and_unrecorded_files(venv):
    root, site = venv
    (site / "torch/__init__.py").unlink()
    (site / "vllm/hotfix.py").write_text("x = 1\n")
    result = audit(str(site), str(root))
    assert kinds(result) == [
        ("lib/python3.12/site-packages/torch/__init__.py", "missing"),
        ("lib/python3.12/site-packages/vllm/hotfix.py", "unrecorded"),
    ]


def test_console_scripts_outside_site_packages_are_checked(venv):
    root, site = venv
    (root / "bin/vllm").write_text("#!/bin/sh\necho hijacked\n")
    assert kinds(audit(str(site), str(root))) == [("bin/vllm", "modified")]


def test_declared_changes_are_expected_not_drift(venv):
    root, site = venv
    (site / "00-inferhost-nccl.pth").write_text("import os\n")
    result = audit(str(site), str(root), expected=[{"path": "*-inferhost-*.pth", "reason": "nccl_tuning hook"}])
    assert result["drift"] == []
    assert [(e["path"], e["reason"]) for e in result["expected"]] == [
        ("lib/python3.12/site-packages/00-inferhost-nccl.pth", "nccl_tuning hook")
    ]


def test_a_declared_hash_must_match(venv):
    root, site = venv
    model = site / "vllm/model_executor/models/deepseek_v2.py"
    model.write_text("patched by the stack\n")
    declared = {"path": "vllm/model_executor/models/deepseek_v2.py", "sha256": "0" * 64, "reason": "fix"}
    result = audit(str(site), str(root), expected=[declared])
    assert kinds(result) == [("lib/python3.12/site-packages/vllm/model_executor/models/deepseek_v2.py", "modified")]
    assert "declared with sha256 000000000000" in result["drift"][0]["detail"]


def test_the_stack_manifest_marks_its_own_patches(venv):
    root, site = venv
    model = site / "vllm/model_executor/models/deepseek_v2.py"
    model.write_text("patched by the stack\n")
    (root / ".inferhost").mkdir()
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    entry = {"path": "vllm/model_executor/models/deepseek_v2.py", "sha256": digest, "reason": "patch mla-fix"}
    (root / ".inferhost/patched.json").write_text(json.dumps({"files": [entry]}))
    result = audit(str(site), str(root))
    assert result["drift"] == [] and result["expected"][0]["reason"] == "patch mla-fix"
    # The same edit, changed again by hand afterwards: drift again.
    model.write_text("patched by the stack, then edited\n")
    assert kinds(audit(str(site), str(root))) != []


def test_venv_helpers_and_byte_code_are_not_reported(venv):
    root, site = venv
    cache = site / "vllm/__pycache__"
    cache.mkdir()
    (cache / "__init__.cpython-312.pyc").write_bytes(b"\0")
    (site / "stray.pyc").write_bytes(b"\0")
    assert audit(str(site), str(root))["drift"] == []


def test_mtime_mode_skips_hashing_files_untouched_since_install(venv):
    root, site = venv
    init = site / "vllm/__init__.py"
    init.write_bytes(init.read_bytes().replace(b"0.11.0", b"0.11.9"))
    record = next(site.glob("vllm-*.dist-info")) / "RECORD"
    os.utime(init, (0, 0))  # an edit that forged an old mtime goes unseen in the quick mode...
    assert audit(str(site), str(root), hash_mode="mtime")["drift"] == []
    assert kinds(audit(str(site), str(root)))  # ...and is found by the full one
    os.utime(init, (record.stat().st_mtime + 10,) * 2)
    assert kinds(audit(str(site), str(root), hash_mode="mtime"))


def test_record_rows_and_hash_notation(tmp_path):
    rows = parse_record('a.py,sha256=abc,12\n"we,ird.py",sha256=def,3\nx.dist-info/RECORD,,\n')
    assert rows == [
        ("a.py", "sha256", "abc", 12),
        ("we,ird.py", "sha256", "def", 3),
        ("x.dist-info/RECORD", None, None, None),
    ]
    f = tmp_path / "f"
    f.write_bytes(b"")
    assert record_hash(str(f)) == "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"


def test_a_broken_manifest_is_an_error_not_silence(venv):
    root, site = venv
    (root / ".inferhost").mkdir()
    (root / ".inferhost/patched.json").write_text("{not json")
    with pytest.raises(ValueError, match="patched.json"):
        audit(str(site), str(root))


def test_fingerprint_tells_builds_of_one_version_apart(tmp_path):
    # PyPI's torch 2.11.0 is a CUDA 13.0 build with no +cu130 label: the version alone cannot key a build.
    a, b = tmp_path / "a", tmp_path / "b"
    install(a, "torch", "2.11.0", {"torch/lib/libtorch_cuda.so": b"cu130 build"})
    install(b, "torch", "2.11.0", {"torch/lib/libtorch_cuda.so": b"cu128 build"})
    fa, fb = fingerprint(str(a), "torch"), fingerprint(str(b), "torch")
    assert fa[0] == fb[0] == "2.11.0" and fa[1] != fb[1]


def test_fingerprint_ignores_how_the_package_was_installed(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    install(a, "torch", "2.11.0", {"torch/__init__.py": b"x"})
    dist = install(b, "torch", "2.11.0", {"torch/__init__.py": b"x"})
    (dist / "REQUESTED").write_text("")
    record = dist / "RECORD"
    record.write_text(
        record.read_text() + f"{dist.name}/REQUESTED,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n"
    )
    assert fingerprint(str(a), "Torch") == fingerprint(str(b), "torch")
    assert fingerprint(str(a), "vllm") is None
    assert fingerprint(str(tmp_path / "none"), "torch") is None


@pytest.mark.parametrize("module", ["venv_audit", "venv_abi_guard"])
def test_the_environment_modules_refuse_a_directory_that_is_none(module, tmp_path):
    result = run_module(load_module(module), {"path": str(tmp_path)})
    assert result["failed"]
    assert result["msg"] == f"{tmp_path} is not a virtual environment: no lib/python*/site-packages in it"


def test_the_environment_modules_read_the_environment_they_are_given(venv):
    root, _ = venv
    audited = run_module(load_module("venv_audit"), {"path": str(root)})
    assert not audited.get("failed") and audited["drift"] == [] and audited["packages"] == 2
    pins = {"path": str(root), "requirements": ["torch==2.10.0.dev20251215"]}
    guarded = run_module(load_module("venv_abi_guard"), pins)
    assert not guarded.get("failed") and guarded["installed"] == {"torch": "2.10.0.dev20251215+cu130"}
