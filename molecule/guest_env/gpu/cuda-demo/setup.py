"""A tiny CUDA extension built the way flash-attn is: torch's CUDAExtension, nvcc, MAX_JOBS, NVCC_THREADS."""

import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

ARCHS = [a for a in os.environ.get("DEMO_CUDA_ARCHS", "90").split(";") if a]
NVCC = ["-O2", f"--threads={os.environ.get('NVCC_THREADS', '1')}"]
NVCC += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]

setup(
    name="inferhost-cuda-demo",
    version="1.0",
    packages=["cuda_demo"],
    ext_modules=[
        CUDAExtension(
            "cuda_demo._ops",
            ["csrc/ops.cpp", "csrc/kernel.cu"],
            extra_compile_args={"cxx": ["-O2"], "nvcc": NVCC},
            define_macros=[("DEMO_ARCHS", '"' + ";".join(ARCHS) + '"')],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
