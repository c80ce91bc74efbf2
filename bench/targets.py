#!/usr/bin/env python3
"""bench/targets.py: the performance targets, checked against one bench/compare run.

Usage: targets.py RESULTS_DIR MICRO_TXT "FSYNC_LINE" [RESTART_JSON]

Reads the `palisade bench --json` files of the run, the criterion output and the disk's
fdatasync line, and prints a markdown table: each target, what this run measured, and
whether it is met. Called by bench/report.sh; it judges only the figures it is given.
"""

import glob
import json
import os
import re
import statistics
import sys


def load(results_dir):
    runs, scale = {}, None
    for path in glob.glob(os.path.join(results_dir, "*.json")):
        with open(path) as f:
            data = json.load(f)
        for run in data.get("runs", []):
            key = (str(run["target"]).lower(), str(run["job"]).lower(), run["clients"],
                   run.get("variant"))
            runs[key] = run
        if data.get("scale"):
            scale = data["scale"]
    return runs, scale


def auth_pairs(pairs_dir):
    """{job: [(off_run, on_run), ...]} from the files `JOB-I-off.json` / `JOB-I-on.json`."""
    sides = {}
    for path in glob.glob(os.path.join(pairs_dir, "*.json")):
        m = re.match(r"^([a-z0-9]+)-([0-9]+)-(on|off)\.json$", os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            data = json.load(f)
        if data.get("runs"):
            sides.setdefault((m.group(1), int(m.group(2))), {})[m.group(3)] = data["runs"][0]
    pairs = {}
    for (job, _), side in sorted(sides.items()):
        if "on" in side and "off" in side and side["off"]["ops_per_s"]:
            pairs.setdefault(job, []).append((side["off"], side["on"]))
    return pairs


def cpu_us_per_op(run):
    """Server CPU time per operation in µs, from its CPU share and throughput."""
    pct, ops = run.get("server_cpu_pct"), run.get("ops_per_s")
    return pct / 100 * 1e6 / ops if pct and ops else None


def micro_ns(micro_txt, name):
    """Median time of a criterion benchmark, in ns (None if absent)."""
    if not os.path.exists(micro_txt):
        return None
    current, units = None, {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
    with open(micro_txt) as f:
        for line in f:
            m = re.match(r"^([a-z_]+/[a-z0-9_]+)", line)
            if m:
                current = m.group(1)
            if current == name and "time:" in line and "%" not in line:
                parts = line.split("[", 1)[1].split()
                return float(parts[2]) * units.get(parts[3], 1.0)
    return None


def main():
    results_dir, micro_txt, fsync_line = sys.argv[1], sys.argv[2], sys.argv[3]
    restart = None
    if len(sys.argv) > 4 and os.path.exists(sys.argv[4]):
        with open(sys.argv[4]) as f:
            restart = json.load(f)
    runs, scale = load(results_dir)
    rows = []

    def ops(target, job, clients=64, variant=None):
        run = runs.get((target, job, clients, variant))
        return run["ops_per_s"] if run else None

    def ratio_row(label, job, peer, want, clients=64, variant=None):
        ours, theirs = ops("palisade", job, clients, variant), ops(peer, job, clients)
        if ours is None or not theirs:
            rows.append((label, f"≥ {want}x", "not measured", "-"))
            return
        r = ours / theirs
        rows.append((label, f"≥ {want}x", f"{r:.2f}x ({ours:,.0f} vs {theirs:,.0f}/s)",
                     "met" if r >= want else f"gap: {want / r:.1f}x short"))

    # The hot routes over RESP (`(resp)` rows), which the Redis targets are about.
    for job, label in (("j1", "J1"), ("j2", "J2"), ("read", "read")):
        for peer, want in (("redis", 1.0), ("postgres", 1.5)):
            ratio_row(f"{label} over RESP, 64 clients, vs {peer}", job, peer, want,
                      variant="resp")
    ratio_row("J2 over RESP, 1 client, vs postgres", "j2", "postgres", 1.5, clients=1,
              variant="resp")
    for peer, want in (("redis", 1.0), ("postgres", 2.5), ("etcd", 8)):
        ratio_row(f"J2, 64 clients, vs {peer}", "j2", peer, want)
    ours, redis = runs.get(("palisade", "j2", 64, None)), runs.get(("redis", "j2", 64, None))
    if ours and redis:
        a, b = ours["p99_us"] / 1000, redis["p99_us"] / 1000
        rows.append(("J2 p99, 64 clients", "≤ Redis's", f"{a:.2f} ms vs {b:.2f} ms",
                     "met" if a <= b else f"gap: {a / b:.1f}x higher"))
    for peer, want in (("redis", 1.0), ("etcd", 10)):
        ratio_row(f"J1, 64 clients, vs {peer}", "j1", peer, want)
    ratio_row("read (GET of one key), 64 clients, vs redis", "read", "redis", 1.0)
    for job, label in (("j1", "J1"), ("read", "read")):
        ratio_row(f"{label}, 64 clients, vs postgres", job, "postgres", 1.5)
    ratio_row("J2, 1 client, vs postgres", "j2", "postgres", 1.5, clients=1)
    for (job, label, most), variant in [(t, v) for v in (None, "resp") for t in (
            ("read", "read", 10), ("j2", "fenced write (J2)", 20), ("j1", "J1 cycle", 45))]:
        if variant:
            label = f"{label} over RESP"
        run = runs.get(("palisade", job, 64, variant))
        us = cpu_us_per_op(run) if run else None
        if us is None:
            rows.append((f"server CPU per operation, {label}, 64 clients", f"≤ {most} µs",
                         "not measured", "-"))
            continue
        redis = runs.get(("redis", job, 64, None))
        theirs = cpu_us_per_op(redis) if redis else None
        peer = f" (Redis {theirs:.1f} µs)" if theirs else ""
        rows.append((f"server CPU per operation, {label}, 64 clients", f"≤ {most} µs",
                     f"{us:.1f} µs{peer}", "met" if us <= most else f"gap: {us / most:.2f}x over"))
    ratio_row("J1 with --idle-grace-ms 0 (an epoch write per grant), vs redis", "j1", "redis",
              1.0, variant="grace0")
    ratio_row("contended, retrying like the peers (wait_ms 0), vs redis", "contended",
              "redis", 1.0, variant="retry")
    ratio_row("contended, FIFO queue, vs redis (successful acquisitions)", "contended",
              "redis", 6)
    for job, pairs in auth_pairs(os.path.join(results_dir, "auth-pairs")).items():
        tput = sorted(on["ops_per_s"] / off["ops_per_s"] for off, on in pairs)
        median = statistics.median(tput)
        cpu = [cpu_us_per_op(on) / cpu_us_per_op(off) for off, on in pairs
               if cpu_us_per_op(on) and cpu_us_per_op(off)]
        cpu_text = f"; server CPU per op {statistics.median(cpu):.2f}x" if cpu else ""
        rows.append((f"{job.upper()} with auth on / off ({len(pairs)} interleaved pairs)",
                     "cost < 5% (≥ 0.95x)",
                     f"median {median:.2f}x (pairs: {', '.join(f'{r:.2f}' for r in tput)})"
                     f"{cpu_text}",
                     "met" if median >= 0.95 else f"gap: {(1 - median) * 100:.0f}% cost"))
    m = re.search(r"p50 ([0-9.]+) ms", fsync_line or "")
    for variant, over in ((None, ""), ("resp", " over RESP")):
        one = runs.get(("palisade", "j2", 1, variant))
        if one and m:
            p50, disk = one["p50_us"] / 1000, float(m.group(1))
            limit = 1.3 * disk
            rows.append((f"J2{over}, 1 client, p50", "≤ 1.3 × fdatasync p50",
                         f"{p50:.2f} ms vs fdatasync {disk:.2f} ms ({p50 / disk:.1f}x)",
                         "met" if p50 <= limit else f"gap: {p50 / limit:.1f}x over"))
    cached = micro_ns(micro_txt, "token/verify_cached")
    if cached is not None:
        rows.append(("token check, cached (criterion)", "< 1 µs", f"{cached:.0f} ns",
                     "met" if cached < 1000 else "gap"))
    if scale:
        rss = max(v for v in (scale.get("rss_after_create"), scale.get("rss_after_hold"),
                              scale.get("rss_max_renewing")) if v is not None)
        mb = rss / 1e6
        kept = scale.get("lost", 1) == 0 and not scale.get("errors")
        rows.append((f"scale: {scale['locks']:,} locks, {scale['leases']:,} leases renewed every second",
                     "< 300 MB RSS, keeping up",
                     f"{mb:.0f} MB ({rss / 2**20:.0f} MiB) at most; {scale.get('lost', 0)} leases lost",
                     "met" if mb < 300 and kept else "gap"))
    if restart and restart.get("rss_mb") is not None:
        rss, peak = restart["rss_mb"], restart.get("peak_mb")
        rows.append(("scale: right after a restart with those locks on disk",
                     "< 300 MB RSS",
                     f"{rss:.0f} MB resident 10 s after it answers, {peak:.0f} MB peak while loading",
                     "met" if rss < 300 else "gap"))

    print("| target | wanted | this run | |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
