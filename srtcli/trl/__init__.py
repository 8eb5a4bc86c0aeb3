"""srt inside TRL's `GRPOTrainer` (the `trl` extra): `rollout.srt_rollout_func`, a `rollout_func`
that generates with srt's embedded engine drafting from the per-prompt trees, and
`trainer.PackedGRPOTrainer`, whose per-token log-probs run each group as one packed prefix tree."""
