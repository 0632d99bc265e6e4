"""Tensor and pipeline parallelism: one worker's model over a group of rank processes (``group``)."""
