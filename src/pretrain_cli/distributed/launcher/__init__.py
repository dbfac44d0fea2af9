"""The launcher side of a multi-process run, no Paddle at import: what `paddle.distributed.launch` told
this process (`launch`), a job's ports, verdicts and restart decision for scripts/launch.sh (`job`), each
rank's progress record (`progress`), and the rank watchers that name a dead or hung rank (`watchdog`: the rank's
side; `watcher`: the forked watcher; `verdict`: the evidence the host's watchers share and their one verdict)."""
