"""Model families and the checkpoint loader."""
