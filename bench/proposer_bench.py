"""The SRT proposer's host cost per vLLM engine step (`TreeDrafts.propose`), beside
ArcticInference's suffix cache driven the way vLLM's `suffix` method drives it, on the same steps.

vLLM calls its proposer synchronously inside every decode step, so its cost per row is paid by
every row of every step. The steps are synthetic but shaped like vLLM's: `--rows` rows (16
prompts x K), each decoding row keeps 1-4 new tokens per step (`--verify`: what its last draft
got right and one more, as verification keeps); a new request spends one step prefilling
(nothing sampled); a finished request leaves, at most two new ones join per step in the lowest
free rows and the other holes are filled by moving the last rows in (vLLM's `condense`).
Responses are `--tokens` long, noisy copies of a few reasoning paths per prompt
(bench/workloads.py); the first rows start part-way through theirs, so the
figures are for rows of every length up to `--tokens`; both proposers first see each of them in
one untimed step, holding its prompt and its tokens so far as just sampled (a row's prompt is
what it held before its first sampled tokens, for both). The trees start empty and fill on the
fly, as do ArcticInference's; with `--history N`, each prompt's N earlier responses are stored
before its first request (an LMDB store for srt, loaded when the proposer first needs the
prompt; finished requests in ArcticInference's global tree).

Each proposer runs its steps on its own (`--interleave`: alternating step by step, each one
then evicting the other's trees from the caches). Printed: microseconds per row per step
(median over the steps, over the last quarter, and the mean: a step that loads a prompt's
stored tree pays for it, see `--history`), the slowest step in ms, the mean draft and how many of its tokens
the row generates next (accepted, over all steps and the last quarter), per decoding row, and
the cost's ratio to ArcticInference. srt's draft length adapts to what was accepted
(`--fixed-budget`: the whole budget, the CUDA default); with rows keeping 1-4 tokens whatever was
drafted, that length reads as short, so compare drafting under `--verify`. `--own-tree` adds
`srt-own`, the proposer without the run-wide tree (`ProposerSettings.shared=False`), to see what that
tree's inserts cost. A stored tree is built off the step and adopted `--load-steps` steps later
(the proposer's default); `--in-step` adds `srt-in-step`, which builds it inside the step, and
`--forward-ms` waits after each step as the host does during a GPU forward (untimed), the time
in which builds off the step run. `--from-config` (needs vLLM) adds `srt-config` and
`srt-config-warm`: `SrtProposer` built from a real `VllmConfig` as vLLM's worker builds it (a
small model with head size 32, `max_num_seqs` = `--rows`, the cache `$SRT_CACHE`, every default
the config fills in: adaptive lengths off CUDA, eos from the tokenizer, which the responses then
avoid), cold and on the cache a first run of the same steps filled. srt's tree work runs on `--threads` threads (the proposer's
default: the cores it may use, at most 4); `--one-thread` adds `srt-1-thread`; `--second-run`
adds `srt-warm`, srt on the cache a first, untimed run of the same steps filled (the next
epoch's proposer, its prompts' trees loaded from what the first run committed). Past
`--shared-max-tokens` the run-wide tree is rebuilt from its newest sequences (off the step, or
in it with `--load-steps 0`): the slowest step shows what that costs. Not a test.

    .venv/bin/python bench/proposer_bench.py --rows 256 --tokens 8192 --own-tree --one-thread
    .venv/bin/python bench/proposer_bench.py --rows 256 --tokens 8192 --verify --fixed-budget --history 16 --in-step
    .venv/bin/python bench/proposer_bench.py --quick                     # a smoke run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.workloads import noisy_copy, zipf_tokens  # noqa: E402
from cache_store.seqstore import LmdbSequenceStore  # noqa: E402
from cache_store.uid import prompt_uid  # noqa: E402
from srtcli.rollout.drafters import prompt_trees  # noqa: E402
from srtcli.rollout.vllm.settings import ProposerSettings  # noqa: E402
from srtcli.rollout.vllm.tree_drafts import TreeDrafts, feed_threads  # noqa: E402
from srtcli.store_link import StoreLink  # noqa: E402

SHARED_BOUND = prompt_trees.SHARED_MAX_TOKENS  # the proposer's own
EOS = 32_001  # never generated: rows end at their length, as a length-capped vLLM request does
PROMPT_LEN, BUDGET, ADMIT = 256, 8, 2
FINGERPRINT = "tok1-bench"
ARCTIC_DEPTH, ARCTIC_CACHED = 24, 10_000  # vLLM's suffix_decoding_max_tree_depth / _max_cached_requests


class Workload:
    """Requests (prompt index, response) in order: K samples of a prompt, then the next prompt."""

    def __init__(self, seed: int, k: int, tokens: int, prompts: int, history: int = 0, avoid: tuple = ()):
        self.rng = np.random.default_rng(seed)
        self.k, self.tokens, self.history = k, tokens, history
        self.avoid = np.array(avoid, dtype=np.int32)  # tokens no response holds (a real tokenizer's eos)
        self.prompts = [self.rng.integers(3, 32_000, PROMPT_LEN).tolist() for _ in range(prompts)]
        self.paths: dict[int, list] = {}
        self.next = 0
        self.earlier: Callable[[list, list], None] | None = None  # (prompt, an earlier epoch's responses)

    def request(self) -> tuple[int, int, np.ndarray]:
        """(request id, prompt index, response tokens) of the next request."""
        rid, p = self.next, self.next // self.k
        self.next += 1
        if p not in self.paths:
            self.paths = {p: [zipf_tokens(self.rng, int(self.tokens * 1.6) + 64) for _ in range(3)]}
            if self.history:  # the prompt's responses of an earlier epoch, before its first request
                earlier = [self._clean(noisy_copy(self.rng, self.paths[p], self.tokens)) for _ in range(self.history)]
                if self.earlier is not None:
                    self.earlier(self.prompts[p], earlier)
        return rid, p, self._clean(noisy_copy(self.rng, self.paths[p], self.tokens))

    def _clean(self, resp: np.ndarray) -> np.ndarray:
        resp[np.isin(resp, self.avoid)] = 3
        return resp


class Batch:
    """vLLM's persistent batch: `token_ids_cpu`, `num_tokens_no_spec`, and what each row holds."""

    def __init__(self, work: Workload, rows: int, verify: bool = False):
        self.work, self.rows, self.verify = work, rows, verify
        self.ids = np.zeros((rows, PROMPT_LEN + work.tokens + 8), dtype=np.int32)
        self.num = np.zeros(rows, dtype=np.int32)
        self.reqs: list[list] = []  # [request id, prompt index, response, kept, prefilled, last draft]
        for _ in range(rows):  # the first rows start part-way through their responses
            self.add(len(self.reqs), start=int(work.rng.integers(0, work.tokens)))

    def add(self, i: int, start: int = 0) -> None:
        rid, p, resp = self.work.request()
        prompt = self.work.prompts[p]
        self.ids[i, :PROMPT_LEN] = prompt
        self.ids[i, PROMPT_LEN:PROMPT_LEN + start] = resp[:start]
        self.num[i] = PROMPT_LEN + start
        req = [rid, p, resp, start, start > 0, []]
        if i == len(self.reqs):
            self.reqs.append(req)
        else:
            self.reqs[i] = req

    def catch_up(self) -> list[list[int]]:
        """The first rows' tokens so far, as if all sampled in one step: so a proposer first sees
        each of them holding its prompt, as vLLM's first step after a prefill shows it."""
        return [r[2][: r[3]].tolist() for r in self.reqs]

    def offer(self, drafts: list[list[int]]) -> int:
        """Each row's draft for its next step; how many of their tokens the rows generate next."""
        for d, r in zip(drafts, self.reqs):
            r[5] = d
        return sum(matched(r[5], r[2], r[3]) for r in self.reqs)

    def step(self) -> list[list[int]]:
        """Every decoding row keeps 1-4 tokens (`verify`: what its last draft got right, and one
        more); a new row prefills. The sampled tokens per row."""
        sampled = []
        for i, r in enumerate(self.reqs):
            if not r[4]:
                r[4] = True
                sampled.append([])
                continue
            keep = matched(r[5], r[2], r[3]) + 1 if self.verify else int(self.work.rng.integers(1, 5))
            take = r[2][r[3]: r[3] + keep]
            self.ids[i, self.num[i]: self.num[i] + len(take)] = take
            self.num[i] += len(take)
            r[3] += len(take)
            sampled.append(take.tolist())
        return sampled

    def retire(self) -> list[int]:
        """Finished rows leave; up to ADMIT new requests take the lowest free rows, the last rows
        fill the other holes (vLLM's condense). Returns the finished request ids."""
        done = [i for i, r in enumerate(self.reqs) if r[3] >= len(r[2])]
        gone = [self.reqs[i][0] for i in done]
        holes = sorted(done)
        for _ in range(min(ADMIT, len(holes))):
            self.add(holes.pop(0))
        for i in sorted(holes, reverse=True):  # condense: the last row moves into the hole
            last = len(self.reqs) - 1
            if i != last:
                self.ids[i], self.num[i], self.reqs[i] = self.ids[last], self.num[last], self.reqs[last]
            self.reqs.pop()
        while len(self.reqs) < self.rows:  # the batch refills at its end
            self.add(len(self.reqs))
        return gone


class Arctic:
    """ArcticInference's suffix cache, called per row from Python as vLLM's `suffix` method does,
    with vLLM's defaults (tree depth 24, 10,000 cached responses, min_token_prob 0.1)."""

    def __init__(self, max_model_len: int):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=ARCTIC_DEPTH, max_cached_requests=ARCTIC_CACHED)
        self.max_model_len = max_model_len
        self.earlier = 0

    def propose(self, batch: Batch, sampled: list[list[int]]) -> list[list[int]]:
        out = []
        for i, toks in enumerate(sampled):
            if not toks:
                out.append([])
                continue
            rid, n = batch.reqs[i][0], int(batch.num[i])
            if rid not in self.cache.active_requests:  # its prompt: what it held when first seen, as for srt
                self.cache.start_request(rid, batch.ids[i, :n - len(toks)])
            self.cache.add_active_response(rid, toks)
            pattern = batch.ids[i, max(0, n - ARCTIC_DEPTH):n]
            room = min(BUDGET, self.max_model_len - n - 1)
            out.append(self.cache.speculate(rid, pattern, max_spec_tokens=room, min_token_prob=0.1).token_ids)
        return out

    def remember(self, prompt: list, responses: list) -> None:
        """Earlier requests of the prompt, finished: their responses stay in the global tree."""
        for resp in responses:
            self.earlier += 1
            rid = f"earlier-{self.earlier}"
            self.cache.start_request(rid, prompt)
            self.cache.add_active_response(rid, resp)
            self.cache.stop_request(rid)

    def finish(self, gone: list[int]) -> None:
        for rid in gone:
            if rid in self.cache.active_requests:
                self.cache.stop_request(rid)


def matched(draft: list[int], resp: np.ndarray, at: int) -> int:
    """How many of the draft's tokens the response generates next, from position `at` (the
    draft's longest prefix that agrees): what verification keeps, drafts being point masses."""
    coming, k = resp[at: at + len(draft)].tolist(), 0
    while k < len(coming) and draft[k] == coming[k]:
        k += 1
    return k


def config_proposer(args: argparse.Namespace, cache: str) -> Any:
    """`SrtProposer` from a real `VllmConfig`, on the cache `cache` (`$SRT_CACHE`), as vLLM's
    worker builds it: the model, `max_num_seqs` and the budget are the run's, the rest defaults."""
    import os

    from vllm.engine.arg_utils import EngineArgs

    from srtcli.rollout.vllm.proposer import PROPOSER, SrtProposer
    from tests.srtcli.rollout.engine.support import make_head32_model_dir

    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"  # the tiny model's 256 positions: only its config is used
    os.environ["SRT_CACHE"] = cache
    model = Path(cache).parent / "m32"
    if not model.exists():
        make_head32_model_dir(model)
    config = EngineArgs(model=str(model), max_model_len=PROMPT_LEN + args.tokens + 8, max_num_seqs=args.rows,
                        speculative_config={"method": "custom_class", "model": PROPOSER,
                                            "num_speculative_tokens": BUDGET}).create_engine_config()
    return SrtProposer(config)


def config_eos(args: argparse.Namespace, stores: str) -> tuple:
    """The eos ids a config-built proposer ends sequences at (the responses avoid them)."""
    return tuple(config_proposer(args, tempfile.mkdtemp(dir=stores)).drafts.settings.eos_ids)


def warm_config_proposer(args: argparse.Namespace, stores: str, work: Callable[[], Workload]) -> Any:
    """`config_proposer` on the cache a first, untimed run of the same steps filled and closed."""
    cache = tempfile.mkdtemp(dir=stores)
    first, batch = config_proposer(args, cache), Batch(work(), args.rows, args.verify)
    batch.offer(propose(first, batch, batch.catch_up()))
    for _ in range(args.steps):
        batch.offer(propose(first, batch, batch.step()))
        batch.retire()
    first.close()
    return config_proposer(args, cache)


def drafts_of(prop: Any) -> TreeDrafts | None:
    """The `TreeDrafts` behind a proposer (itself, or a config-built `SrtProposer`'s)."""
    return prop if isinstance(prop, TreeDrafts) else getattr(prop, "drafts", None)


def propose(prop: Any, batch: Batch, sampled: list[list[int]]) -> list[list[int]]:
    if isinstance(prop, Arctic):
        return prop.propose(batch, sampled)
    return prop.propose(sampled, batch.num, batch.ids)


def srt_settings(args: argparse.Namespace, shared: bool = True, load_steps: int | None = None,
                 threads: int | None = None) -> ProposerSettings:
    return ProposerSettings(None, args.tokens, [EOS], adaptive=not args.fixed_budget, shared=shared,
                            fingerprint=FINGERPRINT, load_steps=args.load_steps if load_steps is None else load_steps,
                            threads=threads)


def srt_proposer(args: argparse.Namespace, shared: bool, work: Workload, stores: str,
                 load_steps: int | None = None, threads: int | None = None) -> TreeDrafts:
    """The srt proposer; with `--history`, on a cache (under `stores`) that holds each prompt's
    earlier responses from before its first request, as a later epoch's cache does (built off
    the step, adopted `load_steps` steps later; 0: in it)."""
    settings = srt_settings(args, shared, load_steps, threads)
    link = None
    if args.history:
        store = LmdbSequenceStore.open(tempfile.mkdtemp(dir=stores))
        work.earlier = lambda prompt, resps: store.append(
            prompt_uid(prompt, FINGERPRINT), [[prompt[-1]] + r.tolist() for r in resps])  # anchor first
        link = StoreLink(store)
    return TreeDrafts(settings, BUDGET, PROMPT_LEN + args.tokens + 8, link=link)


def warm_proposer(args: argparse.Namespace, stores: str, work: Callable[[], Workload]) -> TreeDrafts:
    """srt on the cache a first, untimed run of the same steps filled (every sequence committed
    at its end, as after `srt_finish`): the proposer of the next epoch over the same prompts."""
    store = LmdbSequenceStore.open(tempfile.mkdtemp(dir=stores))
    first, batch = TreeDrafts(srt_settings(args), BUDGET, PROMPT_LEN + args.tokens + 8, link=StoreLink(store)), \
        Batch(work(), args.rows, args.verify)
    batch.offer(propose(first, batch, batch.catch_up()))
    for _ in range(args.steps):
        batch.offer(propose(first, batch, batch.step()))
        batch.retire()
    first.finish()
    return TreeDrafts(srt_settings(args), BUDGET, PROMPT_LEN + args.tokens + 8, link=StoreLink(store))


def run(args: argparse.Namespace, stores: str) -> dict:
    k = args.rows // args.prompts
    prompts = args.prompts + (args.steps * ADMIT) // k + 2
    avoid = config_eos(args, stores) if args.from_config else ()

    def work_of() -> Workload:
        return Workload(args.seed, k, args.tokens, prompts, args.history, avoid)

    kinds: dict = {}
    for name in ("srt", "srt-own", "srt-in-step", "srt-1-thread", "srt-warm", "srt-config", "srt-config-warm", "arctic"):
        if (name == "srt-own" and not args.own_tree) or (name == "srt-in-step" and not args.in_step) \
                or (name == "srt-1-thread" and not args.one_thread) or (name == "srt-warm" and not args.second_run) \
                or (name.startswith("srt-config") and not args.from_config):
            continue
        work = work_of()
        if name == "srt-warm":
            prop = warm_proposer(args, stores, work_of)
        elif name == "srt-config":
            prop = config_proposer(args, tempfile.mkdtemp(dir=stores))
        elif name == "srt-config-warm":
            prop = warm_config_proposer(args, stores, work_of)
        elif name == "arctic":
            try:
                prop = Arctic(PROMPT_LEN + args.tokens + 8)
            except ImportError:
                print("arctic_inference is not installed: ArcticInference's figures are skipped")
                continue
            work.earlier = prop.remember
        else:  # srt-own: without the run-wide tree, to see what its inserts cost; srt-in-step: loads in it
            prop = srt_proposer(args, name != "srt-own", work, stores, load_steps=0 if name == "srt-in-step" else None,
                                threads=1 if name == "srt-1-thread" else args.threads)
        kinds[name] = (prop, Batch(work, args.rows, args.verify))
    res: dict = {name: {"us": [], "drafted": [], "accepted": [], "rows": []} for name in kinds}
    # by default each proposer runs all its steps on its own; `--interleave` alternates them step
    # by step, so each one's memory traffic evicts the other's trees from the caches (both read
    # higher, as a proposer does in a process with other work between its calls)
    order = [(name, step) for step in range(args.steps) for name in kinds] if args.interleave else \
        [(name, step) for name in kinds for step in range(args.steps)]
    for name, (prop, batch) in kinds.items():  # untimed: the first rows' tokens so far go in
        drafts = drafts_of(prop)  # and their prompts' stored trees, loaded in that step
        if drafts is not None:
            drafts.session.trees.load_steps, load_steps = 0, drafts.session.trees.load_steps
        batch.offer(propose(prop, batch, batch.catch_up()))
        if drafts is not None:
            drafts.session.trees.load_steps = load_steps
    for name, _ in order:
        prop, batch = kinds[name]
        sampled = batch.step()
        t0 = time.perf_counter()
        drafts = propose(prop, batch, sampled)
        res[name]["us"].append((time.perf_counter() - t0) * 1e6 / len(sampled))
        res[name]["drafted"].append(sum(len(d) for d in drafts))
        res[name]["accepted"].append(batch.offer(drafts))
        res[name]["rows"].append(sum(1 for t in sampled if t))
        gone = batch.retire()
        if name == "arctic":
            prop.finish(gone)
        time.sleep(args.forward_ms / 1e3)  # the model's forward: the host waits, the GIL released
    return res


def per_row(r: dict, key: str, first: int = 0) -> float:
    """`key` (drafted or accepted tokens) per decoding row, over the steps from `first`."""
    return sum(r[key][first:]) / max(sum(r["rows"][first:]), 1)


def report(args: argparse.Namespace, res: dict) -> None:
    how = ["interleaved" if args.interleave else "each on its own"] + ["verified"] * args.verify \
        + ["fixed budget"] * args.fixed_budget + [f"{args.history} earlier responses a prompt"] * bool(args.history) \
        + [f"{args.forward_ms:g} ms forwards"] * bool(args.forward_ms) + [f"loads adopted after {args.load_steps} steps"] \
        + [f"srt on {args.threads or feed_threads()} threads"] \
        + [f"run-wide tree rebuilt past {args.shared_max_tokens:,} tokens"] * (args.shared_max_tokens != SHARED_BOUND)
    print(f"proposer host cost: {args.rows} rows, {args.tokens}-token responses, {args.steps} steps, budget {BUDGET}, "
          + ", ".join(how))
    print(f"{'':<16}{'us per row per step':^33}{'worst':>8}{'draft':>7}{'accepted':^18}")
    print(f"{'proposer':<16}{'p50':>9}{'last quarter':>14}{'mean':>10}{'step ms':>10}{'len':>6}{'all':>8}"
          f"{'last quarter':>14}{'/arctic':>9}")
    last = args.steps - args.steps // 4
    figs = {n: (float(np.median(r["us"])), float(np.median(r["us"][last:]))) for n, r in res.items()}
    for name, r in res.items():
        ratio = f"{figs[name][0] / figs['arctic'][0]:.2f}x" if "arctic" in figs else "-"
        worst = max(r["us"]) * args.rows / 1e3
        print(f"{name:<16}{figs[name][0]:>9.2f}{figs[name][1]:>14.2f}{np.mean(r['us']):>10.2f}{worst:>10.1f}"
              f"{per_row(r, 'drafted'):>6.2f}{per_row(r, 'accepted'):>8.2f}{per_row(r, 'accepted', last):>14.2f}"
              f"{ratio:>9}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--own-tree", action="store_true", help="also without the run-wide tree (srt-own)")
    ap.add_argument("--verify", action="store_true",
                    help="rows keep what their last draft got right and one more token, not 1-4 at random")
    ap.add_argument("--fixed-budget", action="store_true",
                    help="srt drafts the whole budget each step (the CUDA default), not the adaptive length")
    ap.add_argument("--history", type=int, default=0,
                    help="each prompt's trees start with this many earlier responses (an earlier epoch)")
    ap.add_argument("--interleave", action="store_true", help="alternate the proposers step by step")
    ap.add_argument("--forward-ms", type=float, default=0.0,
                    help="untimed wait after each step, as for a GPU forward (loads off the step build then)")
    ap.add_argument("--load-steps", type=int, default=ProposerSettings().load_steps,
                    help="srt's stored trees are built off the step and adopted this many steps later (0: in it)")
    ap.add_argument("--in-step", action="store_true", help="also srt loading inside the step (srt-in-step)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of srt's tree work (default: the proposer's, the cores up to 4)")
    ap.add_argument("--one-thread", action="store_true", help="also srt on one thread (srt-1-thread)")
    ap.add_argument("--second-run", action="store_true",
                    help="also srt on the cache a first run of the same steps filled (srt-warm)")
    ap.add_argument("--from-config", action="store_true",
                    help="also SrtProposer built from a real VllmConfig, cold and warm (needs vLLM)")
    ap.add_argument("--shared-max-tokens", type=int, default=SHARED_BOUND,
                    help="the run-wide tree's bound, past which it is rebuilt from its newest sequences "
                         "(lower it to see a rebuild within a short run)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 32 rows, 512 tokens, 40 steps")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.prompts, args.tokens, args.steps = 32, 4, 512, 40
    prompt_trees.SHARED_MAX_TOKENS = args.shared_max_tokens
    with tempfile.TemporaryDirectory() as stores:
        report(args, run(args, stores))


if __name__ == "__main__":
    main()
