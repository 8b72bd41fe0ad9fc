"""The load benchmark's report (`load.py`): the machine, the table of rows and the
issue's targets computed from them, as Markdown."""

import os
import platform
import subprocess

WORDS = 18  # reply words: role + 18 content + finish + usage + [DONE] = 22 SSE events
SLOW_DELAY_MS = 100  # between events in the many-streams row: each stream stays open ~2 s
PACED_MS = 2  # between events in the paced-stream row
PACED_LABEL = f"2 KB stream, {PACED_MS} ms between events"


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            text_ = f.read()
        flags = " (SHA extensions)" if " sha_ni" in text_ else ""
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()
    versions = []
    for argv in (["wrk", "-v"], ["nginx", "-v"], ["redis-server", "--version"]):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            first = (out.stdout + out.stderr).strip().splitlines()
            versions.append(first[0] if first else argv[0])
        except OSError:
            pass
    return (f"{os.cpu_count()} × {cpu}{flags}, {mem_gb:.0f} GiB, {platform.system()} "
            f"{platform.release()}; load average before the run {load[0]:.2f}; "
            + "; ".join(versions))


def fmt(value, spec, missing="–"):
    return missing if value is None else format(value, spec)


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def spread(result):
    """The CPU per request of the row's rounds, lowest to highest."""
    values = sorted(result.get("cpu_rounds") or [])
    if len(values) < 2:
        return "–"
    return f"{values[0]:.1f}–{values[-1]:.1f}"


def table(rows):
    """Markdown: one line per (row, target)."""
    lines = [
        "| load | conc. | target | req/s | ×direct | ×nginx | p50 ms | p99 ms | +p50 vs direct ms "
        "| CPU µs/req | of which kernel | rounds' CPU | CPU ×nginx | peak RSS MB | errors |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        by = {r["target"]: r for r in row["results"]}
        direct, nginx = by.get("direct"), by.get("nginx")
        for r in row["results"]:
            cpu = fmt(r["cpu_us"], ".1f")
            if r["helpers"]:
                cpu += " (" + ", ".join(f"+{v:.1f} {k}" for k, v in r["helpers"].items()) + ")"
            lines.append(
                f"| {row['label']} | {row['connections']} | {r['target']} "
                f"| {r['rps']:.0f} "
                f"| {fmt(ratio(r['rps'], direct and direct['rps']), '.2f')} "
                f"| {fmt(ratio(r['rps'], nginx and nginx['rps']), '.2f')} "
                f"| {r['p50_ms']:.3f} | {r['p99_ms']:.3f} "
                f"| {fmt(r['p50_ms'] - direct['p50_ms'] if direct else None, '+.3f')} "
                f"| {cpu} | {fmt(r.get('kernel_us'), '.1f')} | {spread(r)} "
                f"| {fmt(ratio(r['cpu_us'], nginx and nginx['cpu_us']), '.2f')} "
                f"| {fmt(r['rss_mb'], '.1f')} | {r['errors']} |"
            )
    return "\n".join(lines)


def goals(rows, concurrency, streams):
    """The issue's targets, each computed from this run's rows."""
    def get(label, c, target):
        for row in rows:
            if row["label"] == label and row["connections"] == c:
                for r in row["results"]:
                    if r["target"] == target:
                        return r
        return None

    mid = 16 if 16 in concurrency else concurrency[-1]
    top = concurrency[-1]
    events = 22

    def cpu(label, c):
        return lambda t: (get(label, c, t) or {}).get("cpu_us")

    def per_event(t):
        stream, plain = cpu("2 KB stream (22 events)", mid)(t), cpu("2 KB", mid)(t)
        return None if stream is None or plain is None else (stream - plain) / events

    def per_paced_event(t):
        stream, plain = cpu(PACED_LABEL, top)(t), cpu("2 KB", top)(t)
        return None if stream is None or plain is None else (stream - plain) / events

    def rps(t):
        return (get("2 KB", top, t) or {}).get("rps")

    def rss(t):
        return (get(f"stream, {SLOW_DELAY_MS} ms between events", streams, t) or {}).get("rss_mb")

    checks = [
        (f"2 KB chat path: CPU µs/req ({mid} conn.) ≤ 1.5× nginx", cpu("2 KB", mid), ".1f", "ratio", 1.5),
        (f"200 KB: CPU µs/req ({mid} conn.) ≤ 2× nginx", cpu("200 KB", mid), ".1f", "ratio", 2.0),
        (f"2 KB throughput, req/s ({top} conn.) ≥ 0.7× nginx", rps, ".0f", "ratio_min", 0.7),
        (f"CPU µs per relayed SSE event ((stream − plain) / {events}, {mid} conn.) ≤ 2× nginx", per_event, ".2f", "ratio", 2.0),
        (f"the same, events {PACED_MS} ms apart ({top} conn.) ≤ 2× nginx", per_paced_event, ".2f", "ratio", 2.0),
        (f"peak RSS MB with {streams} open streams ≤ 1.3× nginx", rss, ".1f", "ratio", 1.3),
    ]
    lines = ["| target (from the issue) | abridge | abridge + Redis | nginx | abridge met |",
             "|---|---:|---:|---:|---|"]
    for name, value, spec, kind, bound in checks:
        a, r, n = value("abridge"), value("abridge-redis"), value("nginx")
        met = "–"
        if a is not None:
            if kind == "ratio" and n:
                met = f"{'yes' if a / n <= bound else 'no'} ({a / n:.2f}×)"
            elif kind == "ratio_min" and n:
                met = f"{'yes' if a / n >= bound else 'no'} ({a / n:.2f}×)"
        lines.append(f"| {name} | {fmt(a, spec)} | {fmt(r, spec)} | {fmt(n, spec)} | {met} |")
    return "\n".join(lines)
