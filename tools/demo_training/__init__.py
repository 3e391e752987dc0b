"""Training code of the bundled demo model (tools/train_demo_model.py): its corpus, tasks, model,
training loop, evaluation and report. The demo's prompt generator (examples/demo) draws its tasks
from `tasks` too."""
