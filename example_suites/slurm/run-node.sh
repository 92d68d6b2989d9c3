#!/bin/sh
# One srun task per node: a node agent on every node but the first, pytest (the driver) on the
# first. The driver uses the other nodes' agents (--tfgrpc-agents=slurm); when it ends, srun's
# --wait ends the agents, and each agent stops whatever it still runs.
#
#   srun --nodes=5 --ntasks-per-node=1 --wait=30 run-node.sh ib0 ~/.tfgrpc-token suite/ ...
#
# Arguments: the fabric (interface) on every node, the shared token file, then pytest's.
set -eu
fabric=$1
token=$2
shift 2
if [ "${SLURM_NODEID:?run this under srun}" -ne 0 ]; then
    exec tfgrpc-node --fabric "$fabric" --token-file "$token"
fi
exec "${PYTHON:-python3}" -m pytest --fabric="$fabric" --tfgrpc-agents=slurm \
    --tfgrpc-agent-token-file="$token" "$@"
