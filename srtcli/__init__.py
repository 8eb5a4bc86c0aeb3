"""srt: cheaper RL training of language models with token trees.

`srtcli` composes the two libraries of the project into a command line:
`cache_store` (per-prompt token tries, drafting, LMDB persistence) and
`attention` (prefix-tree packing, tree attention, log-prob recovery).
"""

__version__ = "0.1.0"
