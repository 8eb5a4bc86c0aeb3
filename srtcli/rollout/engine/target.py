"""The target's next-token distributions after one forward, computed only where verification
reads them.

A forward keeps one logit vector per verified position: row r's p_0 .. p_d (after its pending
tokens and after each of its d draft tokens). Verifying a chain reads p(x) of each draft token,
then one whole distribution per row (where it stopped accepting: the final token is drawn
there, from the residual if it rejected). With a real vocabulary (49,152 tokens for
SmolLM2 against the bundled model's 646) shaping every kept position into a whole distribution,
as plain sampling of one position does, costs more host time than the tokens it verifies can
save; so `Target` keeps the logits and shapes them lazily, the same distribution either way:

- greedy: p is the point mass on each position's argmax; nothing else is computed.
- temperature only (top-k off, top-p 1): one log-normaliser per position (a logsumexp over the
  vocabulary); p(x) is exp(logit(x) / T - lse) and a whole row is the same expression over the
  vocabulary, so the ratios verification takes and the rows it samples from agree exactly.
- top-k or top-p: `shape_probs` over every kept position once (sorting needs the whole row).

`rows` are indices into the kept positions; `at(r, k)` is row r's p_k's index.
"""

from __future__ import annotations

import torch

from srtcli.rollout.engine.sampling import SamplingParams, shape_probs


class Target:
    """Kept logits [n, V] of one forward, shaped by `params` where read."""

    def __init__(self, logits: torch.Tensor, starts: list[int], params: SamplingParams):
        self.logits, self.starts, self.params = logits, starts, params
        self.vocab = logits.shape[-1]
        self._probs: torch.Tensor | None = None  # top-k / top-p: every position shaped once
        self._lse: torch.Tensor | None = None  # temperature only: log-normaliser per position
        self._argmax: torch.Tensor | None = None  # greedy
        if params.greedy:
            self._argmax = logits.argmax(-1)
        elif params.top_k or params.top_p < 1.0:
            self._probs = shape_probs(logits, params)
        else:
            self._lse = torch.logsumexp(self._scaled(logits), -1)

    def at(self, row: int, k: int) -> int:
        """Index of row `row`'s p_k among the kept positions."""
        return self.starts[row] + k

    def probs_of(self, idx: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """p(tokens[i]) at kept position idx[i], float32."""
        if self._argmax is not None:
            return (self._argmax[idx] == tokens).float()
        if self._probs is not None:
            return self._probs[idx, tokens]
        return (self._scaled(self.logits[idx, tokens]) - self._lse[idx]).exp()

    def dists(self, idx: torch.Tensor) -> torch.Tensor:
        """The whole shaped distributions at kept positions `idx`: [len(idx), V], rows sum to 1."""
        if self._argmax is not None:
            out = torch.zeros((len(idx), self.vocab), device=self.logits.device)
            return out.scatter_(1, self._argmax[idx][:, None], 1.0)
        if self._probs is not None:
            return self._probs.index_select(0, idx)
        return (self._scaled(self.logits.index_select(0, idx)) - self._lse[idx][:, None]).exp()

    def dense(self, keep: int) -> torch.Tensor:
        """[rows, keep, V]: row r's p_0 .. p_{keep-1}, its last one repeated past its draft (tree
        verification walks every node, so it reads them all)."""
        ends = self.starts[1:] + [len(self.logits)]
        idx = [s + min(k, e - s - 1) for s, e in zip(self.starts, ends) for k in range(keep)]
        idx_t = torch.tensor(idx, device=self.logits.device)
        return self.dists(idx_t).view(len(self.starts), keep, self.vocab)

    def _scaled(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float() / self.params.temperature
