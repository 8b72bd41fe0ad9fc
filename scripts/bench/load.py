#!/usr/bin/env python3
"""The load benchmark of abridge against a direct connection and a plain reverse proxy.

Run by `scripts/bench-load` (which installs wrk, nginx and Redis when missing and builds
the release binaries); see `--help` for the options. Everything listens on 127.0.0.1
only, every load run is bounded in time, and every process started here is stopped
(by its own process id) before the script exits.

Layout of one run:

    core 0: wrk (load generator) + fake-provider (no artificial delays)
    core 1: the proxy under test (nginx, abridge, and abridge's Redis)

Each row runs in rounds (`--rounds`, default 3): every target once a round, in an order
turned by one each round, and per target the quietest round (least CPU per request) is
kept, with the range of all rounds beside it in the table: a noisy host shows as a wide
range instead of one target's bad minute.

Targets: `direct` (wrk straight at the fake provider), `nginx` (a plain reverse proxy
with upstream keep-alive and response buffering off, so SSE streams like abridge's),
`abridge` with the in-process store, `abridge` with Redis. Each row drives every target
with the same body and concurrency; the proxy's CPU time comes from /proc/<pid>/stat
(utime + stime of the whole process tree, before and after) and its peak RSS from
VmHWM (reset with /proc/<pid>/clear_refs before each row).
"""

import argparse
import datetime
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procs import (RSS_RESET_FAILED, Proc, cpu_seconds, cpu_times, free_port, http,
                   process_tree, reset_peak_rss, peak_rss_mb, wait_ready)
from report import PACED_LABEL, PACED_MS, SLOW_DELAY_MS, WORDS, goals, machine, table

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "target" / "release"
LUA = Path(__file__).resolve().parent / "post.lua"
MODEL = "bench-model"  # not an OpenAI family: abridge uses its calibrated estimate
LONG_MODEL = "bench-long"  # a 16k context window in abridge's config: compacted
CLAUDE_MODEL = "claude-sonnet-4-5"  # the Messages body: a model Claude Code sends


def log(*args):
    print(*args, file=sys.stderr, flush=True)


# --- bodies -----------------------------------------------------------------------------

VOCABULARY = (
    "the of and to in is that for it as with was on be by this are from or have an they "
    "which one you had not but what all were when we there can more if out so about up "
    "function return value error file path config request response stream token model "
    "message conversation summary cache latency proxy server client header body json "
    "struct impl trait async await future result option vector string bytes buffer"
).split()


def text(rng, size):
    """Prose-like text with line breaks every dozen words or so and the odd quoted
    word, as chat and tool output have (so JSON strings carry escapes)."""
    out = []
    n = 0
    while n < size:
        w = rng.choice(VOCABULARY)
        if rng.random() < 0.02:
            w = f'"{w}"'
        out.append(w)
        out.append("\n" if rng.random() < 0.08 else " ")
        n += len(w) + 1
    return "".join(out)[:size]


def conversation(rng, target_bytes, message_bytes):
    """An agentic conversation: a system prompt, then user/assistant turns with a tool
    call and its result every few turns, until the JSON is about `target_bytes`."""
    messages = [{"role": "system", "content": "You are a careful coding assistant. " + text(rng, 200)}]
    i = 0
    while len(json.dumps(messages)) < target_bytes:
        i += 1
        size = min(message_bytes, max(40, target_bytes - len(json.dumps(messages)) - 60))
        kind = i % 6
        if kind == 3:
            messages.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{i:04d}", "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/mod{i}.rs"})}}]})
        elif kind == 4:
            messages.append({"role": "tool", "tool_call_id": f"call_{i - 1:04d}", "content": text(rng, size)})
        elif kind % 2 == 1:
            messages.append({"role": "user", "content": text(rng, size)})
        else:
            messages.append({"role": "assistant", "content": text(rng, size)})
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "Go on."})
    return messages


def as_messages(conversation):
    """A chat conversation as Claude Code sends it to Anthropic's Messages API: the system
    prompt as the top-level `system`, text and tool calls as content blocks, a tool result
    as a user message's `tool_result` block. Anthropic wants the turns to alternate,
    starting and ending with the user: an assistant's text and the tool call after it
    become one message, a tool result and the user text after it another (as Claude Code
    sends them)."""
    system = None
    turns = []
    for m in conversation:
        if m["role"] == "system":
            system = m["content"]
            continue
        if m["role"] == "tool":
            role, blocks = "user", [{"type": "tool_result", "tool_use_id": tool_use_id(m["tool_call_id"]),
                                     "content": m["content"]}]
        else:
            role = m["role"]
            blocks = [{"type": "text", "text": m["content"]}] if m["content"] else []
            blocks += [{"type": "tool_use", "id": tool_use_id(call["id"]), "name": call["function"]["name"],
                        "input": json.loads(call["function"]["arguments"])}
                       for call in m.get("tool_calls", ())]
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += blocks
        else:
            turns.append({"role": role, "content": blocks})
    assert turns[0]["role"] == "user" and turns[-1]["role"] == "user"
    return system, turns


def tool_use_id(call_id):
    """Anthropic's spelling of a tool call's id (`toolu_…`, where chat has `call_…`)."""
    return "toolu_" + call_id.removeprefix("call_")


def as_responses_input(conversation):
    """A chat conversation as `input` items of OpenAI's Responses API (as Codex sends it,
    without server-side state): the system prompt as a developer message, text as message
    items (`input_text` from the user, `output_text` from the assistant), a tool call as a
    `function_call` item and its result as a `function_call_output` item."""
    items = []
    for m in conversation:
        if m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"],
                          "output": m["content"]})
            continue
        if m["content"]:
            role = "developer" if m["role"] == "system" else m["role"]
            part = "output_text" if role == "assistant" else "input_text"
            items.append({"type": "message", "role": role,
                          "content": [{"type": part, "text": m["content"]}]})
        items += [{"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                   "arguments": call["function"]["arguments"]}
                  for call in m.get("tool_calls", ())]
    return items


def write_bodies(directory):
    """The request bodies of every row, as files for wrk."""
    rng = random.Random(7)
    small = conversation(rng, 1900, 400)
    large = conversation(rng, 200_000, 2000)
    long_conv = conversation(rng, 200_000, 2000)
    bodies = {
        "2k": {"model": MODEL, "messages": small},
        "2k-stream": {"model": MODEL, "messages": small, "stream": True,
                      "stream_options": {"include_usage": True}},
        "2k-stream-strip": {"model": MODEL, "messages": small, "stream": True},
        "200k": {"model": MODEL, "messages": large},
        "200k-stream": {"model": MODEL, "messages": large, "stream": True,
                        "stream_options": {"include_usage": True}},
        "long": {"model": LONG_MODEL, "messages": long_conv},
    }
    # The 200 KB conversation in the two other wire formats abridge speaks, converted
    # from `large` (no further draws: the bodies above stay the same from run to run).
    system, turns = as_messages(large)
    bodies["200k-messages"] = {"model": CLAUDE_MODEL, "max_tokens": 1024, "system": system,
                               "messages": turns}
    bodies["200k-responses"] = {"model": MODEL, "store": False, "input": as_responses_input(large)}
    paths = {}
    for name, body in bodies.items():
        path = directory / f"{name}.json"
        path.write_text(json.dumps(body, separators=(",", ":")))
        paths[name] = path
    return paths


# --- the targets ------------------------------------------------------------------------

NGINX_CONF = """\
worker_processes 1;
worker_rlimit_nofile 65536;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
{user}
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {dir}/client-body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  client_max_body_size 64m;
  client_body_buffer_size 1m;
  keepalive_requests 10000000;
  upstream provider {{
    server 127.0.0.1:{upstream};
    keepalive 1024;
    keepalive_requests 10000000;
  }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://provider;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
"""


class Target:
    """One way to reach the provider: `url` is the chat-completions URL, `pids()` the
    process tree whose CPU and memory are measured (none for direct)."""

    def __init__(self, name, url, proc=None, helpers=()):
        self.name = name
        self.url = url
        self.proc = proc
        self.helpers = list(helpers)  # (label, Proc): e.g. abridge's Redis

    def pids(self):
        return process_tree(self.proc.pid) if self.proc else []


class Bench:
    def __init__(self, args, workdir):
        self.args = args
        self.dir = workdir
        self.procs = []
        self.lg_core, self.proxy_core = args.cores
        self.binary = Path(args.abridge) if args.abridge else RELEASE / "abridge"

    def start(self, name, argv, core, env=None):
        proc = Proc(name, argv, core, self.dir / f"{name}.log", env)
        self.procs.append(proc)
        return proc

    def stop_all(self):
        for proc in reversed(self.procs):
            proc.stop()
        self.procs = []

    def fake(self, name, delay_ms=0):
        port = free_port()
        proc = self.start(name, [str(RELEASE / "fake-provider"), "--listen", f"127.0.0.1:{port}",
                                 "--delay-ms", str(delay_ms), "--words", str(WORDS), "--bench"],
                          self.lg_core)
        base = f"http://127.0.0.1:{port}/v1"
        wait_ready(base + "/models", proc)
        return base

    def nginx(self, upstream_base, name="nginx"):
        nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
        if not nginx:
            return None
        port = free_port()
        upstream_port = upstream_base.rsplit(":", 1)[1].split("/")[0]
        conf_dir = self.dir / name
        conf_dir.mkdir(exist_ok=True)
        user = "user root;" if os.geteuid() == 0 else ""
        (conf_dir / "nginx.conf").write_text(NGINX_CONF.format(
            dir=conf_dir, upstream=upstream_port, port=port, user=user))
        proc = self.start(name, [nginx, "-p", str(conf_dir), "-c", str(conf_dir / "nginx.conf"),
                                 "-e", str(conf_dir / "nginx-error.log")], self.proxy_core)
        url = f"http://127.0.0.1:{port}/v1"
        wait_ready(url + "/models", proc)
        return Target(name, url + "/chat/completions", proc)

    def redis(self):
        server = shutil.which("redis-server")
        if not server:
            return None, None
        port = free_port()
        proc = self.start("redis", [server, "--port", str(port), "--bind", "127.0.0.1",
                                    "--save", "", "--appendonly", "no"], self.proxy_core)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return proc, f"redis://127.0.0.1:{port}"
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def abridge(self, name, upstream_base, redis_url=None):
        port, admin = free_port(), free_port()
        config = self.dir / "abridge.toml"
        config.write_text(f'[compaction.context_windows]\n"{LONG_MODEL}" = 16000\n')
        env = {
            "ABRIDGE_LISTEN": f"127.0.0.1:{port}",
            "ABRIDGE_ADMIN__LISTEN": f"127.0.0.1:{admin}",
            "ABRIDGE_UPSTREAM": upstream_base,
        }
        if redis_url:
            env["ABRIDGE_REDIS_URL"] = redis_url
        proc = self.start(name, [str(self.binary), "--config", str(config)],
                          self.proxy_core, env)
        wait_ready(f"http://127.0.0.1:{admin}/healthz", proc)
        return Target(name, f"http://127.0.0.1:{port}/v1/chat/completions", proc)

    def wrk(self, url, body, connections, duration, timeout_s=30, headers=()):
        out = subprocess.run(
            ["taskset", "-c", str(self.lg_core), "wrk", "-t1", f"-c{connections}",
             f"-d{duration}s", f"--timeout={timeout_s}s", "-s", str(LUA), url, "--", str(body),
             *headers],
            capture_output=True, text=True, timeout=duration + timeout_s + 30,
        )
        for line in out.stdout.splitlines():
            if line.startswith("WRK_RESULT "):
                return json.loads(line[len("WRK_RESULT "):])
        raise RuntimeError(f"wrk printed no result:\n{out.stdout}\n{out.stderr}")

    def measure(self, target, body, connections, duration, warmup, headers=()):
        """One row for one target: warm up, then `duration` seconds of load."""
        if warmup > 0:
            self.wrk(target.url, body, connections, warmup, headers=headers)
        pids = target.pids()
        helper_pids = [(label, process_tree(p.pid)) for label, p in target.helpers]
        reset_peak_rss(pids)
        cpu0, kernel0 = cpu_times(pids)
        helper0 = [cpu_seconds(p) for _, p in helper_pids]
        result = self.wrk(target.url, body, connections, duration, headers=headers)
        cpu, kernel = (a - b for a, b in zip(cpu_times(pids), (cpu0, kernel0)))
        helper = [cpu_seconds(p) - c0 for (_, p), c0 in zip(helper_pids, helper0)]
        n = max(result["requests"], 1)
        seconds = result["duration_us"] / 1e6
        return {
            "target": target.name,
            "requests": result["requests"],
            "rps": result["requests"] / seconds if seconds else 0.0,
            "p50_ms": result["p50_us"] / 1000,
            "p99_ms": result["p99_us"] / 1000,
            "errors": sum(result[k] for k in ("connect_errors", "read_errors", "write_errors",
                                              "status_errors", "timeouts")),
            "cpu_us": cpu * 1e6 / n if pids else None,
            "kernel_us": kernel * 1e6 / n if pids else None,
            "cpu_util": cpu / seconds if pids and seconds else None,
            "rss_mb": peak_rss_mb(pids) if pids else None,
            "helpers": {label: c * 1e6 / n for (label, _), c in zip(helper_pids, helper)},
        }


def quietest(results):
    """Of one target's rounds, the quietest: the least proxy CPU per request (the most
    requests per second where there is no proxy). Keeps the CPU figures of every round
    beside it, so the report shows how far the rounds were apart."""
    if results[0]["cpu_us"] is None:
        kept = max(results, key=lambda r: r["rps"])
    else:
        kept = min(results, key=lambda r: r["cpu_us"])
    kept = dict(kept)
    kept["cpu_rounds"] = [r["cpu_us"] for r in results if r["cpu_us"] is not None]
    kept["rounds"] = len(results)
    return kept


def measure_row(bench, targets, rounds, *args, **kwargs):
    """One row: `rounds` rounds, each driving every target once (the order turned by
    one each round, so no target always runs first or after the same one); per target
    the quietest round is kept. Interleaving spreads a noisy minute over all targets
    instead of landing on one."""
    results = {t.name: [] for t in targets}
    for r in range(rounds):
        for t in targets[r % len(targets):] + targets[:r % len(targets)]:
            results[t.name].append(bench.measure(t, *args, **kwargs))
    return [quietest(results[t.name]) for t in targets]


# --- checks ---------------------------------------------------------------------------

def check_long_conversation(target, body):
    """Warm a compacting target: the first request compacts and stores the checkpoint,
    the next ones apply it. Returns the report headers of the last request."""
    data = body.read_bytes()
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench-not-a-real-key"}
    report = {}
    for _ in range(3):
        status, response_headers, _ = http("POST", target.url, data, headers)
        if status != 200:
            raise RuntimeError(f"{target.name}: long conversation answered {status}")
        report = {k.lower(): v for k, v in response_headers.items() if k.lower().startswith("x-abridge-")}
        time.sleep(0.2)  # the usage record is stored after the response
    if report.get("x-abridge-compacted") != "true":
        raise RuntimeError(f"{target.name}: the long conversation was not compacted: {report}")
    return report


# --- main ----------------------------------------------------------------------------------

ROWS = [
    # (label, body, streaming)
    ("2 KB", "2k", False),
    ("2 KB stream (22 events)", "2k-stream", True),
    ("200 KB", "200k", False),
    ("200 KB stream (22 events)", "200k-stream", True),
]


# Rows by group, for --rows: the plain and streamed bodies, the usage row, the paced
# row, the compacted long conversation, the open streams.
ROW_GROUPS = ("plain", "strip", "paced", "long", "streams")


def parse_args():
    """The command line, with the defaults --quick changes worked out."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 s per row, 300 streams for the RSS check (about 4 minutes)")
    parser.add_argument("--duration", type=int, help="seconds per row and round (default 5, --quick 2)")
    parser.add_argument("--rounds", type=int, help="rounds per row, targets interleaved, the quietest "
                        "kept per target (default 3, --quick 1)")
    parser.add_argument("--warmup", type=int, help="warm-up seconds per row (default 1)")
    parser.add_argument("--concurrency", default="1,16,64", help="connections per row (default 1,16,64)")
    parser.add_argument("--streams", type=int,
                        help="concurrent streams of the RSS check (default 1000, --quick 300)")
    parser.add_argument("--cores", default="0,1",
                        help="LOADGEN_CORE,PROXY_CORE: wrk + provider on the first, the proxy on the second")
    parser.add_argument("--targets", default="direct,nginx,abridge,abridge-redis",
                        help="which targets to run (default all that are installed)")
    parser.add_argument("--rows", default=",".join(ROW_GROUPS),
                        help="which rows to run, of " + ", ".join(ROW_GROUPS) + " (default all)")
    parser.add_argument("--abridge", help="the abridge binary to measure (e.g. one built from "
                        "an older commit; default target/release/abridge)")
    parser.add_argument("--out", default=str(ROOT / "target" / "bench" / "report.md"),
                        help="where to write the Markdown report")
    args = parser.parse_args()
    args.duration = args.duration or (2 if args.quick else 5)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    args.warmup = args.warmup if args.warmup is not None else 1
    args.streams = args.streams or (300 if args.quick else 1000)
    args.cores = [int(c) for c in args.cores.split(",")]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.wanted = set(args.targets.split(","))
    args.groups = set(args.rows.split(","))
    if args.groups - set(ROW_GROUPS):
        parser.error(f"--rows: unknown {', '.join(sorted(args.groups - set(ROW_GROUPS)))}")
    return args


def start_targets(bench, fake, wanted, notes):
    """The targets asked for that are installed, started; a note for each missing one."""
    targets = []
    if "direct" in wanted:
        targets.append(Target("direct", fake + "/chat/completions"))
    if "nginx" in wanted:
        t = bench.nginx(fake)
        if t:
            targets.append(t)
        else:
            notes.append("nginx is not installed: its rows are missing (apt-get install nginx).")
    if "abridge" in wanted:
        targets.append(bench.abridge("abridge", fake))
    if "abridge-redis" in wanted:
        redis_proc, redis_url = bench.redis()
        if redis_proc:
            t = bench.abridge("abridge-redis", fake, redis_url)
            t.helpers.append(("redis", redis_proc))
            targets.append(t)
        else:
            notes.append("redis-server is not installed: the abridge + Redis rows are missing.")
    return targets


def fast_rows(bench, targets, bodies, args, notes, since):
    """Every row against the provider without delays, and the paced one."""
    rows = []

    def row(label, body, c, headers=()):
        log(f"[{time.monotonic() - since:5.0f} s] {label}, {c} connections")
        rows.append({"label": label, "connections": c, "results": measure_row(
            bench, targets, args.rounds, body, c, args.duration, args.warmup, headers=headers)})

    concurrency, groups = args.concurrency, args.groups
    for label, body, _ in ROWS if "plain" in groups else ():
        for c in concurrency:
            row(label, bodies[body], c)
    # abridge adds stream_options.include_usage and strips it again: one row.
    if "strip" in groups:
        row("2 KB stream, usage added + stripped", bodies["2k-stream-strip"],
            16 if 16 in concurrency else concurrency[-1])
    # Streams at a pace closer to a model's: every event its own read and write (the
    # unpaced rows let a proxy that reads several events at once write them at once).
    if "paced" in groups:
        row(PACED_LABEL, bodies["2k-stream"], concurrency[-1], headers=[f"x-fake-delay-ms: {PACED_MS}"])
    # The long conversation: compacted once, its checkpoint applied on every request.
    if "long" in groups:
        for t in (t for t in targets if t.name.startswith("abridge")):
            report = check_long_conversation(t, bodies["long"])
            notes.append(f"{t.name}, long conversation: " + ", ".join(
                f"{k}: {v}" for k, v in sorted(report.items()) if k != "x-abridge-conversation"))
        for c in [c for c in concurrency if c <= 16] or concurrency[:1]:
            row("200 KB, compacted (checkpoint reused)", bodies["long"], c)
    return rows


def streams_row(bench, targets, bodies, args, since):
    """Many open streams: a second fake provider that pauses between events, and a
    second instance of every target in front of it."""
    slow = bench.fake("fake-provider-slow", delay_ms=SLOW_DELAY_MS)
    slow_targets = []
    for t in targets:
        if t.name == "direct":
            slow_targets.append(Target("direct", slow + "/chat/completions"))
        elif t.name == "nginx":
            s = bench.nginx(slow, "nginx-slow")
            s.name = "nginx"
            slow_targets.append(s)
        else:
            redis = t.helpers[0][1] if t.helpers else None
            s = bench.abridge(t.name + "-slow", slow,
                              f"redis://127.0.0.1:{redis_port(redis)}" if redis else None)
            s.name = t.name
            s.helpers = t.helpers  # the same Redis, its CPU reported beside
            slow_targets.append(s)
    log(f"[{time.monotonic() - since:5.0f} s] {args.streams} concurrent streams")
    # One round: what it measures is memory, which does not vary with the noise.
    return {"label": f"stream, {SLOW_DELAY_MS} ms between events", "connections": args.streams,
            "results": measure_row(bench, slow_targets, 1, bodies["2k-stream"], args.streams,
                                   max(args.duration, 5), 0)}


def write_report(args, rows, notes, host, elapsed):
    """The Markdown report, printed and written to --out."""
    if RSS_RESET_FAILED:
        notes.append("peak RSS could not be reset between rows (not root): each row's figure "
                     "is the process's peak so far, not the row's own.")
    command = " ".join(["scripts/bench-load", *sys.argv[1:]])
    report = [
        f"Load benchmark, {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, `{command}` "
        f"({elapsed / 60:.1f} min)",
        "",
        f"Machine: {host}.",
        "",
        f"Pinned with taskset: wrk (1 thread) and the fake provider on core {args.cores[0]}, "
        f"the proxy (and abridge's Redis) on core {args.cores[1]}. {args.rounds} round(s) per row, "
        f"every target once a round in turn, the quietest round (least CPU per request) kept "
        f"per target; {args.duration} s per round after {args.warmup} s of warm-up (the open-streams "
        f"row: one round); identical requests; reply of {WORDS} words "
        "(streams: role, content, finish and usage chunks and `[DONE]`, 22 events). "
        "CPU µs/req: user + system time of the proxy's process tree over the row / requests "
        "(\"+N redis\": Redis's own), and of it the system (kernel) time. Peak RSS: VmHWM, reset before each row.",
        "",
        table(rows),
        "",
        goals(rows, args.concurrency, args.streams),
        "",
    ]
    report += [f"- {n}" for n in notes]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(report) + "\n")
    print("\n".join(report))
    return out


def main():
    args = parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="abridge-bench-"))
    bench = Bench(args, workdir)
    started = time.monotonic()
    host = machine()
    notes = []
    try:
        bodies = write_bodies(workdir)
        targets = start_targets(bench, bench.fake("fake-provider"), args.wanted, notes)
        rows = fast_rows(bench, targets, bodies, args, notes, started)
        if "streams" in args.groups:
            rows.append(streams_row(bench, targets, bodies, args, started))
    finally:
        bench.stop_all()
    out = write_report(args, rows, notes, host, time.monotonic() - started)
    log(f"report written to {out}; process logs in {workdir}")


def redis_port(proc):
    """The port a Redis started by `Bench.redis` listens on (from its command line)."""
    argv = proc.popen.args
    return argv[argv.index("--port") + 1]


if __name__ == "__main__":
    main()
