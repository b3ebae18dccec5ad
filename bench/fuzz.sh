#!/usr/bin/env bash
# Fuzzes lockstep's readers with libFuzzer (clang 14), one target at a time, at nice 19.
#   bench/fuzz.sh [SECONDS] [TARGET...]     default: 60 s each for every target
# Targets: idx csv config model_spec shard checkpoint (docs/FUZZING.md says what each feeds).
#
# Builds build-fuzz/ (clang, the library with -fsanitize=fuzzer-no-link,address,undefined), runs
# each target for SECONDS over a working corpus (build-fuzz/corpus/<target>, seeded from the
# committed corpus, the regressions and fresh seeds) with its dictionary, then merges the working
# corpus into a minimal set that keeps every feature (the next run's working corpus) and writes
# the FUZZ_KEEP (default 10) inputs covering the most of it to tests/fuzz/corpus/<target>/
# (committed, replayed by CTest: kept small). Crashes, leaks, timeouts and OOMs land in
# build-fuzz/artifacts/<target>/; the script lists them and exits 1. After fixing one, copy the
# input to tests/fuzz/regressions/<target>/ so CI replays it forever.
# Every run appends "date target wall-seconds cpu-seconds execs new-findings" to
# build-fuzz/fuzz-log.tsv.
# Environment: FUZZ_JOBS (default 1) parallel fuzzing processes per target; FUZZ_ARGS extra
# libFuzzer flags; FUZZ_KEEP inputs per target in tests/fuzz/corpus; FUZZ_NO_MERGE=1 keeps
# tests/fuzz/corpus and the working corpus as they are.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ALL=(idx csv config model_spec shard checkpoint)
SECONDS_EACH=${1:-60}
[[ "$SECONDS_EACH" =~ ^[0-9]+$ ]] || { echo "usage: bench/fuzz.sh [SECONDS] [TARGET...]" >&2; exit 2; }
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (have: ${ALL[*]})" >&2; exit 2; }
done

"$ROOT/scripts/install-deps.sh" --fuzz
BUILD=${LOCKSTEP_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
    -DLOCKSTEP_CUDA=OFF -DLOCKSTEP_FUZZ=ON -DLOCKSTEP_TESTS=ON >/dev/null
fi
JOBS=$(( $(nproc) < 2 ? $(nproc) : 2 ))
nice -n 19 cmake --build "$BUILD" -j "$JOBS" --target fuzz_make_seeds \
  $(printf 'fuzz_%s ' "${TARGETS[@]}")

SEEDS="$BUILD/seeds"
# Made afresh each run, so the seeds follow the writers' current format (shards, checkpoints).
rm -rf "$SEEDS" && "$BUILD/tests/fuzz/fuzz_make_seeds" "$SEEDS" >/dev/null

# UBSan reports are fatal; ASan's defaults come from tests/fuzz/harness/fuzz_options.cpp.
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
status=0
for t in "${TARGETS[@]}"; do
  FUZZ="$ROOT/tests/fuzz"
  WORK="$BUILD/corpus/$t"
  ART="$BUILD/artifacts/$t"
  mkdir -p "$WORK" "$ART" "$FUZZ/corpus/$t"
  for src in "$SEEDS/$t" "$FUZZ/corpus/$t" "$FUZZ/regressions/$t"; do
    [ -d "$src" ] && find "$src" -maxdepth 1 -type f -exec cp -n {} "$WORK/" \;
  done
  before=$(ls "$ART" | wc -l)
  log="$BUILD/fuzz-$t.log"
  echo "fuzz.sh: $t for ${SECONDS_EACH}s (log $log; load: $(cut -d' ' -f1-3 /proc/loadavg))"
  # -timeout: one input taking longer (wall clock, so generous on a loaded machine) is a hang;
  # -rss_limit_mb bounds the whole process.
  # Several jobs (FUZZ_JOBS > 1) share the working corpus; each logs to $BUILD/fuzz-N.log.
  PAR=()
  [ "${FUZZ_JOBS:-1}" -gt 1 ] && PAR=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
  rm -f "$BUILD"/fuzz-[0-9]*.log
  # CPU seconds, not wall seconds, are what a run is worth on a shared machine at nice 19: bash's
  # `time` counts every process the fuzzer waited for (the -fork and -jobs children too).
  set +e
  TIMEFORMAT='%R %U %S'
  { time (cd "$BUILD" && nice -n 19 "$BUILD/tests/fuzz/fuzz_$t" "$WORK" -dict="$FUZZ/dict/$t.dict" \
    -max_total_time="$SECONDS_EACH" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=512 \
    -artifact_prefix="$ART/" -print_final_stats=1 "${PAR[@]}" ${FUZZ_ARGS:-} >"$log" 2>&1); } \
    2>"$BUILD/time-$t"
  rc=$?
  set -e
  cpu=$(awk '{printf "%.0f", $2 + $3}' "$BUILD/time-$t")
  # -fork mode prints no final stats: its last "#N:" status line counts the executions.
  execs=$({ cat "$log" "$BUILD"/fuzz-[0-9]*.log 2>/dev/null || true; } |
          awk '/stat::number_of_executed_units/ {s += $2; st = 1}
               /^#[0-9]+: cov:/ {f = substr($1, 2) + 0}
               END {print st ? s : f + 0}')
  after=$(ls "$ART" | wc -l)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -Is)" "$t" "$SECONDS_EACH" "$cpu" "$execs" \
    "$((after - before))" >>"$BUILD/fuzz-log.tsv"
  if [ "$rc" -ne 0 ] || [ "$after" -gt "$before" ]; then
    echo "fuzz.sh: $t found something (exit $rc): $ART" >&2
    grep -m3 -E 'ERROR|runtime error|property violated|uncaught|deadly' "$log" >&2 || true
    status=1
  fi
  if [ "${FUZZ_NO_MERGE:-0}" != 1 ]; then
    # The committed + working corpus is merged into a minimal set with the same coverage, which
    # becomes the next run's working corpus; the committed corpus (in git, replayed by every
    # CTest run) gets only the FUZZ_KEEP inputs that cover the most of it.
    MERGED="$BUILD/merged/$t"
    rm -rf "$MERGED" "$BUILD/merge-$t.ctl" && mkdir -p "$MERGED"
    nice -n 19 "$BUILD/tests/fuzz/fuzz_$t" -merge=1 -timeout=30 -rss_limit_mb=2048 \
      -malloc_limit_mb=512 -merge_control_file="$BUILD/merge-$t.ctl" "$MERGED" \
      "$FUZZ/corpus/$t" "$WORK" >"$BUILD/merge-$t.log" 2>&1 ||
      { echo "fuzz.sh: merge of $t failed, see $BUILD/merge-$t.log" >&2; status=1; continue; }
    rm -rf "$BUILD/picked/$t"
    kept=$("$ROOT/bench/fuzz-pick-seeds.py" "$BUILD/merge-$t.ctl" "${FUZZ_KEEP:-10}" \
           "$BUILD/picked/$t")
    find "$FUZZ/corpus/$t" -maxdepth 1 -type f -delete
    cp "$BUILD/picked/$t"/* "$FUZZ/corpus/$t/"
    rm -rf "$WORK" && mv "$MERGED" "$WORK"
    echo "fuzz.sh: $t: $execs inputs in ${cpu} CPU-s; working corpus $(ls "$WORK" | wc -l)" \
      "files; tests/fuzz/corpus/$t: $kept, $(( $(cat "$FUZZ/corpus/$t"/* | wc -c) / 1024 )) KiB"
  fi
done
exit $status
