"""Build the extension, recording the build environment it saw (as flash-attn's MAX_JOBS, NVCC_THREADS)."""

import json
import os
import pathlib

from setuptools import Extension, setup

SEEN = ("MAX_JOBS", "NVCC_THREADS", "CMAKE_BUILD_PARALLEL_LEVEL", "CUDA_HOME", "CC", "DEMO_FLAG")
here = pathlib.Path(__file__).parent
build = {name: os.environ.get(name) for name in SEEN}
(here / "demo_ext" / "_buildinfo.py").write_text(f"BUILD = {json.dumps(build, sort_keys=True)!r}\n")
print("demo-ext build environment:", json.dumps(build, sort_keys=True))

setup(ext_modules=[Extension("demo_ext._native", sources=["src/native.c"])])
