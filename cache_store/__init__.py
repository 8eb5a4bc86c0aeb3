"""Per-prompt token trees, the draft source of speculative rollout, and the sequence store they
are rebuilt from: each prompt's rollouts in LMDB (one machine) or on a Redis server (every
machine of a run), behind one interface (cache_store.store) and one opener
(cache_store.locations).

Never imports torch: the cache must be usable (and `srt cache` fast) without it.
"""
