"""An SRT proposer whose worker stalls one engine step: vLLM builds it by name in its worker
(`make_llm(..., proposer=STALLING)`), where `$SRT_TEST_STALL` ("step:seconds:log", read when the
worker starts) says which step of every rollout sleeps before drafting, for how long, and which
file gets a line per stall: how many sequences in the batch then have not ended, and how many
out of it are not done (vLLM preempted or skipped them). A step that long without a call
looks to the proposer's idle thread like an idle engine."""

from __future__ import annotations

import os
import time
from typing import Any

from srtcli.rollout.vllm.proposer import SrtProposer

STALLING = f"{__name__}.StallingProposer"
STALL_ENV = "SRT_TEST_STALL"


class StallingProposer(SrtProposer):
    def __init__(self, vllm_config: Any):
        super().__init__(vllm_config)
        step, seconds, self.log = os.environ[STALL_ENV].split(":", 2)
        self.stall_step, self.stall_seconds = int(step), float(seconds)

    def propose(self, *args: Any, **kwargs: Any) -> list[list[int]]:
        d = self.drafts
        if d.tracker.step + 1 == self.stall_step:  # `srt_reload` starts each rollout at step 0
            live = sum(not s.ended for s in d.tracker.rows.values())
            away = sum(not (s.ended or s.done) for s in d.tracker.away.values())
            with open(self.log, "a") as f:
                f.write(f"{live} {away}\n")
            time.sleep(self.stall_seconds)
        return super().propose(*args, **kwargs)
