"""What the SRT proposer reads from vLLM's config in the worker, with no driver to tell it: the
tokenizer's fingerprint (so a prompt's cache uid is the one `srt rollout` and `srt cache add`
give the same token ids), the eos ids, and the device type (the draft-length default).

The tokenizer is the one vLLM serves with (`model_config.tokenizer`): a local directory is
loaded as `srt rollout --model DIR` and `srt cache add --model DIR` load it
(`srtcli.tokenizers.load_tokenizer`), a hub name with transformers' `AutoTokenizer` (vLLM has
already fetched it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from srtcli.errors import SrtError
from srtcli.rollout.config import adaptive_default
from srtcli.rollout.vllm.settings import ProposerSettings


@dataclass(frozen=True)
class ModelFacts:
    fingerprint: str
    eos_ids: list[int]
    device_type: str  # "cuda", "cpu", ...


def load_worker_tokenizer(name: str, revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """The tokenizer vLLM serves with, loaded as srt loads a model directory's."""
    if Path(name).is_dir():
        from srtcli.tokenizers import load_tokenizer

        return load_tokenizer(name)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as e:  # transformers raises many types; vLLM shows the proposer's one line
        raise SrtError(f"{name}: the SRT proposer cannot load the tokenizer: {type(e).__name__}: {e}") from None


def facts_of(tok: Any, generation_eos: Any, device_type: str) -> ModelFacts:
    """The facts of a loaded tokenizer and the generation config's eos (one id, a list or None)."""
    from srtcli.rollout.model_facts import eos_ids
    from srtcli.tokenizers import tokenizer_fingerprint

    return ModelFacts(tokenizer_fingerprint(tok), eos_ids(tok, generation_eos), device_type)


def model_facts(vllm_config: Any) -> ModelFacts:
    """The facts of the model vLLM serves."""
    mc = vllm_config.model_config
    tok = load_worker_tokenizer(mc.tokenizer, mc.tokenizer_revision, bool(mc.trust_remote_code))
    try:
        generation_eos = mc.try_get_generation_config().get("eos_token_id")
    except Exception:  # no or unreadable generation config: the tokenizer's eos alone
        generation_eos = None
    return facts_of(tok, generation_eos, str(vllm_config.device_config.device_type))


def completed(settings: ProposerSettings, facts: ModelFacts) -> ProposerSettings:
    """The settings with what they left open filled in from the model and the platform."""
    return replace(settings, fingerprint=settings.fingerprint or facts.fingerprint,
                   eos_ids=facts.eos_ids if settings.eos_ids is None else settings.eos_ids,
                   adaptive=adaptive_default(facts.device_type) if settings.adaptive is None else settings.adaptive)
