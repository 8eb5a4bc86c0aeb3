"""Drafters: one proposer per module behind one interface (`base.Drafter`), chosen with
`srt rollout --draft`.

    none    no drafts: plain (batched) sampling                        (none.py)
    ngram   prompt lookup over the prompt and the sequence's output      (ngram.py)
    suffix  SuffixDecoding: a global tree of past outputs + the prompt's (suffix.py)
    srt     each prompt's suffix tree over its stored rollouts, fed on the fly (srt.py)
"""

from __future__ import annotations

from typing import Any

from srtcli.rollout.drafters.base import Drafter

DRAFTERS = ("srt", "ngram", "suffix", "none")


def make_drafter(name: str, **kw: Any) -> Drafter:
    """Build a drafter by name; `kw` goes to the srt drafter (`SrtDrafter`: cache, min_prob, mode, ...)."""
    if name == "none":
        from srtcli.rollout.drafters.none import NoDrafter

        return NoDrafter()
    if name == "ngram":
        from srtcli.rollout.drafters.ngram import NgramDrafter

        return NgramDrafter()
    if name == "suffix":
        from srtcli.rollout.drafters.suffix import SuffixDrafter

        return SuffixDrafter()
    if name == "srt":
        from srtcli.rollout.drafters.srt import SrtDrafter

        return SrtDrafter(**kw)
    raise ValueError(f"unknown drafter {name!r} (choose from {', '.join(DRAFTERS)})")
