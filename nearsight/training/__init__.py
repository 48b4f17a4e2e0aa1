"""Losses, batch samplers, the trainer and the reproduction configs."""
