"""srt: cheaper RL training of language models with token trees.

`srtcli` composes the two libraries of the project into a command line:
`cache_store` (per-prompt suffix trees over stored rollouts, drafting, decay, the sequence
store on LMDB or Redis) and `attention` (prefix-tree packing, tree attention, log-prob
recovery).
"""

__version__ = "0.1.0"
