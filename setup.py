"""Declares the compiled core of the token tree; all other metadata lives in pyproject.toml.

`pip install -e .` (or a wheel build) compiles cache_store/_trie.c with the system C compiler and
the Python headers; setuptools needs no extra build dependencies for it.
"""

import sys

from setuptools import Extension, setup

# -ffp-contract=off: no fused multiply-add, so path scores are bit-identical to Python's floats.
flags = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off"]

setup(ext_modules=[Extension("cache_store._trie", ["cache_store/_trie.c"], extra_compile_args=flags)])
