"""The `none` drafter: no drafts, so the engine does plain batched sampling (the baseline)."""

from srtcli.rollout.drafters.base import Drafter


class NoDrafter(Drafter):
    name = "none"
