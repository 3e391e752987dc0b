"""Helpers for tests, benchmarks and the offline demo: small local checkpoints (tiny_checkpoint) and
the crash tests' fault injection (faults)."""
