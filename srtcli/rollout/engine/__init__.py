"""srt's own batched speculative engine: slots, forwards, verification."""
