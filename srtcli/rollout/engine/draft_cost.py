"""What a draft is worth: the engine verifies only the draft tokens expected to save time.

A verified draft token costs the time it adds to its forward (the model's work on one more
position, and its share of verification) and earns the probability that it is accepted. Both
are measured while the engine runs, so one rule fits any model and device:

- `ForwardCost`: the seconds of a decode forward (the model and verification) as a function of
  the tokens it verifies, how many of them are drafts, and the context they attend to, fitted to
  the engine's own recent forwards. On a CPU each token costs about its FLOPs, a draft token
  more than a row's own (on SmolLM2 at 32 rows, 3.0-4.7 ms against 0.2-2.1: its distribution
  over the whole vocabulary is verified, and its queries attend apart); on a GPU a forward costs
  about the same whatever its tokens until it becomes compute-bound, and there the same rule
  verifies the whole budget.
- `Acceptance`: the probability that a draft token is accepted once the tokens before it were,
  by the drafter's confidence at that position (`Proposal.conf`) and its depth, from the
  verdicts of recent drafts. A drafter that gives no confidence is judged by depth alone.

`DraftCost.cut` takes one step's chains and keeps, across all its rows, the draft tokens in
decreasing order of their chance to be emitted (the product of the acceptances along their
chain) for as long as each raises the step's expected tokens per second, (rows + expected
accepted tokens) / forward seconds. `DraftCost.worth_drafting` says before any drafting
whether even the best token could raise it: when none can, the step drafts nothing and costs
what plain decoding costs.

Exactness. Every decision uses the past (timings, earlier verdicts) and, for a token at depth
k, only what the drafter knew before it drew that token: a confidence is a function of the
distribution the token is drawn from, never of the token, and the tokens of other rows are
independent of it. Keeping a sampled token depending on the token itself would bias the output
(keep only likely draws, and the unlikely ones come from p instead of the residual); the tests
show that such a cut fails a chi-square test. So a draft that ended by drawing its stop
(`Proposal.stopped`) carries the stop's confidence as one more entry, and the stop is kept
exactly when a token drawn there would have been: it competes like a token. Which tokens a
step keeps is therefore a stopping time of each row's draft, and verification stays lossless.

Timings make the drafts' lengths vary from run to run, so sampled outputs are not
bit-reproducible under this rule (the distribution is the same); `--draft-length adaptive`
and `fixed` depend only on the seed.
"""

from __future__ import annotations

import numpy as np

# A forward's seconds are fitted over the last WINDOW decode forwards, recent ones weighing most
WINDOW = 256
HALF_LIFE = 64  # forwards
MIN_FORWARDS = 8  # fewer timed forwards than this: draft what the drafter gives, and learn
REFIT = 4  # forwards between fits (the fit is a few numpy calls; a step's cost barely moves in 4)
RIDGE = 1e-3  # a slope no forward has varied enough to show stays near 0 (so the rule explores)
MIN_SECONDS = 1e-6
# a draft token is priced this many standard errors above its fitted cost: forwards time with
# noise (+-10% on a shared CPU), and a slope fitted from a few of them would keep drafts that
# do not pay; as the forwards show the slope, its error and the premium shrink
PREMIUM_SE = 1.0

# Acceptance by confidence bin x depth; a decayed count, so the recent verdicts weigh most
CONF_EDGES = np.array([0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99])
DEPTHS = 4  # depths 0, 1, 2 and 3 or more
MEMORY = 4096  # verdicts: each one decays the counts by 1 - 1/MEMORY
PRIOR = 2.0  # pseudo-verdicts at the cell's prior, before it has any


class ForwardCost:
    """Seconds of a decode forward, t = a + b * rows' tokens + d * draft tokens + c * tokens *
    context: a fixed part (the weights read once, the host's per-forward work), the rows' own
    tokens, the draft tokens (their FLOPs and their verification), and every token's attention
    over the context (the longest row's length), fitted by weighted least squares over the
    recent forwards, with b, d and c never below 0. One slope for both kinds of token would
    price a draft token at what a row's costs, and keep drafts that do not pay."""

    def __init__(self) -> None:
        self.features = np.zeros((WINDOW, 4))
        self.seconds = np.zeros(WINDOW)
        self.forwards = 0
        self._coef: np.ndarray | None = None
        self._cov = np.zeros((4, 4))
        self._fitted_at = 0

    def observe(self, tokens: int, context: int, seconds: float, drafted: int = 0) -> None:
        """A forward of `tokens` tokens, `drafted` of them drafts, over `context`."""
        i = self.forwards % WINDOW
        self.features[i] = (1.0, tokens - drafted, drafted, tokens * context)
        self.seconds[i] = seconds
        self.forwards += 1

    @property
    def known(self) -> bool:
        return self.forwards >= MIN_FORWARDS

    def predict(self, tokens: float, context: float, drafted: float = 0) -> float:
        """Seconds for a forward of `tokens` tokens, `drafted` of them drafts, over `context`:
        never 0 or less (a fit whose fixed part came out below 0 still orders forwards by their
        tokens)."""
        a, b, d, c = self.coef
        return max(a + b * (tokens - drafted) + d * drafted + c * tokens * context, MIN_SECONDS)

    def draft_token(self, context: float) -> tuple[float, float]:
        """Seconds one more draft token adds to a forward over `context`, as fitted, and the
        fit's standard error of it."""
        _, _, d, c = self.coef
        g = np.array([0.0, 0.0, 1.0, context])
        return d + c * context, float(np.sqrt(max(g @ self._cov @ g, 0.0)))

    def per_draft_token(self, context: float) -> float:
        """What the rule prices one more draft token at: PREMIUM_SE standard errors above the
        fitted seconds."""
        seconds, error = self.draft_token(context)
        return seconds + PREMIUM_SE * error

    @property
    def coef(self) -> np.ndarray:
        if self._coef is None or self.forwards - self._fitted_at >= REFIT:
            self._fit()
        return self._coef

    def _fit(self) -> None:
        """The coefficients and their covariance (the weighted residuals' variance times the
        inverse of the regularized Gram matrix)."""
        n = min(self.forwards, WINDOW)
        age = (self.forwards - 1 - np.arange(n)) % WINDOW
        w = 0.5 ** (age / HALF_LIFE)
        x, y = self.features[:n], self.seconds[:n]
        gram = (x * w[:, None]).T @ x
        gram[1:, 1:] += RIDGE * np.diag(np.diag(gram)[1:])
        moment = (x * w[:, None]).T @ y
        coef = np.linalg.lstsq(gram, moment, rcond=None)[0]
        if (coef[1:] < 0).any():  # a slope below 0 is noise: refit without it
            keep = [0] + [j for j in range(1, len(coef)) if coef[j] >= 0]
            coef = np.zeros(len(coef))
            coef[keep] = np.linalg.lstsq(gram[np.ix_(keep, keep)], moment[keep], rcond=None)[0]
            coef[1:] = np.maximum(coef[1:], 0.0)
        noise = float(w @ (y - x @ coef) ** 2) / max(w.sum() - len(coef), 1.0)  # per forward, squared
        self._coef, self._cov, self._fitted_at = coef, noise * np.linalg.pinv(gram), self.forwards


class Acceptance:
    """P(a draft token is accepted | the tokens before it were), by confidence and depth. A cell
    with few verdicts leans on its prior: at depth 0 the bin's own confidence, deeper the same
    bin one depth up (deep verdicts are few, and a confidence of 0.99 is no promise that a
    real model's third token is accepted 0.99 of the time: its first is accepted far less)."""

    def __init__(self) -> None:
        self.seen = np.zeros((DEPTHS, len(CONF_EDGES) + 1))
        self.accepted = np.zeros_like(self.seen)
        # each bin's own confidence (its middle) is its prior; the top bin's is nearly 1
        self.prior = np.concatenate([[0.15], (CONF_EDGES[:-1] + CONF_EDGES[1:]) / 2, [0.995]])
        self.rate = self._rates()

    def expected(self, conf: np.ndarray, depth: np.ndarray) -> np.ndarray:
        return self.rate[self._cells(conf, depth)]

    def best_first(self) -> float:
        """The acceptance of the best kind of first draft token the drafter has shown (its prior
        while it has shown none)."""
        seen = self.seen[0] >= 1
        return float(self.rate[0][seen].max() if seen.any() else self.rate[0].max())

    def observe(self, conf: np.ndarray, depth: np.ndarray, accepted: np.ndarray) -> None:
        """Verdicts of draft tokens reached by verification (every earlier one was accepted)."""
        if not len(conf):
            return
        keep = (1 - 1 / MEMORY) ** len(conf)
        self.seen *= keep
        self.accepted *= keep
        cell = self._cells(conf, depth)
        np.add.at(self.seen, cell, 1.0)
        np.add.at(self.accepted, cell, accepted.astype(float))
        self.rate = self._rates()

    def _rates(self) -> np.ndarray:
        rate, prior = np.empty_like(self.seen), self.prior
        for d in range(DEPTHS):
            rate[d] = prior = (self.accepted[d] + PRIOR * prior) / (self.seen[d] + PRIOR)
        return rate

    @staticmethod
    def _cells(conf: np.ndarray, depth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.minimum(depth, DEPTHS - 1), np.searchsorted(CONF_EDGES, conf, side="right")


class DraftCost:
    """The rule: keep the draft tokens that raise a step's expected tokens per second."""

    def __init__(self) -> None:
        self.forward = ForwardCost()
        self.acceptance = Acceptance()

    def worth_drafting(self, rows: int, tokens: int, context: int) -> bool:
        """Whether a step of `rows` rows verifying `tokens` tokens without drafts, its longest row
        `context` long, could gain from one draft token of the best kind (too few timings yet:
        draft, and learn)."""
        if not self.forward.known:
            return True
        t = self.forward.predict(tokens, context)
        return (rows + self.acceptance.best_first()) / (t + self.forward.per_draft_token(context)) > rows / t

    def cut(self, rows: int, tokens: int, context: int, confs: list[list[float]]) -> list[int]:
        """How many leading tokens of each chain to verify, for chains with confidences `confs`
        in a step of `rows` rows that verifies `tokens` tokens besides the drafts, its longest
        row `context` long."""
        lens, conf, depth = laid_end_to_end(confs)
        total = len(conf)
        if total == 0 or not self.forward.known:
            return lens.tolist()
        row = np.repeat(np.arange(len(confs)), lens)
        beta = self.acceptance.expected(conf, depth)
        emitted = chain_products(beta, lens)
        order = np.lexsort((depth, -emitted))  # most likely first; along a chain, in its order
        gain = np.concatenate([[0.0], np.cumsum(emitted[order])])
        seconds = self.forward.predict(tokens, context) + self.forward.per_draft_token(context) * np.arange(total + 1)
        rate = (rows + gain) / seconds
        worse = np.flatnonzero(rate[1:] <= rate[:-1])
        keep = int(worse[0]) if len(worse) else total
        return np.bincount(row[order[:keep]], minlength=len(confs)).tolist()

    def observe_forward(self, tokens: int, context: int, seconds: float, drafted: int = 0) -> None:
        self.forward.observe(tokens, context, seconds, drafted)

    def observe_verdicts(self, confs: list[list[float]], accepted: list[int]) -> None:
        """The verdicts of verified chains: row r accepted `accepted[r]` of its tokens, so its
        tokens up to the first rejected one were reached."""
        lens, conf, depth = laid_end_to_end(confs)
        if len(conf) == 0:
            return
        took = np.repeat(np.asarray(accepted), lens)
        reached = depth <= took
        self.acceptance.observe(conf[reached], depth[reached], (depth < took)[reached])


def laid_end_to_end(confs: list[list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chains' confidences laid end to end: (each chain's length, every confidence, its depth)."""
    lens = np.fromiter(map(len, confs), int, len(confs))
    total = int(lens.sum())
    conf = np.fromiter((c for cs in confs for c in cs), float, total)
    return lens, conf, np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)


def chain_products(beta: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Running products of `beta` within each chain (chains of `lens` tokens, laid end to end)."""
    logs = np.cumsum(np.log(np.maximum(beta, 1e-12)))
    before = np.repeat(np.concatenate([[0.0], logs])[np.cumsum(lens) - lens], lens)
    return np.exp(logs - before)
