"""An output location that holds only the plan of a job that never committed anything.

A job writes `_job.json` when it plans, before its workers build their engines; with `local[N]` or
Ray a spec the engine then refuses (a max_model_len past the model's positions, a model folder
missing its tokenizer) fails after the plan is written. The corrected spec has another
fingerprint, and without this the location would refuse it as another job's output, although
nothing of that job exists but its plan. Such a location may be planned over, as with
job.start_over, when no commit marker or part is there and no run of it is still alive.
"""

from __future__ import annotations

from shardinfer.jobs.run_record import STALE_AFTER_S
from shardinfer.jobs.status import run_state
from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.job import open_store, output_exists
from shardinfer.writers.run_records import read_run_records


def only_an_unstarted_plan(config: JobConfig) -> bool:
    """True when the output location holds a plan but no marker, part or `_SUCCESS`, and runs of it
    were recorded, none of them still running. A plan without any run record may be a job that has
    just planned and not yet recorded its run: it is left alone."""
    if not output_exists(config):
        return False
    store = open_store(config)
    if store.read_job() is None or store.has_protocol_files():
        return False
    runs = read_run_records(store)
    return bool(runs) and all(run_state(run, STALE_AFTER_S) != "running" for run in runs)
