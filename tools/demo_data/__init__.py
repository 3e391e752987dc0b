"""Data, model, training and evaluation pieces of tools/train_demo_model.py."""
