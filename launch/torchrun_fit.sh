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
GPUS=${GPUS_PER_NODE:-8}
TORCHRUN=${TORCHRUN:-.venv/bin/torchrun}
# Each start gets a store of its own (rank 0 hosts it on a fresh port): the store torchrun's agents share keeps
# the previous start's gloo addresses, and a restarted group would read them and fail to connect.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}
exec "$TORCHRUN" --nnodes="$NNODES" --nproc-per-node="$GPUS" \
  --rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR:-127.0.0.1}:${MASTER_PORT:-29500}" \
  --rdzv-id="${RUN_ID:-scalevec}" --max-restarts="${MAX_RESTARTS:-3}" \
  -m scalevec_lit fit --config "$RECIPE" ${STRATEGY:+--config "$STRATEGY"} \
  --trainer.num_nodes="$NNODES" --trainer.devices="$GPUS" --peer_timeout="${PEER_TIMEOUT:-300}" \
  --ckpt_path=last "$@"
