"""Rollout: prompts -> speculative generation -> steps pool."""
