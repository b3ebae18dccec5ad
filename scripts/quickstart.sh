#!/usr/bin/env bash
# The README's main job: installs what is missing (as root), builds lockstep, turns Debian's
# Fashion-MNIST into HDF5 shards, and trains configs/quickstart.ini with 2 MPI ranks, ending with
# the test accuracy. Extra arguments go to lockstep-train (e.g. --train.epochs=1).
#   RANKS=4 scripts/quickstart.sh      more ranks (oversubscribed on small machines)
#   CONFIG=configs/fashion_cnn.ini scripts/quickstart.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
RANKS=${RANKS:-2}
CONFIG=${CONFIG:-configs/quickstart.ini}
"$ROOT/scripts/install-deps.sh"
"$ROOT/scripts/build.sh"
if ! ls data/fashion-mnist/train-*-of-*.h5 >/dev/null 2>&1 || ! ls data/fashion-mnist/test-*-of-*.h5 >/dev/null 2>&1; then
  echo "quickstart: writing Fashion-MNIST shards to data/fashion-mnist/" >&2
  build/apps/lockstep-shard fashion-mnist --out=data/fashion-mnist --shards=4
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Workers that sleep instead of spinning: ranks share cores (see docs/PERFORMANCE.md).
export OMP_WAIT_POLICY=PASSIVE
echo "quickstart: mpirun -np $RANKS build/apps/lockstep-train --config $CONFIG $*" >&2
mpirun -np "$RANKS" --oversubscribe --bind-to none build/apps/lockstep-train --config "$CONFIG" "$@"
