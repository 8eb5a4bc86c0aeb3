"""Per-prompt token trees: the draft source of speculative rollout, kept in LMDB.

Never imports torch: the cache must be usable (and `srt cache` fast) without it.
"""
