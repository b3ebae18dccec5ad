#!/usr/bin/env python3
"""Picks the handful of inputs kept in tests/fuzz/corpus/<target>/ from a libFuzzer merge.

    bench/fuzz-pick-seeds.py CONTROL_FILE COUNT OUT_DIR

CONTROL_FILE is what `fuzz_<target> -merge=1 -merge_control_file=CONTROL_FILE ...` wrote: the
input files, then the coverage features each one reached. The committed corpus is replayed by
every CTest run and lives in git, so it stays small: this copies to OUT_DIR the COUNT inputs that
greedily cover the most features (ties: the smaller file), and prints what share of the merged
corpus's features they keep. The full corpus stays in build-fuzz/ for the next fuzzing run.
"""
import os
import shutil
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    control, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(control) as f:
        lines = f.read().splitlines()
    num_files = int(lines[0])
    files = lines[2:2 + num_files]
    features = {}
    for line in lines[2 + num_files:]:
        parts = line.split()
        if parts and parts[0] == "FT":
            features[int(parts[1])] = set(parts[2:])
    every = set().union(*features.values()) if features else set()
    covered, chosen = set(), []
    while len(chosen) < count:
        best = max(features, default=None,
                   key=lambda i: (len(features[i] - covered), -os.path.getsize(files[i])))
        if best is None or not features[best] - covered:
            break
        covered |= features.pop(best)
        chosen.append(files[best])
    os.makedirs(out, exist_ok=True)
    for path in chosen:
        shutil.copy(path, out)
    share = 100.0 * len(covered) / len(every) if every else 100.0
    print(f"{len(chosen)} of {num_files} inputs keep {len(covered)} of {len(every)} features "
          f"({share:.0f}%)")


if __name__ == "__main__":
    main()
