"""A patch set applies once, is recognised as applied, is re-applied when it changes, and fails by name
when the upstream lines it expects have moved."""

import os
import subprocess

import pytest
from source_build.patchset import PatchError, Repo, created_paths, reconcile, touched_paths
from source_build_testlib import git

FA3_OFF = {
    "name": "fa3-off",
    "diff": """--- a/sgl-kernel/CMakeLists.txt
+++ b/sgl-kernel/CMakeLists.txt
@@ -1,4 +1,4 @@
 if ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "12.4")
-    set(SGL_KERNEL_ENABLE_FA3 ON)
+    # set(SGL_KERNEL_ENABLE_FA3 ON)
     list(APPEND SGL_KERNEL_CUDA_FLAGS
         "-gencode=arch=compute_90a,code=sm_90a"
""",
}

# An empty line stands for a blank context line (YAML editors strip the trailing space git writes).
FA3_IMPORT = {
    "name": "fa3-import-optional",
    "diff": """--- a/sgl-kernel/flash_attn.py
+++ b/sgl-kernel/flash_attn.py
@@ -1,7 +1,8 @@
 import torch

 try:
     from sgl_kernel import flash_ops
 except:
-    raise ImportError(
+    flash_ops = None
+    _fa3_import_error = ImportError(
         "Can not import FA3 in sgl_kernel. Please check your installation."
     )
""",
}

NEW_FILE = {
    "name": "add-note",
    "diff": """--- /dev/null
+++ b/sgl-kernel/NOTE
@@ -0,0 +1 @@
+built by inferhost
""",
}


def run(argv, cwd, env, data):
    env = {**os.environ, **(env or {})}
    proc = subprocess.run(argv, cwd=cwd, env=env, input=data, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def repo(path):
    return Repo(str(path), run)


def test_first_run_applies_second_run_changes_nothing(source):
    first = reconcile(repo(source), [FA3_OFF, FA3_IMPORT])
    assert first["changed"] and first["state"] == "applied"
    assert "# set(SGL_KERNEL_ENABLE_FA3 ON)" in (source / "sgl-kernel/CMakeLists.txt").read_text()
    assert "flash_ops = None" in (source / "sgl-kernel/flash_attn.py").read_text()
    second = reconcile(repo(source), [FA3_OFF, FA3_IMPORT])
    assert not second["changed"] and second["state"] == "applied"


def test_check_mode_reports_and_touches_nothing(source):
    result = reconcile(repo(source), [FA3_OFF], check_mode=True)
    assert result["changed"] and result["state"] == "would-apply"
    assert git(source, "status", "--porcelain") == ""


def test_a_changed_patch_set_restores_then_reapplies(source):
    reconcile(repo(source), [FA3_OFF, FA3_IMPORT])
    result = reconcile(repo(source), [FA3_OFF])
    assert result["changed"] and result["reverted"] == ["sgl-kernel/CMakeLists.txt", "sgl-kernel/flash_attn.py"]
    assert "raise ImportError" in (source / "sgl-kernel/flash_attn.py").read_text()
    assert git(source, "status", "--porcelain").split() == ["M", "sgl-kernel/CMakeLists.txt"]


def test_a_hand_edit_is_reverted_and_reported(source):
    reconcile(repo(source), [FA3_OFF])
    readme = source / "sgl-kernel/flash_attn.py"
    readme.write_text(readme.read_text() + "print('debug')\n")
    result = reconcile(repo(source), [FA3_OFF])
    assert result["changed"] and result["unexpected"] == ["sgl-kernel/flash_attn.py"]
    assert "debug" not in readme.read_text()


def test_removing_every_patch_restores_the_pristine_tree(source):
    reconcile(repo(source), [FA3_OFF, NEW_FILE])
    assert (source / "sgl-kernel/NOTE").exists()
    result = reconcile(repo(source), [])
    assert result["changed"]
    assert git(source, "status", "--porcelain") == "?? sgl-kernel/NOTE\n" or not (source / "sgl-kernel/NOTE").exists()
    assert "set(SGL_KERNEL_ENABLE_FA3 ON)\n" in (source / "sgl-kernel/CMakeLists.txt").read_text()
    assert not reconcile(repo(source), [])["changed"]


def test_created_files_count_as_applied(source):
    assert reconcile(repo(source), [NEW_FILE])["changed"]
    assert not reconcile(repo(source), [NEW_FILE])["changed"]


def test_upstream_moved_fails_with_the_patch_name_and_the_file(source):
    cmake = source / "sgl-kernel/CMakeLists.txt"
    cmake.write_text(cmake.read_text().replace("set(SGL_KERNEL_ENABLE_FA3 ON)", "set(SGL_KERNEL_ENABLE_FA3 ${FA3})"))
    git(source, "commit", "-qam", "upstream moved")
    with pytest.raises(PatchError) as err:
        reconcile(repo(source), [FA3_OFF])
    message = str(err.value)
    assert "'fa3-off' does not apply" in message and "sgl-kernel/CMakeLists.txt" in message
    assert "upstream lines it expects have moved" in message
    assert git(source, "status", "--porcelain") == ""


def test_paths_of_a_diff():
    assert touched_paths(FA3_OFF["diff"]) == ["sgl-kernel/CMakeLists.txt"]
    assert created_paths(NEW_FILE["diff"]) == ["sgl-kernel/NOTE"]
    assert touched_paths(FA3_OFF["diff"], strip=2) == ["CMakeLists.txt"]


def test_a_same_size_change_of_the_patch_set_within_one_second_is_seen(source):
    # 40 -> 42 keeps the file's size, and both runs land in the same second: no stat cache may hide it.
    def answer(n):
        return {
            "name": f"answer-{n}",
            "diff": f"""--- a/sgl-kernel/CMakeLists.txt
+++ b/sgl-kernel/CMakeLists.txt
@@ -1,3 +1,3 @@
 if ("${{CUDA_VERSION}}" VERSION_GREATER_EQUAL "12.4")
-    set(SGL_KERNEL_ENABLE_FA3 ON)
+    set(SGL_KERNEL_ENABLE_FA3 O{n})
     list(APPEND SGL_KERNEL_CUDA_FLAGS
""",
        }

    for n in (40, 42, 40, 42):
        assert reconcile(repo(source), [answer(n)])["state"] == "applied"
        assert f"O{n})" in (source / "sgl-kernel/CMakeLists.txt").read_text()
        assert not reconcile(repo(source), [answer(n)])["changed"]
