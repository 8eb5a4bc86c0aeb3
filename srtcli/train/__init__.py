"""Training: PPO-clip steps over packed shards or a raw steps pool."""
