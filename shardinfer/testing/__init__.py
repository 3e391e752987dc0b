"""Helpers that build small local checkpoints for tests, benchmarks and the offline demo."""
