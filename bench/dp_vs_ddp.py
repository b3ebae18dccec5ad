#!/usr/bin/env python3
"""Helper of bench/dp-vs-ddp.sh (python3 standard library only).

  dp_vs_ddp.py watch --metrics F --from-step A --to-step B --out F.json -- CMD...
      Runs CMD and samples the CPU time of every thread of every lockstep-train process it
      starts (DP: one process; DDP: one per rank, under mpirun). The utilisation window is
      [the metrics record of step A, the record of step B], i.e. the measured steps without
      start-up, data loading and warm-up. Exits with CMD's exit status.

  dp_vs_ddp.py summarize DIR
      Reads DIR/runs.jsonl (one line per run, written by dp-vs-ddp.sh) and every run's metrics
      and CPU files; writes DIR/summary.json, DIR/table.md and the gnuplot data files
      DIR/throughput.dat, DIR/split.dat and DIR/cpu.dat.
"""
import glob
import json
import os
import statistics
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
POLL_S = 0.05


# ----------------------------------------------------------------------------- watch
def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _stat_fields(text):
    # /proc/.../stat: "pid (comm) state ppid ..."; comm may contain spaces and parentheses.
    close = text.rfind(")")
    comm = text[text.find("(") + 1:close]
    return comm, text[close + 2:].split()


def _children_map():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        text = _read(f"/proc/{d}/stat")
        if text is None:
            continue
        _, rest = _stat_fields(text)
        kids.setdefault(int(rest[1]), []).append(int(d))
    return kids


def _descendants(root):
    kids, out, todo = _children_map(), [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _trainer_pids(root):
    pids = []
    for pid in _descendants(root):
        text = _read(f"/proc/{pid}/stat")
        if text is not None and _stat_fields(text)[0].startswith("lockstep-train"):
            pids.append(pid)
    return pids


def _thread_names(pids):
    """{(pid, tid): thread name} (lockstep names its threads: lockstep-comm, lockstep-pool)."""
    names = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            t = _read(f"/proc/{pid}/task/{tid}/stat")
            if t is not None:
                names[(pid, int(tid))] = _stat_fields(t)[0]
    return names


def _thread_ticks(pids):
    """{(pid, tid): utime + stime in ticks} of every thread of pids; None if a pid is gone."""
    ticks = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return None
        for tid in tids:
            t = _read(f"/proc/{pid}/task/{tid}/stat")
            if t is not None:
                _, rest = _stat_fields(t)
                ticks[(pid, int(tid))] = int(rest[11]) + int(rest[12])
    return ticks


def _steps_in(path, offset):
    """New complete lines of the metrics file from offset: (steps seen, new offset)."""
    steps = []
    try:
        with open(path) as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return steps, offset
    end = data.rfind("\n")
    if end < 0:
        return steps, offset
    for line in data[:end].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "step" in rec and "event" not in rec:
            steps.append(rec["step"])
    return steps, offset + len(data[:end + 1].encode())


def watch(argv):
    opts, cmd = {}, []
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            cmd = argv[i + 1:]
            break
        opts[argv[i].lstrip("-")] = argv[i + 1]
        i += 2
    a, b = int(opts["from-step"]), int(opts["to-step"])
    proc = subprocess.Popen(cmd)
    # Cheap while the trainer runs: only the metrics file is polled; /proc is read when a
    # metrics record appears. The window ends at the last record at which every thread seen at
    # its start was still there: after the last record the trainer tears down its replica
    # threads, so that is normally the record before step b.
    offset, pids, first, last, names = 0, None, None, None, {}
    while proc.poll() is None:
        time.sleep(POLL_S)
        steps, offset = _steps_in(opts["metrics"], offset)
        for s in steps:
            if s < a or s > b:
                continue
            now = time.monotonic()
            if first is None:
                pids = _trainer_pids(proc.pid)
                ticks = _thread_ticks(pids) if pids else None
                if ticks:
                    first = (s, now, ticks)
            else:
                ticks = _thread_ticks(pids)
                if ticks is not None and all(k in ticks for k in first[2]):
                    last = (s, now, ticks)
                    names = _thread_names(pids)
    result = {"window_steps": [a, b], "complete": first is not None and last is not None}
    if result["complete"]:
        (s0, t0, k0), (s1, t1, k1) = first, last
        wall = t1 - t0
        result["window_steps"] = [s0, s1]
        procs = {}
        for (pid, tid), v in k1.items():
            cpu = (v - k0.get((pid, tid), 0)) / CLK_TCK
            procs.setdefault(pid, []).append({"tid": tid, "main": tid == pid, "cpu_s": cpu,
                                              "util": cpu / wall,
                                              "name": names.get((pid, tid), "?")})
        result["wall_s"] = wall
        result["processes"] = []
        for pid in sorted(procs):
            threads = sorted(procs[pid], key=lambda t: (not t["main"], -t["cpu_s"]))
            result["processes"].append({"pid": pid, "cpu_s": sum(t["cpu_s"] for t in threads),
                                        "util": sum(t["cpu_s"] for t in threads) / wall,
                                        "threads": threads})
    with open(opts["out"], "w") as f:
        json.dump(result, f)
    return proc.returncode


# ----------------------------------------------------------------------------- summarize
SPLIT = [("compute_s", "compute (fwd+bwd)"), ("param_copy_s", "param copy (DP)"),
         ("grad_gather_s", "grad gather (DP)"), ("comm_exposed_s", "exposed allreduce (DDP)"),
         ("data_wait_s", "data wait"), ("other_s", "other (optimizer step, checks)")]
MODES = {"dp": "DP (threads)", "ddp": "DDP (MPI ranks)", "ddp-nosync": "DDP, no gradient sync"}


def _load_jsonl(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def _run_figures(run, out_dir):
    recs = _load_jsonl(os.path.join(out_dir, run["metrics"]))
    warm = run["warmup_steps"]
    intervals = [r for r in recs if "step" in r and "event" not in r and r["step"] > warm]
    final = next((r for r in recs if r.get("event") == "final"), None)
    if not intervals or final is None:
        return None
    mean = lambda key: statistics.fmean(r[key] for r in intervals)  # noqa: E731 (equal intervals)
    fig = {"step_time_s": mean("step_time_s")}
    fig["samples_per_s"] = run["global_batch"] / fig["step_time_s"]
    for key, _ in SPLIT[:-1]:
        fig[key] = mean(key)
    fig["other_s"] = fig["step_time_s"] - sum(fig[k] for k, _ in SPLIT[:-1])
    fig["final"] = {k: final[k] for k in ("rank_peak_rss_bytes", "optimizer_state_bytes",
                                          "replica_tensor_bytes", "train_loss") if k in final}
    cpu_path = os.path.join(out_dir, run["cpu"])
    if os.path.exists(cpu_path):
        with open(cpu_path) as f:
            cpu = json.load(f)
        if cpu.get("complete"):
            fig["cpu"] = cpu
            steps = cpu["window_steps"][1] - cpu["window_steps"][0]
            total = sum(p["cpu_s"] for p in cpu["processes"])
            if steps > 0:
                fig["cpu_s_per_step"] = total / steps  # every thread of every process
                fig["cpu_cores_used"] = total / cpu["wall_s"]
    return fig


def _utilisation(cpu, mode, n):
    """Busy fraction (CPU seconds / wall seconds) of the threads that run replicas.

    DP: the main thread runs replica 0 (the master: its fwd/bwd, the copies, the gather and the
    optimizer step); replicas 1..n-1 are the pool's threads, taken as the n-1 busiest other
    threads (the loader's prefetch thread is nearly idle with data in memory).
    DDP: the main thread of each rank (its replica) and, separately, each rank's whole process.
    """
    if cpu is None:
        return None
    procs = cpu["processes"]
    if mode == "dp":
        p = procs[0]
        main = [t["util"] for t in p["threads"] if t["main"]]
        others = sorted((t["util"] for t in p["threads"] if not t["main"]), reverse=True)
        return {"master": main[0] if main else None, "replicas": others[:n - 1],
                "process": p["util"]}
    mains = [next((t["util"] for t in p["threads"] if t["main"]), None) for p in procs]
    return {"rank_main_threads": mains, "rank_processes": [p["util"] for p in procs]}


def summarize(out_dir):
    runs = _load_jsonl(os.path.join(out_dir, "runs.jsonl"))
    with open(os.path.join(out_dir, "machine.json")) as f:
        machine = json.load(f)
    groups = {}
    failed = []
    for run in runs:
        fig = _run_figures(run, out_dir) if run["exit_code"] == 0 else None
        if fig is None:
            failed.append({k: run[k] for k in ("mode", "n", "rep", "exit_code")})
            continue
        groups.setdefault((run["mode"], run["n"]), []).append((run, fig))

    model_tensor_bytes = None  # params + grads + buffers of one replica (from any DP run)
    for (mode, _), items in groups.items():
        for _, fig in items:
            if "replica_tensor_bytes" in fig["final"]:
                model_tensor_bytes = fig["final"]["replica_tensor_bytes"][0]

    rows = []
    for (mode, n), items in sorted(groups.items(), key=lambda kv: (list(MODES).index(kv[0][0]),
                                                                   kv[0][1])):
        sps = sorted(f["samples_per_s"] for _, f in items)
        # The time split and memory come from the run with the median throughput, so that the
        # split adds up to that run's step time.
        by_sps = sorted(items, key=lambda rf: rf[1]["samples_per_s"])
        run, med = by_sps[(len(by_sps) - 1) // 2]
        row = {"mode": mode, "n": n, "reps": len(items),
               "samples_per_s": statistics.median(sps), "samples_per_s_min": sps[0],
               "samples_per_s_max": sps[-1], "median_run_rep": run["rep"],
               "step_time_s": med["step_time_s"], "split_s": {k: med[k] for k, _ in SPLIT},
               "load_avg_1m": [r["load_before"][0] for r, _ in items]}
        cpu_steps = sorted(f["cpu_s_per_step"] for _, f in items if "cpu_s_per_step" in f)
        cores = sorted(f["cpu_cores_used"] for _, f in items if "cpu_cores_used" in f)
        if cpu_steps:
            row["cpu_s_per_step"] = statistics.median(cpu_steps)
            row["cpu_cores_used"] = statistics.median(cores)
        fin = med["final"]
        opt = fin.get("optimizer_state_bytes", 0)
        mem = {"peak_rss_bytes": fin.get("rank_peak_rss_bytes"), "optimizer_state_bytes": opt}
        if mode == "dp" and "replica_tensor_bytes" in fin:
            per = list(fin["replica_tensor_bytes"])
            per[0] += opt  # the master alone holds the optimizer state
            mem["tensor_bytes_per_replica"] = per
        elif model_tensor_bytes is not None:
            mem["tensor_bytes_per_replica"] = [model_tensor_bytes + opt] * n
        row["memory"] = mem
        row["utilisation"] = _utilisation(med.get("cpu"), mode, n)
        rows.append(row)

    base = {r["mode"]: r["samples_per_s"] for r in rows if r["n"] == 1}
    base["ddp-nosync"] = base.get("ddp")
    cpu_base = {r["mode"]: r.get("cpu_s_per_step") for r in rows if r["n"] == 1}
    cpu_base["ddp-nosync"] = cpu_base.get("ddp")
    for r in rows:
        b = base.get(r["mode"])
        r["speedup"] = r["samples_per_s"] / b if b else None
        r["scaling_efficiency"] = r["samples_per_s"] / (r["n"] * b) if b else None
        c = cpu_base.get(r["mode"])
        r["cpu_efficiency"] = c / r["cpu_s_per_step"] if c and r.get("cpu_s_per_step") else None

    summary = {"machine": machine, "settings": runs[0]["settings"] if runs else {},
               "scaling_efficiency_definition":
                   "throughput_N / (N * throughput_1), throughput_1 = the same mode with 1 "
                   "replica/rank (ddp-nosync uses ddp's)",
               "cpu_efficiency_definition":
                   "cpu_s_per_step_1 / cpu_s_per_step_N: the CPU time (all threads of all "
                   "processes, over the measured steps) that one step costs with 1 replica/rank "
                   "against N; unlike throughput it does not depend on the CPU share the "
                   "scheduler gives the job on a shared machine, but it misses idle waiting",
               "model_tensor_bytes_per_replica": model_tensor_bytes,
               "rows": rows, "failed_runs": failed}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if not rows:
        return False
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(markdown(summary))
    _write_plot_data(out_dir, rows)
    print(markdown(summary))
    return True


def _mib(b):
    return f"{b / 2**20:.1f}"


def _pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def markdown(s):
    m, st = s["machine"], s["settings"]
    out = [f"Machine: {m.get('cpu_model')}, {m.get('cores')} cores, load average at start "
           f"{m.get('load_avg_start')}, at end {m.get('load_avg_end', '?')}; {m.get('date')}"
           + ("; the kernel shares CPU between sessions (sched_autogroup), not threads"
              if m.get("sched_autogroup_enabled") == 1 else "") + ".",
           f"Model `{st.get('model_spec')}`, global batch {st.get('global_batch')}, "
           f"{st.get('threads')} thread(s) per replica/rank, {st.get('steps')} steps of which the "
           f"first {st.get('warmup_steps')} are warm-up (not measured), {st.get('reps')} "
           f"repetitions, interleaved; medians.", ""]
    out += ["| mode | N | samples/s (median) | min-max | speedup | scaling eff. | step ms | "
            "cores used | CPU ms per step | CPU eff. |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in s["rows"]:
        cores = f"{r['cpu_cores_used']:.2f}" if "cpu_cores_used" in r else "-"
        cpu = f"{1e3 * r['cpu_s_per_step']:.1f}" if "cpu_s_per_step" in r else "-"
        out.append(f"| {MODES[r['mode']]} | {r['n']} | {r['samples_per_s']:.0f} | "
                   f"{r['samples_per_s_min']:.0f}-{r['samples_per_s_max']:.0f} | "
                   f"{r['speedup']:.2f}x | {_pct(r['scaling_efficiency'])} | "
                   f"{1e3 * r['step_time_s']:.1f} | {cores} | {cpu} | "
                   f"{_pct(r['cpu_efficiency'])} |")
    out += ["", "Scaling efficiency = throughput_N / (N x throughput_1) of the same mode (DDP "
            "without sync: against DDP with 1 rank). Cores used = CPU seconds of all the job's "
            "threads / wall seconds; CPU eff. = CPU time per step with 1 replica / with N."]
    out += ["", "Time split per step (ms, the median-throughput run of each row):", "",
            "| mode | N | " + " | ".join(label for _, label in SPLIT) + " |",
            "| --- | --- | " + " | ".join("---" for _ in SPLIT) + " |"]
    for r in s["rows"]:
        out.append(f"| {MODES[r['mode']]} | {r['n']} | " +
                   " | ".join(f"{1e3 * r['split_s'][k]:.1f}" for k, _ in SPLIT) + " |")
    out += ["", "Memory (MiB) and utilisation (CPU s / wall s over the measured steps):", "",
            "| mode | N | peak RSS per process | tensors per replica (master first for DP) | "
            "busy: master / replicas (DP), rank main threads (DDP) | busy: whole process(es) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for r in s["rows"]:
        mem = r["memory"]
        rss = ", ".join(_mib(b) for b in (mem["peak_rss_bytes"] or []))
        tens = ", ".join(_mib(b) for b in mem.get("tensor_bytes_per_replica", []))
        u = r["utilisation"]
        if u is None:
            busy = procs = "-"
        elif r["mode"] == "dp":
            busy = _pct(u["master"]) + (" / " + ", ".join(_pct(x) for x in u["replicas"])
                                        if u["replicas"] else "")
            procs = _pct(u["process"])
        else:
            busy = ", ".join(_pct(x) for x in u["rank_main_threads"])
            procs = ", ".join(_pct(x) for x in u["rank_processes"])
        out.append(f"| {MODES[r['mode']]} | {r['n']} | {rss} | {tens} | {busy} | {procs} |")
    if s["failed_runs"]:
        out += ["", f"Failed runs (left out): {s['failed_runs']}"]
    return "\n".join(out) + "\n"


def _write_plot_data(out_dir, rows):
    with open(os.path.join(out_dir, "throughput.dat"), "w") as f:
        f.write("# mode n samples_per_s min max\n")
        for mode in MODES:
            sel = [r for r in rows if r["mode"] == mode]
            if not sel:
                continue
            f.write(f"# {mode}\n")
            for r in sel:
                f.write(f"{r['n']} {r['samples_per_s']:.1f} {r['samples_per_s_min']:.1f} "
                        f"{r['samples_per_s_max']:.1f}\n")
            f.write("\n\n")
    with open(os.path.join(out_dir, "cpu.dat"), "w") as f:
        f.write("# label cpu_ms_per_step cores_used\n")
        for r in rows:
            if "cpu_s_per_step" in r:
                label = {"dp": "DP", "ddp": "DDP", "ddp-nosync": "no-sync"}[r["mode"]]
                f.write(f"\"{label} {r['n']}\" {1e3 * r['cpu_s_per_step']:.2f} "
                        f"{r['cpu_cores_used']:.3f}\n")
    with open(os.path.join(out_dir, "split.dat"), "w") as f:
        f.write("# label " + " ".join(k for k, _ in SPLIT) + "\n")
        for r in rows:
            label = {"dp": "DP", "ddp": "DDP", "ddp-nosync": "no-sync"}[r["mode"]]
            f.write(f"\"{label} {r['n']}\" " +
                    " ".join(f"{1e3 * max(r['split_s'][k], 0):.2f}" for k, _ in SPLIT) + "\n")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "watch":
        sys.exit(watch(sys.argv[2:]))
    if len(sys.argv) == 3 and sys.argv[1] == "summarize":
        sys.exit(0 if summarize(sys.argv[2]) else 1)
    sys.exit(__doc__)
