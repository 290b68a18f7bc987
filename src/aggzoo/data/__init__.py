"""Datasets in their real on-disk formats, transforms and samplers."""
