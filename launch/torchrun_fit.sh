#!/usr/bin/env bash
# Multi-node pre-training with torchrun (run the same command on every node; Lightning reads torchrun's environment).
#   NNODES=2 MASTER_ADDR=node0 bash launch/torchrun_fit.sh recipes/dense_1b.yaml recipes/strategy/unified.yaml
# Options after the recipe and strategy go to `fit` (pass "" as the strategy to give options without one).
# Restart policy: the nodes meet through torchrun's elastic rendezvous (c10d, at MASTER_ADDR:MASTER_PORT; the
# node ranks are assigned there). When a worker fails (a rank killed, a node lost, a peer silent for
# PEER_TIMEOUT seconds: exit 75), torchrun stops the other workers and starts them all again, up to
# MAX_RESTARTS times; each start resumes from the newest complete checkpoint (--ckpt_path last), so the job
# finishes by itself. Ctrl-C or SIGTERM to torchrun reaches every worker: the run saves a checkpoint at the
# current step and exits (130 / 143); the same command resumes it. The recipe's data_parallel_size: auto
# follows NNODES x GPUS_PER_NODE and its global_batch_tokens sets the gradient accumulation.
set -euo pipefail
RECIPE=${1:?usage: launch/torchrun_fit.sh <recipe.yaml> [<strategy.yaml>] [fit options...]}
STRATEGY=${2:-}
shift $(( $# < 2 ? $# : 2 ))
NNODES=${NNODES:-1}
# Elastic: NNODES=MIN:MAX (e.g. 1:2) lets the job go on with the hosts it has. torchrun's rendezvous waits for MIN
# nodes, then up to last_call_timeout (RDZV_CONF, default torchrun's 30 s) for more; after a host is lost (its
# workers exit 75 or die) every restart meets with the hosts left, fit takes the nodes of that start
# (--trainer.num_nodes=auto) and resumes --ckpt_path last, the global batch kept (the accumulation follows); a
# host started again joins at once (torchrun restarts the group when a node waits). RDZV_CONF is passed to
# --rdzv-conf, e.g. RDZV_CONF=last_call_timeout=10,join_timeout=600.
case "$NNODES" in *:*) FIT_NODES=auto ;; *) FIT_NODES=$NNODES ;; esac
GPUS=${GPUS_PER_NODE:-8}
TORCHRUN=${TORCHRUN:-.venv/bin/torchrun}
# Each start gets a store of its own (rank 0 hosts it on a fresh port): the store torchrun's agents share keeps
# the previous start's gloo addresses, and a restarted group would read them and fail to connect.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}
# The launcher exits as fit does: torchrun exits 1 for any failed worker, so a worker that stops because another
# rank was lost (exit 75) leaves a note in SCALEVEC_LOST_NOTE and this script then exits 75. On a host cut off from
# the rendezvous host, torchrun's agent stays blocked in a call to the rendezvous store after its worker has left
# (c10d's client does not time out on a silent connection): once the last start's worker has left with 75, the agent
# gets AGENT_GRACE seconds (default 30) to end, and is then killed (one line, exit 75). torchrun runs in a process
# group of its own; TERM, INT, HUP, QUIT, USR1 and USR2 sent to this script are passed on to it.
NOTES=$(mktemp -d "${TMPDIR:-/tmp}/scalevec-torchrun.XXXXXX")
trap 'rm -rf "$NOTES"' EXIT
export SCALEVEC_LOST_NOTE="$NOTES/lost"
LAST_START=${MAX_RESTARTS:-3}
GRACE=${AGENT_GRACE:-30}
set -m
"$TORCHRUN" --nnodes="$NNODES" --nproc-per-node="$GPUS" \
  --rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR:-127.0.0.1}:${MASTER_PORT:-29500}" \
  --rdzv-id="${RUN_ID:-scalevec}" --max-restarts="$LAST_START" ${RDZV_CONF:+--rdzv-conf="$RDZV_CONF"} \
  -m scalevec_lit fit --config "$RECIPE" ${STRATEGY:+--config "$STRATEGY"} \
  --trainer.num_nodes="$FIT_NODES" --trainer.devices="$GPUS" --peer_timeout="${PEER_TIMEOUT:-300}" \
  --ckpt_path=last "$@" &
AGENT=$!
set +m
for SIG in TERM INT HUP QUIT USR1 USR2; do trap "kill -s $SIG $AGENT 2>/dev/null || true" "$SIG"; done
while kill -0 "$AGENT" 2>/dev/null; do
  sleep 1 || true
  for NOTE in "$NOTES"/lost.*; do
    [ -f "$NOTE" ] && [ "$(cat "$NOTE" 2>/dev/null)" = "$LAST_START" ] || continue
    AGE=$(( $(date +%s) - $(stat -c %Y "$NOTE" 2>/dev/null || date +%s) ))
    if [ "$AGE" -ge "$GRACE" ] && kill -0 "$AGENT" 2>/dev/null; then
      echo "error: launch/torchrun_fit.sh: torchrun: still running ${AGE} s after its worker left with exit 75 (a" \
        "rank lost, its line above); its agent waits for the rendezvous host ${MASTER_ADDR:-127.0.0.1}, which is down" \
        "or cut off from this host; stopped it (exit 75); resume with the same command once the hosts can reach" \
        "each other" >&2
      kill -KILL -- "-$AGENT" 2>/dev/null || kill -KILL "$AGENT" 2>/dev/null || true
      wait "$AGENT" 2>/dev/null || true
      exit 75
    fi
  done
done
CODE=0
wait "$AGENT" || CODE=$?
if [ "$CODE" -ne 0 ] && compgen -G "$NOTES/lost.*" >/dev/null; then
  exit 75  # a worker of the last start left because a rank was lost (torchrun says 1)
fi
exit "$CODE"
