"""The last epoch again, `--repeat N` times per config, interleaved (`bench/rollout_bench.py`).

This machine's speed drifts by 1.5-2x within minutes, so one run per config says little about
wall-time ratios. Here every round runs each config's last epoch once more, configs in turn,
from a copy of the cache that config had before its last epoch and with the same seed: the
same work every round (the same tokens and forwards), so only the time differs, and a drift
hits the configs of one round alike. A drafter whose cache lives in the drafter object
(`arctic`) is built afresh and warmed with the earlier epochs each round (untimed). Reported:
each config's median wall and model time, and the median over rounds of each round's ratio to
`none` (and srt's to `arctic`), wall, model time and host time per forward and per generated
token. Beside them, each config's fastest round and the ratio of the fastest rounds: the
machine's drift only ever adds time, so a config's fastest round is the best estimate of what
its work costs, and the ratio of the minima does not depend on a drift that hit one config's
run inside a round.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Callable


def snapshot(cache: Path) -> Path:
    """A copy of a config's cache before its last epoch (`repeat` starts every round from it)."""
    keep = cache.with_name(cache.name + "-before-last")
    shutil.rmtree(keep, ignore_errors=True)
    if cache.exists():
        shutil.copytree(cache, keep)
    return keep


def repeat(rounds: int, names: list[str], epochs: int, work: Path, run: Callable[[str, int, Path, Path, object], dict],
           fresh_drafter: Callable[[str], object], forwards: dict[str, int]) -> dict:
    """{config: [summary per round]}; `run(name, epoch, cache, out, drafter)` runs one epoch;
    `forwards`: each config's target forwards in its last epoch, which every round must repeat."""
    out: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names:
            cache = work / f"repeat-{name}-{r}"
            drafter = fresh_drafter(name)
            if drafter is not None:  # its cache is the object: warm it as the epochs did
                for e in range(1, epochs):
                    run(name, e, cache, work / f"repeat-pool-{name}-{r}-{e}", drafter)
            elif (work / f"cache-{name}-before-last").exists():
                shutil.copytree(work / f"cache-{name}-before-last", cache)
            s = run(name, epochs, cache, work / f"repeat-pool-{name}-{r}", drafter)
            if s["target_forwards"] != forwards[name]:
                print(f"{name}: round {r + 1} took {s['target_forwards']} forwards, the last epoch "
                      f"{forwards[name]}: not the same work")
            out[name].append(s)
            shutil.rmtree(cache, ignore_errors=True)
    report(out, epochs)
    return out


def wall(s: dict) -> float:
    return s["wall_s"]


def _host_us_per_token(s: dict) -> float:
    return 1e6 * (s["wall_s"] - s["model_s"]) / max(s["generated_tokens"], 1)


def _host_ms(s: dict) -> float:
    return 1e3 * (s["wall_s"] - s["model_s"]) / max(s["target_forwards"], 1)


def round_ratios(num: list[dict], den: list[dict], key: Callable[[dict], float] = wall) -> list[float]:
    """key(den) / key(num) in each round: `num`'s speed-up on `den`."""
    return [key(d) / key(n) for n, d in zip(num, den)]


def fastest_ratio(num: list[dict], den: list[dict], key: Callable[[dict], float] = wall) -> float:
    """min over rounds of key(den) / min of key(num): the fastest rounds' ratio."""
    return min(map(key, den)) / min(map(key, num))


def _ratios(num: list[dict], den: list[dict], key: Callable[[dict], float]) -> str:
    """Median [min-max] over rounds of `round_ratios`."""
    rs = round_ratios(num, den, key)
    return f"{statistics.median(rs):.2f}x [{min(rs):.2f}-{max(rs):.2f}]"


def _best(num: list[dict], den: list[dict], key: Callable[[dict], float]) -> str:
    return f"{fastest_ratio(num, den, key):.2f}x"


def report(out: dict[str, list[dict]], epochs: int) -> None:
    rounds = len(next(iter(out.values())))
    print(f"\nepoch {epochs} repeated {rounds}x, configs interleaved, same work every round: median "
          "(per-round ratios: median [min-max])")
    for name, ss in out.items():
        line = (f"{name:16s} forwards {ss[0]['target_forwards']:4d}  wall {statistics.median(s['wall_s'] for s in ss):6.2f}s"
                f"  model {statistics.median(s['model_s'] for s in ss):6.2f}s"
                f"  host/forward {statistics.median(_host_ms(s) for s in ss):5.2f} ms"
                f"  (fastest round: wall {min(s['wall_s'] for s in ss):5.2f}s)")
        if "none" in out and name != "none":
            line += (f"  vs none: wall {_ratios(ss, out['none'], wall)}, fastest {_best(ss, out['none'], wall)}"
                     f"  model {_ratios(ss, out['none'], lambda s: s['model_s'])}"
                     f"  host/forward {_ratios(out['none'], ss, _host_ms)}"
                     f"  host/token {_ratios(out['none'], ss, _host_us_per_token)}")
        print(line)
    for other, target in (("arctic", "(target >= 1.3x)"), ("none", "(target >= 1.6x, or within 10% of the ceiling)")):
        if "srt" in out and other in out:
            print(f"epoch {epochs} srt vs {other}, wall (repeated): {_ratios(out['srt'], out[other], wall)}; "
                  f"fastest rounds {_best(out['srt'], out[other], wall)} {target}")
