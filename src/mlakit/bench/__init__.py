"""Benchmarks (`mlakit bench ...`); they need a CUDA device."""
