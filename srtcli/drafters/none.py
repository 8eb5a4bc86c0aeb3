"""The `none` drafter: no drafts, so the engine does plain batched sampling (the baseline)."""

from srtcli.drafters import Drafter


class NoDrafter(Drafter):
    name = "none"
