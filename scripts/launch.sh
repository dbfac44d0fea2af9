#!/usr/bin/env bash
# Launch `scripts/run_pretrain.py` on this node with the right launcher flags for CPU or GPU.
#
#   scripts/launch.sh cfg.json [--key value ...]                 # one node: every GPU, or NPROC CPU processes
#   MASTER=10.0.0.1:8090 NNODES=2 NODE_RANK=0 scripts/launch.sh cfg.json   # on the master node
#   MASTER=10.0.0.1:8090 NNODES=2 NODE_RANK=1 scripts/launch.sh cfg.json   # on the other node
#
# Env: DEVICES (GPU ids, default: all visible; without a usable GPU one line says NPROC decides), NPROC (CPU
#      processes per node, default 1: with the fused CPU kernels one process using every core is the fastest layout,
#      docs/PERFORMANCE.md), MASTER, NNODES,
#      NODE_RANK (0 on the node that hosts MASTER: its port must be free), PYTHON,
#      LOG_DIR (the launcher's workerlog.N files; default <output_dir>/log, output_dir from --output_dir or the file,
#      JSON or YAML;
#      with MASTER set <output_dir>/log/node-<NODE_RANK> (node-<host name> without NODE_RANK), so nodes sharing
#      output_dir keep their workerlog.N apart),
#      MAX_RESTART (default 0: restart the job up to N times when it fails; each restart resumes from the newest
#      checkpoint of output_dir, or from resume_from_checkpoint's until the job wrote one past it; under
#      overwrite_output_dir: true it starts over until the job wrote one; a usage error (exit 2) is never retried,
#      a failed rendezvous always is, up to 3 times; also passed to the launcher as --max_restart),
#      RENDEZVOUS_TIMEOUT (several nodes: seconds a node waits at MASTER for the others, default 600, 0: no limit;
#      then one line says how far the meeting got, exit 75; a wait is said after 10 s),
#      LAUNCH_LOG_LEVEL (the launcher's own log level, default WARNING: its ~30 `LAUNCH INFO` lines of
#      configuration say nothing a user acts on; INFO brings them back), OMP_NUM_THREADS (threads per process:
#      kept as PRETRAIN_CLI_THREADS, since the launcher's own Paddle import pins OMP_NUM_THREADS=1 for every
#      worker; unset, each process takes cores / processes on this node, runtime.decide_threads).
# Fails fast, before starting the launcher, when MASTER's port is already taken on the master node
# (Paddle's launcher would otherwise treat the foreign listener as its master and wait forever).
# SIGTERM / SIGINT (a scheduler's preemption, Ctrl-C), to this script alone or to its whole process group: the ranks
# finish their step and save, and this script exits once they have, with the job's code (0: stopped and saved),
# never restarting it (a scheduler that saw this script end would take the job for ended and kill the rest).
# STOP_TIMEOUT (seconds the ranks get for that, default 900, 0: no limit; Paddle's launcher alone gives 30): ranks
# still running then are killed, said in one line, their checkpoint lost (scripts/paddle_launch.py). The ranks die
# with the launcher (SIGKILL to this script's process group kills it): none outlives it. What such a kill leaves in
# TMPDIR (this script's verdict directory, the launcher's join directory) the next launch on the host removes.
set -euo pipefail
# A stop by signal: passed on to the launcher as SIGUSR1 (for SIGTERM) / SIGUSR2 (SIGINT), which makes one stop of it
# whether or not the launcher got the signal itself (scripts/paddle_launch.py); the ranks are not in this process
# group (the launcher starts each in its own session). Before the launcher runs: exit 128 + the signal, nothing run.
stop=""      # TERM or INT once a signal asked the job to stop
launcher=""  # the launcher's pid while it runs
on_stop() {  # $1: the signal received, $2: the one the launcher is sent
  stop=${stop:-$1}
  if [ -n "$launcher" ]; then kill -s "$2" "$launcher" 2>/dev/null || true; fi
}
trap 'on_stop TERM USR1' TERM
trap 'on_stop INT USR2' INT
# A hang-up (the terminal closed, an ssh session dropped) is a SIGTERM stop; under nohup it stays ignored (bash keeps a
# signal ignored at its start so). What went to the terminal goes to /dev/null from then on: a write to a gone
# terminal fails (EIO), and under `set -e` a failed echo would end this script before its ranks.
tty_out=""; tty_err=""
if [ -t 1 ]; then tty_out=1; fi
if [ -t 2 ]; then tty_err=1; fi
on_hangup() {
  if [ -n "$tty_out" ]; then exec >/dev/null; fi
  if [ -n "$tty_err" ]; then exec 2>/dev/null; fi
  on_stop TERM USR1
}
trap on_hangup HUP
HERE="$(cd "$(dirname "$0")" && pwd)"
PY=${PYTHON:-python}
# This launch's verdict directory (below), in TMPDIR, named by this script's pid: making it first removes what
# launches killed with SIGKILL (no trap runs then) left there, their verdict and join directories
# (distributed/launcher/tempdirs.py).
verdicts=$("$PY" "$HERE/job.py" verdicts $$)
trap 'rm -rf "$verdicts"' EXIT
out=""  # the run's output_dir: from --output_dir, else the file
prev=""
for a in "$@"; do
  if [ "$prev" = "--output_dir" ]; then out=$a; fi
  case $a in --output_dir=*) out=${a#*=};; esac
  prev=$a
done
if [ -z "$out" ]; then  # the argument file read as the run reads it: JSON, or YAML by its name
  out=$("$PY" "$HERE/job.py" output_dir "${1:-}" 2>/dev/null || true)
fi
# A live run holding output_dir refuses this launch before the launcher opens its logs, which are that run's
# (output_dir/log). Asked on one node, and under MASTER on node 0, whose rank 0 takes the lock and has not started yet;
# another node's own job's rank 0 may hold it already (the nodes start together): not asked there.
if { [ -z "${MASTER:-}" ] || [ "${NODE_RANK:-}" = "0" ]; } && [ -n "$out" ]; then
  held=0
  "$PY" "$HERE/job.py" held "$out" || held=$?
  if [ "$held" -eq 2 ]; then exit 2; fi
fi
if [ -z "${LOG_DIR:-}" ]; then  # the run's own output_dir/log, not a stray ./log
  LOG_DIR=${out:+${out%/}/}log
  if [ -n "${MASTER:-}" ]; then  # every node writes workerlog.0..N-1: one directory per node on the shared output_dir
    LOG_DIR=$LOG_DIR/node-${NODE_RANK:-$(hostname)}
  fi
fi
args=(--log_dir "$LOG_DIR" --log_level "${LAUNCH_LOG_LEVEL:-WARNING}" --max_restart "${MAX_RESTART:-0}")
# The user's thread count survives the launcher's `import paddle`, which sets OMP_NUM_THREADS=1 when unset.
if [ -n "${OMP_NUM_THREADS:-}" ] && [ -z "${PRETRAIN_CLI_THREADS:-}" ]; then
  export PRETRAIN_CLI_THREADS=$OMP_NUM_THREADS
fi
# The launcher imports Paddle itself, which warns about a missing compiler cache it never uses.
export PYTHONWARNINGS="ignore:No ccache found${PYTHONWARNINGS:+,$PYTHONWARNINGS}"

if [ -n "${MASTER:-}" ]; then
  args+=(--master "$MASTER" --nnodes "${NNODES:-2}")
  if [ "${NODE_RANK:-}" = "0" ]; then
    host=${MASTER%:*}; port=${MASTER##*:}
    if "$PY" - "$host" "$port" <<'PYEOF'
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("" if sys.argv[1] not in ("127.0.0.1", "localhost") else sys.argv[1], int(sys.argv[2])))
except OSError:
    sys.exit(0)
sys.exit(1)
PYEOF
    then
      echo "launch.sh: --master port ${port} is already in use on this node (${MASTER}); stop the process that" \
           "holds it or pick another MASTER port" >&2
      exit 2
    fi
  fi
fi

if "$PY" -c "import paddle, sys
sys.exit(0 if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0 else 1)" 2>/dev/null; then
  if [ -z "${DEVICES:-}" ]; then
    n=$("$PY" -c "import paddle; print(paddle.device.cuda.device_count())" 2>/dev/null)
    DEVICES=$(seq -s, 0 $((n - 1)))
  fi
  args+=(--devices "$DEVICES")
else
  # CPU: `--devices` fails on CPU. One process per node: with the fused CPU kernels it uses every core and
  # beats one process per core; the math environment (threads, MKL's code path on AMD) is set by runtime.setup_env.
  if [ -n "${DEVICES:-}" ]; then  # GPU ids asked for here run NPROC CPU processes, not one per id: said
    echo "launch.sh: DEVICES=${DEVICES} names GPUs, but there is no usable GPU (or Paddle failed to import):" \
         "running NPROC=${NPROC:-1} CPU process(es); NPROC sets how many" >&2
  fi
  args+=(--nproc_per_node "${NPROC:-1}")
fi
# Every launch holds its own block of rendezvous ports (job.py ports: a host-wide lock per block, PORT_RANGE
# for the launcher), so two jobs started at once on this host never join each other's store.
# (paddle_launch.py: Paddle's launcher without its HTTP client's polling lines)
cmd=("$PY" "$HERE/job.py" ports -- "$PY" "$HERE/paddle_launch.py" "${args[@]}" "$HERE/run_pretrain.py" "$@")
max_restart=${MAX_RESTART:-0}
# Each rank records how it ended in $PRETRAIN_CLI_VERDICTS; job.py decide turns them into the job's exit code
# and the next action (Paddle's launcher exits with the lowest failed rank's code, often a rank stopped because
# another died): a usage error on any rank exits 2 and is never retried; a failed rendezvous is retried with
# new ports (up to 3 times, not counted as restarts); any other failure exits with the code of the rank that
# failed first, and restarts the job while MAX_RESTART allows (a killed or crashed rank makes Paddle's launcher
# stop the others; its own --max_restart only acts with an etcd master, docs/DISTRIBUTED.md). A restart
# resumes from the newest complete checkpoint (or resume_from_checkpoint's, until the job wrote a later one):
# `--overwrite_output_dir false` makes sure a run started with overwrite_output_dir: true continues rather than
# starting over, once the job has written a checkpoint of its own (before that, it starts over: job.py restart).
export PRETRAIN_CLI_VERDICTS=$verdicts
# the checkpoints output_dir holds before the first attempt (each as name:inode:ctime: under overwrite_output_dir the
# first attempt removes another run's checkpoint-8 and writes its own of that name): past a named
# resume_from_checkpoint, those a failed attempt wrote (none of these) are this job's own, which a restart continues
# from (job.py restart)
before=""
if [ "${MAX_RESTART:-0}" != "0" ]; then before=$("$PY" "$HERE/job.py" checkpoints "$out" "$@" 2>/dev/null || true); fi
attempt=0
rendezvous=0
extra=()
while true; do
  # (the last launch's: job.py cause reads them; a rank alone's notes of its progress and its stop: watchdog.py)
  rm -f "$verdicts"/rank-*.json "$verdicts"/killed-* "$verdicts"/start.* "$verdicts"/progress.* "$verdicts"/stopping.*
  if [ -n "$stop" ]; then exit $((128 + $(kill -l "$stop"))); fi
  # which restart this is (0: the first launch): rank 0, finding the lock the failed attempt left, says only where
  # that attempt ended, the failure being named by the line above (training/run_lock.py, `unfinished`)
  export PRETRAIN_CLI_RESTART=$attempt
  # In the background, so that a signal's trap runs while the job runs (with SIGINT not ignored, stdin kept)
  ( trap - INT TERM; exec "${cmd[@]}" ${extra[@]+"${extra[@]}"} ) <&0 &
  launcher=$!
  export PRETRAIN_CLI_STOP_NOTE_SAID=1  # (STOP_TIMEOUT=0's note: said by the first launcher only, stopping.py)
  while true; do
    rc=0
    wait "$launcher" || rc=$?
    if [ "$rc" -le 128 ] || ! kill -0 "$launcher" 2>/dev/null; then
      if [ "$rc" -gt 128 ]; then rc=0; wait "$launcher" || rc=$?; fi  # (its own status, had a trap ended the wait)
      break
    fi  # else a trap ended the wait: the launcher is stopping the ranks
  done
  launcher=""
  if [ "$rc" -eq 0 ]; then exit 0; fi
  read -r code action < <("$PY" "$HERE/job.py" decide "$verdicts" "$rc" 2>/dev/null || echo "$rc retry")
  # who ended the job and how, once, on stderr, with where its full log is (Paddle's report is left out:
  # distributed/launcher/failure_report.py)
  # (the user's arguments: the output settings of the re-run advice, for a lone rank's death its launcher recorded)
  "$PY" "$HERE/job.py" cause "$verdicts" "$LOG_DIR" "$@" >&2 2>/dev/null || true
  if [ -n "$stop" ]; then  # stopped by a signal: the ranks' code, no restart
    if [ "$action" != "stop" ] && { [ "$rc" -eq 138 ] || [ "$rc" -eq 140 ]; }; then  # SIGUSR1/2 before any rank
      code=$((128 + $(kill -l "$stop")))
    fi
    exit "$code"
  fi
  if [ "$action" = "stop" ]; then exit "$code"; fi
  if [ "$action" = "rendezvous" ] && [ "$rendezvous" -lt 3 ]; then
    rendezvous=$((rendezvous + 1))
    echo "launch.sh: the ranks could not join the process group; trying again with new ports ($rendezvous of 3)" >&2
    continue
  fi
  if [ "$attempt" -ge "$max_restart" ]; then
    if [ "$max_restart" -gt 0 ]; then
      echo "launch.sh: the job failed (exit $code) after $attempt restart(s); giving up (MAX_RESTART=$max_restart)" >&2
    fi
    exit "$code"
  fi
  attempt=$((attempt + 1))
  # what it starts from: output_dir's newest complete checkpoint, or step 0 when it holds none; with
  # resume_from_checkpoint set, that one, or the newest this job wrote past it (passed as resume_from_checkpoint:
  # as named, it is refused beside them); and the user's own overwrite_output_dir and resume_from_checkpoint, which the
  # ranks' advice to re-run the same command names, not the restart's (rerun.as_set). Under the user's
  # overwrite_output_dir: true, until the job wrote a checkpoint, the user's command as typed (keep-overwrite): it
  # starts over as the first attempt did, which may have failed before its overwrite removed another run's checkpoints
  resume=""; from=""; own=""; keep=""
  { read -r resume; read -r from; read -r own; read -r keep; } \
    < <("$PY" "$HERE/job.py" restart "$out" "$before" "$@" 2>/dev/null) || true
  export PRETRAIN_CLI_AS_SET=$own
  extra=()
  if [ "$keep" != "keep-overwrite" ]; then extra+=(--overwrite_output_dir false); fi
  if [ -n "$resume" ]; then extra+=(--resume_from_checkpoint "$resume"); fi
  echo "launch.sh: the job failed (exit $code); restart $attempt of $max_restart, to ${from:-resume from the newest" \
       "complete checkpoint of output_dir, if any}" >&2
done
