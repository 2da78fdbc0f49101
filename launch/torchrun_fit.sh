#!/usr/bin/env bash
# Multi-node pre-training with torchrun (run this on every node; Lightning reads torchrun's environment).
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 bash launch/torchrun_fit.sh recipes/dense_1b.yaml recipes/strategy/unified.yaml
# Ctrl-C or SIGTERM to torchrun reaches every worker: the run saves a checkpoint at the current step and
# exits (130 / 143); the same command resumes it (--ckpt_path last). The recipe's data_parallel_size: auto
# follows NNODES x GPUS_PER_NODE and its global_batch_tokens sets the gradient accumulation.
set -euo pipefail
RECIPE=${1:?usage: launch/torchrun_fit.sh <recipe.yaml> [<strategy.yaml>]}
STRATEGY=${2:-}
NNODES=${NNODES:-1}
GPUS=${GPUS_PER_NODE:-8}
.venv/bin/torchrun --nnodes="$NNODES" --node_rank="${NODE_RANK:-0}" --nproc_per_node="$GPUS" \
  --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${MASTER_PORT:-29500}" \
  -m scalevec_lit fit --config "$RECIPE" ${STRATEGY:+--config "$STRATEGY"} \
  --trainer.num_nodes="$NNODES" --trainer.devices="$GPUS" --ckpt_path=last
