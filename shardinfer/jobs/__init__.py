"""The job front end: TOML job specs, the `shardinfer` CLI, local executors, progress and exit codes."""
