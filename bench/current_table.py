#!/usr/bin/env python3
"""Prints the "current table" of docs/benchmarks.md from benchmark JSON rows.

Usage: bench/current_table.py [FILE ...]     (default: bench/results/latest.json)

A FILE is run_all.sh's latest.json (a JSON list) or the JSON lines a program appends with
--json. Rows with a target, and every row against a peer (PyTorch, oneDNN, OpenBLAS), go in
the table: workload, kiln's wall / CPU median, the baseline and its times, the ratios
kiln / baseline in wall and in CPU time, the target and whether each ratio meets it.

Given several runs of the same rows (several FILEs), each figure is the least of its
medians over the runs (on a shared machine, load only ever adds time, to kiln and to its
peers alike), the ratios are taken of those, and a "wall ratio range" column gives the
least and greatest per-run wall ratio. Where a row's baseline is the fastest of several
peers (GEMM, conv2d), the peer named is the one with the least time over the runs. The
line above it names the CPU, its ISA level, the float32 GEMM path and the load averages
the rows were measured under. Rows without a target or a peer (bench_plan's unplanned
steps, the stream-floor of sums and softmax) are left out; latest.json keeps them.
"""
import json
import os
import sys


def load(path):
    with open(path) as f:
        text = f.read().strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def ms(v):
    if v is None:
        return "–"
    if v < 0.1:
        return f"{v * 1e3:.3g} µs"
    return f"{v:.0f} ms" if v >= 1000 else f"{v:.3g} ms"


def ratio(v):
    return "–" if v is None else f"{v:.2f}"


def section(row):
    w = row["workload"]
    if w.startswith("train_"):
        return "training step"
    if w.startswith("GEMM"):
        return "GEMM"
    if w.startswith("conv2d"):
        return "conv2d"
    if w.startswith("plan_"):
        return "memory plan"
    if row.get("baseline") == "none":
        return "compile / overhead"
    return "fused"


def verdict(row, key):
    met = row.get(key)
    return "–" if met is None else ("met" if met else "**missed**")


def judge(target, kiln, ratio_value):
    """True / False / None: does a figure meet a target such as "kiln/baseline <= 0.7"."""
    if not target:
        return None
    lhs, _, value = target.rpartition(" ")
    value = float(value)
    if lhs == "kiln_ms <=":
        return None if kiln is None else kiln <= value
    if ratio_value is None:
        return None
    if lhs == "baseline/kiln >=":
        return 1.0 / ratio_value >= value
    return ratio_value <= value


# Baselines that are one fixed peer; any other (GEMM's and conv2d's) is the fastest of
# several peers in that run, and the runs of a workload merge whichever peer won.
FIXED = ("stream-floor", "pytorch-eager", "torch-compile", "none", "unplanned")


def peer_class(row):
    base = row.get("baseline")
    return base if base in FIXED else "fastest peer"


def least(values):
    values = [v for v in values if v is not None]
    return min(values) if values else None


def merge(group):
    """One row from the runs of a (workload, baseline, compiler) group."""
    if len(group) == 1:
        return dict(group[0])
    timed = [r for r in group if r.get("baseline_ms") is not None]
    row = dict(min(timed, key=lambda r: r["baseline_ms"]) if timed else group[-1])
    for key in ("kiln_ms", "kiln_cpu_ms", "baseline_ms", "baseline_cpu_ms"):
        row[key] = least(r.get(key) for r in group)
    def quotient(a, b):
        return a / b if a is not None and b else None
    row["ratio"] = quotient(row["kiln_ms"], row["baseline_ms"])
    row["cpu_ratio"] = quotient(row["kiln_cpu_ms"], row["baseline_cpu_ms"])
    row["target_met"] = judge(row.get("target"), row["kiln_ms"], row["ratio"])
    row["target_met_cpu"] = judge(row.get("target"), row["kiln_cpu_ms"], row["cpu_ratio"])
    ratios = [r["ratio"] for r in group if r.get("ratio") is not None]
    if ratios:
        row["ratio_range"] = f"{min(ratios):.2f}–{max(ratios):.2f}"
    return row


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    paths = sys.argv[1:] or [os.path.join(here, "results", "latest.json")]
    groups = {}
    for p in paths:
        for r in load(p):
            groups.setdefault((r["workload"], peer_class(r), r.get("compiler")), []).append(r)
    rows = [merge(g) for g in groups.values()]
    runs = max(len(g) for g in groups.values()) if groups else 0
    if not rows:
        print("current_table.py: no rows", file=sys.stderr)
        return 1
    machines = sorted({(r.get("cpu_model"), r.get("cpu_family"), r.get("cpu_model_number"),
                        r.get("cpu_isa"), r.get("gemm_path")) for r in rows if r.get("cpu_model")})
    loads = sorted({r.get("load_average") for g in groups.values() for r in g
                    if r.get("load_average")})
    for cpu, fam, model, isa, gemm in machines:
        print(f"CPU: {cpu} (family {fam}, model {model}), {isa}; float32 GEMM: {gemm}")
    if loads:
        print(f"load averages (1/5/15 min) when rows were written: {', '.join(loads)}")
    if runs > 1:
        print(f"least median of {runs} runs per figure; ratios of those")
    print()
    range_head, range_rule = (" wall ratio range |", " --- |") if runs > 1 else ("", "")
    print("| section | workload | kiln wall / CPU | baseline | baseline wall / CPU "
          f"| ratio wall | ratio CPU |{range_head} target | met (wall / CPU) |")
    print(f"| --- | --- | --- | --- | --- | --- | --- |{range_rule} --- | --- |")
    order = ["training step", "fused", "GEMM", "conv2d", "compile / overhead", "memory plan"]
    rows.sort(key=lambda r: order.index(section(r)))
    for r in rows:
        peer = r.get("baseline") not in (None, "none", "unplanned", "stream-floor")
        if not r.get("target") and not peer:
            continue
        base = r.get("baseline", "–")
        note = r.get("note", "")
        if r.get("baseline_ms") is None and base not in ("none",) and note:
            base += f" ({note.split('; ')[-1][:80]})"
        print(f"| {section(r)} | {r['workload']} | {ms(r.get('kiln_ms'))} / "
              f"{ms(r.get('kiln_cpu_ms'))} | {base} | {ms(r.get('baseline_ms'))} / "
              f"{ms(r.get('baseline_cpu_ms'))} | {ratio(r.get('ratio'))} | "
              f"{ratio(r.get('cpu_ratio'))} |"
              + (f" {r.get('ratio_range', '–')} |" if runs > 1 else "")
              + f" {r.get('target', '–')} | "
              f"{verdict(r, 'target_met')} / {verdict(r, 'target_met_cpu')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
