#!/usr/bin/env bash
# fault_hung_rank.sh with dist.algorithm = hierarchical: the node barriers and leader allreduces
# of the two-level allreduce are under dist.timeout_s too, so a stopped rank is reported and
# ends the job instead of leaving its peers in a blocking MPI_Barrier forever.
# Usage: bash tests/scripts/fault_hung_rank_hierarchical.sh BUILD_DIR   Exit: 0, 1, or 77 skipped.
HUNG_RANK_ARGS="--dist.algorithm=hierarchical" exec bash "$(dirname "${BASH_SOURCE[0]}")/fault_hung_rank.sh" "$@"
