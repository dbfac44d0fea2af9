"""Training a prepared run: the build order (`run`), the loop (`trainer`), optimizer, precision,
evaluation, checkpoints, metrics, and the final output directory (`export`)."""
