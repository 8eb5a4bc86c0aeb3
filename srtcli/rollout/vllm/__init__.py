"""Rollout through vLLM, with the SRT proposer in its worker."""
