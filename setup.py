"""Declares the compiled core of the token tree; all other metadata lives in pyproject.toml.

`pip install -e .` (or a wheel build) compiles cache_store/csrc/stree_*.c into cache_store._stree
(the path-compressed suffix tree) with the system C compiler and the Python headers; setuptools
needs no extra build dependencies.
"""

import sys

from setuptools import Extension, setup

# -ffp-contract=off: no fused multiply-add, so path scores are bit-identical to Python's floats.
flags = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off"]
threads = [] if sys.platform == "win32" else ["-pthread"]  # the suffix tree's batched calls start threads
sources = [f"cache_store/csrc/stree_{name}.c" for name in ("module", "nodes", "flight", "insert", "draft", "dtree", "merge", "batch", "parallel")]

setup(
    ext_modules=[
        Extension(
            "cache_store._stree",
            sources,
            depends=["cache_store/csrc/stree.h"],
            include_dirs=["cache_store/csrc"],
            extra_compile_args=flags + threads,
            extra_link_args=threads,
        ),
    ]
)
