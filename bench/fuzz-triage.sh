#!/usr/bin/env bash
# Groups the findings bench/fuzz.sh saved (build-fuzz/artifacts/<target>/) by cause: each input
# is rerun once (30 s limit) and reduced to "kind @ place", the place being the first stack frame
# in lockstep's code, else the first named frame (HDF5's), else the checked property.
#   bench/fuzz-triage.sh [TARGET...]     prints: count, kind @ place, one example input
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${LOCKSTEP_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(idx csv config model_spec shard checkpoint)
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${TARGETS[@]}"; do
  dir="$BUILD/artifacts/$t"
  [ -d "$dir" ] || continue
  echo "== $t: $(ls "$dir" | wc -l) saved inputs"
  for f in "$dir"/*; do
    out=$(timeout 30 "$BUILD/tests/fuzz/fuzz_$t" -runs=1 -rss_limit_mb=2048 -malloc_limit_mb=512 \
          "$f" 2>&1)
    rc=$?
    kind=$(grep -m1 -E 'ERROR: (Address|Leak)Sanitizer|runtime error|fuzz property violated|terminate called|ERROR: libFuzzer' <<<"$out" |
           sed -E 's/^==[0-9]+==//; s/ on (unknown )?address.*//; s/0x[0-9a-f]+//g; s/[0-9][0-9.e+]*/N/g' |
           cut -c1-110)
    [ "$rc" -eq 124 ] && kind="timeout (over 30 s)"
    [ -z "$kind" ] && kind="no longer reproduces"
    # The first named HDF5 frame (if any) and the first frame in lockstep's own code.
    frames=$(grep -E '^ +#[0-9]+ 0x[0-9a-f]+ in ' <<<"$out" |
             sed -E 's/^ +#[0-9]+ 0x[0-9a-f]+ in //; s/\(anonymous namespace\)/{anon}/g; s/\(.*//')
    h5=$(grep -m1 -E '^H5' <<<"$frames" || true)
    own=$(grep 'lockstep::' <<<"$frames" | grep -v -m1 'lockstep::fuzz' || true)
    [ -n "$h5$own" ] && kind="$kind @ ${h5:+$h5 <- }${own}"
    printf '%s\t%s\n' "$kind" "$(basename "$f")"
  done | sort | awk -F'\t' '{n[$1]++; ex[$1] = $2} END {for (k in n) printf "%5d  %s  (e.g. %s)\n", n[k], k, ex[k]}' |
    sort -rn
done
