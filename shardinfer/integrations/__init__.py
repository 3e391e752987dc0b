"""Adapters that let other tools drive the engine (lm-evaluation-harness: `integrations.lm_eval`)."""
