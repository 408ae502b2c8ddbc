"""Build geode's native runtime, the C extension ``geode.runtime.native._ext``.

Project metadata lives in pyproject.toml; this file only declares the extension, so
``pip install -e .`` and ``python setup.py build_ext --inplace`` both build it.
"""

import numpy
from setuptools import Extension, setup

NATIVE = "geode/runtime/native"

setup(
    ext_modules=[
        Extension(
            "geode.runtime.native._ext",
            sources=[
                f"{NATIVE}/module.c",
                f"{NATIVE}/call.c",
                f"{NATIVE}/indices.c",
                f"{NATIVE}/pool.c",
                f"{NATIVE}/blas_threads.c",
                f"{NATIVE}/scratch.c",
                f"{NATIVE}/gemm.c",
                f"{NATIVE}/sgemm_thin.c",
                f"{NATIVE}/sgemm_packed.c",
                f"{NATIVE}/winograd.c",
            ],
            include_dirs=[numpy.get_include()],  # the trampoline reads numpy arrays directly
            depends=[f"{NATIVE}/pool.h", f"{NATIVE}/call.h", f"{NATIVE}/winograd_body.h"],
            extra_compile_args=["-O2", "-pthread", "-std=gnu11", "-fvisibility=hidden"],
            extra_link_args=["-pthread"],
        )
    ]
)
