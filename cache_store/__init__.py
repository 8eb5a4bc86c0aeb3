"""Per-prompt token trees: the draft source of speculative rollout, kept in LMDB (one machine)
or on a Redis server (every machine of a run).

Never imports torch: the cache must be usable (and `srt cache` fast) without it.
"""
