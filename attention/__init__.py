"""Prefix-tree packing and tree attention: many sequences that share prefixes, one forward.

Uses torch; never touches LMDB.
"""
