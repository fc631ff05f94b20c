"""Analyses over model pairs: layer-wise comparison (and, later, sensitivity and calibration)."""
