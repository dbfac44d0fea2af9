"""The launcher side of a multi-process run, no Paddle at import: what `paddle.distributed.launch` told this process,
and a launched rank's tie to its launcher (`launch`); for scripts/launch.sh, the ranks' verdicts and the job's exit code
and restart decision (`job`), the block of ports a launch holds (`ports`) and the console's one account of the job's
end (`account`, quoting `rank_log`); what scripts/paddle_launch.py adds to Paddle's launcher: the nodes' limited meeting
at MASTER (`rendezvous`), the watch of their join after it, which names a node lost or late (`joining`), how a node that
leaves before the join ends and the others after it (`leaving`), the nodes' beats while the ranks run, which name a
node lost meanwhile (`after_join`), a rank's own limit on the join where no launcher watches it (`join_deadline`,
saying who of its host it waits for: `join_wait`), and the time its ranks get to stop after a signal (`stopping`);
what a re-run starts from, for the lines that advise one (`rerun`); the launch's directories in TMPDIR, removed after a
SIGKILL by the next launch (`tempdirs`); each rank's progress record (`progress`); and the rank watchers that name a
dead or hung rank (`watchdog`: the rank's side; `watcher`: the forked watcher; `verdict`: the evidence the host's
watchers share and their one verdict; `verdict_line`: the words of the watchers' lines)."""
