"""Errors the engine raises for things a user can get wrong; each message names the value and the fix."""


class ShardinferError(Exception):
    """Base of the errors below."""


class ModelLoadError(ShardinferError, ValueError):
    """A model directory that cannot be loaded: missing file, unsupported architecture, bad config."""


class CheckpointError(ModelLoadError):
    """A checkpoint whose tensors do not match the model: missing, unexpected or mis-shaped."""
