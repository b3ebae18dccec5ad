#!/usr/bin/env bash
# Raw against encoded image shards (docs/IMAGES.md, "Storage"): size on disk, and what each costs
# the loader per image, over the same generated photos as the conversion table.
#   1. COUNT (300) generated 500x375 JPEGs of quality 90 (make_test_images photos), one class;
#   2. converted at --resize=224 and 64, --store=raw and --store=encoded (1 rank, 1 thread);
#      size of the shards (du --apparent-size);
#   3. lockstep-bench loader, on demand, 1 loader thread and 1 decode thread, batch 32, median of
#      3 epochs: plain (evaluation: encoded decodes + resizes + center-crops), and with
#      random-resized-crop + flip (training); ms/image = 1000 / samples/s.
#   bench/image-loader.sh                 build/, results in results/image-loader/
#   BUILD=build-cpu COUNT=100 bench/image-loader.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
COUNT=${COUNT:-300}
OUT=${OUT:-$ROOT/results/image-loader}
SHARD=$BUILD/apps/lockstep-shard
BENCH=$BUILD/apps/lockstep-bench
MAKE=$BUILD/tests/make_test_images
for t in "$SHARD" "$BENCH" "$MAKE"; do
  [ -x "$t" ] || { echo "image-loader.sh: no $t (build first)" >&2; exit 1; }
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-image-loader.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT" "$WORK/photos/c0"
"$MAKE" photos "$WORK/photos/c0" "$COUNT"
jpeg_bytes=$(du -sb --apparent-size "$WORK/photos/c0" | cut -f1)

SUMMARY=$OUT/summary.md
{
  echo "# bench/image-loader.sh: $COUNT 500x375 JPEGs ($((jpeg_bytes / 1000)) kB), $(nproc) cores, $(date -u +%F)"
  echo
  echo "| --resize | storage | on disk | loader ms/image (eval) | loader ms/image (RRC + flip) |"
  echo "| --- | --- | --- | --- | --- |"
} >"$SUMMARY"
for side in 224 64; do
  for store in raw encoded; do
    set_dir=$WORK/$store-$side
    "$SHARD" images --root="$WORK/photos" --out="$set_dir" --resize="$side" --store="$store" \
      --threads=1 >"$OUT/convert-$store-$side.log"
    bytes=$(du -sb --apparent-size "$set_dir" | cut -f1)
    ms=()
    for aug in "" "--rrc=1 --flip=1"; do
      # shellcheck disable=SC2086
      "$BENCH" loader --data="$set_dir/train" --batch=32 --reps=3 --consume=0 $aug \
        --out="$OUT/loader-$store-$side${aug:+-aug}.json" 2>"$OUT/loader-$store-$side${aug:+-aug}.log"
      rate=$(sed -n 's/^on-demand *[0-9.]* *\([0-9]*\).*/\1/p' "$OUT/loader-$store-$side${aug:+-aug}.log")
      ms+=("$(awk -v r="$rate" 'BEGIN { printf "%.2f", 1000 / r }')")
    done
    echo "| $side | $store | $(awk -v b="$bytes" 'BEGIN { printf "%.1f MB", b / 1e6 }') | ${ms[0]} | ${ms[1]} |" >>"$SUMMARY"
  done
done
cat "$SUMMARY"
