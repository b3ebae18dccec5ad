"""Helper of bench/device-coverage.sh: gcov's per-line counts of src/{train,parallel,comm}, and the
share of device-only lines that the suite executes (see the script's header for the definition).
  device_coverage.py collect BUILD ROOT OUT.json
  device_coverage.py report A.json B.json OUT.json
"""
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile

LAYERS = ("train", "parallel", "comm")  # src/dist became src/parallel (issue 32)


def collect(build, root, out):
    files = {}
    for layer in LAYERS:
        gcdas = glob.glob(os.path.join(build, "CMakeFiles", f"lockstep_{layer}.dir", "**", "*.gcda"),
                          recursive=True)
        if not gcdas:  # a renamed layer must not drop out of the figure unnoticed
            sys.exit(f"device_coverage.py: no gcov data for src/{layer} (lockstep_{layer}.dir) in {build}")
        with tempfile.TemporaryDirectory() as tmp:
            for gcda in gcdas:
                subprocess.run(["gcov", "--json-format", "-o", os.path.dirname(gcda), gcda],
                               cwd=tmp, check=True, capture_output=True)
            for path in glob.glob(os.path.join(tmp, "*.gcov.json.gz")):
                with gzip.open(path) as f:
                    data = json.load(f)
                for entry in data["files"]:
                    name = os.path.relpath(os.path.realpath(os.path.join(data.get("current_working_directory", ""), entry["file"])), root)
                    if not any(name.startswith(f"src/{l}/") for l in LAYERS):
                        continue
                    rec = files.setdefault(name, {"lines": {}, "functions": []})
                    for line in entry["lines"]:
                        n = str(line["line_number"])
                        rec["lines"][n] = rec["lines"].get(n, 0) + line["count"]
                    for fn in entry["functions"]:
                        rec["functions"].append({"name": fn["demangled_name"], "start": fn["start_line"],
                                                 "end": fn["end_line"], "count": fn["execution_count"]})
    with open(out, "w") as f:
        json.dump(files, f)


def entered(rec, line):
    """Functions (start, end) containing `line` that ran."""
    return [fn for fn in rec["functions"] if fn["start"] <= line <= fn["end"] and fn["count"] > 0]


def report(a_path, b_path, out):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    rows, total_run, total_missed, total_missed_nccl = [], 0, 0, 0
    for name in sorted(b):
        rb, ra = b[name], a.get(name, {"lines": {}, "functions": []})
        ran_a = {int(l) for l, c in ra["lines"].items() if c > 0}
        ran_b = {int(l) for l, c in rb["lines"].items() if c > 0}
        executable = {int(l) for l in rb["lines"]}
        device_run = ran_b - ran_a
        if name.startswith("src/comm/cuda/"):
            missed = executable - ran_b
            nccl = len(missed)
        else:
            # Functions only B entered are device-only; their lines B did not run are missed.
            a_funcs = {(fn["name"], fn["start"]) for fn in ra["functions"] if fn["count"] > 0}
            device_funcs = [fn for fn in rb["functions"]
                            if fn["count"] > 0 and (fn["name"], fn["start"]) not in a_funcs]
            missed = {l for l in executable - ran_b
                      if any(fn["start"] <= l <= fn["end"] for fn in device_funcs)}
            nccl = 0
        if device_run or missed:
            rows.append((name, len(device_run), len(missed)))
        total_run += len(device_run)
        total_missed += len(missed)
        total_missed_nccl += nccl
    share = total_run / max(total_run + total_missed, 1)
    share_generic = total_run / max(total_run + total_missed - total_missed_nccl, 1)
    print("| file | device-only lines run | device-only lines not run |")
    print("| --- | --- | --- |")
    for name, run, missed in rows:
        print(f"| {name} | {run} | {missed} |")
    print(f"| all | {total_run} | {total_missed} (of which NCCL home {total_missed_nccl}) |")
    print(f"share run: {100 * share:.1f}% ({total_run} of {total_run + total_missed}); "
          f"without the NCCL home (needs a GPU): {100 * share_generic:.1f}%")
    json.dump({"rows": rows, "run": total_run, "missed": total_missed, "missed_nccl": total_missed_nccl,
               "share": share, "share_without_nccl": share_generic}, open(out, "w"), indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "collect":
        collect(*sys.argv[2:5])
    elif sys.argv[1] == "report":
        report(*sys.argv[2:5])
    else:
        sys.exit(__doc__)
