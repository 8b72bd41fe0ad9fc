#!/usr/bin/env python3
"""Instructions per request of abridge (and nginx) under valgrind's callgrind.

Wall-clock numbers move with everything else on the machine; instruction counts do not.
This runs the fake provider (bench mode) natively and the proxy under
`valgrind --tool=callgrind` with collection off, warms the proxy up, switches collection
on, sends N identical requests one after another over one keep-alive connection,
switches it off and reports instructions per request: the total, then the functions
that dominate (exclusive cost, as callgrind_annotate prints them).

    python3 scripts/bench/callgrind.py                 # every case, abridge and nginx
    python3 scripts/bench/callgrind.py --cases 2k --top 40 --targets abridge
    python3 scripts/bench/callgrind.py --cases 2k --targets abridge,abridge-redis
    python3 scripts/bench/callgrind.py --cases 200k,200k-messages,200k-responses --targets abridge

Cases: 2k, 2k-stream, 2k-stream-strip, 200k and long are chat-completions bodies;
200k-messages (Anthropic's Messages API, POST /v1/messages) and 200k-responses (OpenAI's
Responses API, POST /v1/responses) are 200k's conversation in the other two wire formats.

Needs valgrind (apt-get install valgrind) and the release binaries
(`cargo build --release -p abridge -p fake-provider`); nginx is measured when installed.
"""

import argparse
import http.client
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load  # noqa: E402  (the bodies and process helpers of the load benchmark)

CASES = {
    # name: (body, requests, API)
    "2k": ("2k", 200, "chat"),
    "2k-stream": ("2k-stream", 200, "chat"),
    "2k-stream-strip": ("2k-stream-strip", 200, "chat"),
    "200k": ("200k", 50, "chat"),
    "long": ("long", 50, "chat"),
    "200k-messages": ("200k-messages", 50, "messages"),
    "200k-responses": ("200k-responses", 50, "responses"),
}

# Per API: the path and the headers its clients send (Anthropic's SDKs put the key in
# x-api-key and require anthropic-version; the fake provider refuses a Messages request
# without it).
APIS = {
    "chat": ("/v1/chat/completions", {"authorization": "Bearer sk-bench-not-a-real-key"}),
    "responses": ("/v1/responses", {"authorization": "Bearer sk-bench-not-a-real-key"}),
    "messages": ("/v1/messages", {"x-api-key": "sk-bench-not-a-real-key",
                                  "anthropic-version": "2023-06-01"}),
}


def send(port, api, body, n):
    """`n` POSTs over one keep-alive connection; every answer must be 200."""
    path, api_headers = APIS[api]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"content-type": "application/json", **api_headers}
    for _ in range(n):
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response_body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{path} answered {response.status}: {response_body[:300]!r}")
    conn.close()


def settle(pid, timeout=600):
    """Waits until the process is idle (under 2 % of a core for a second): start-up work
    in the background must not be counted as the requests'."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = load.cpu_seconds([pid])
        time.sleep(1)
        if load.cpu_seconds([pid]) - before < 0.02:
            return
    raise RuntimeError(f"process {pid} did not settle within {timeout} s")


def control(pid, *args):
    subprocess.run(["callgrind_control", *args, str(pid)], check=True,
                   capture_output=True, timeout=120)


def annotate(path, top):
    out = subprocess.run(["callgrind_annotate", "--inclusive=no", f"--threshold=100", str(path)],
                         capture_output=True, text=True, check=True).stdout
    total = None
    functions = []
    # SHA-256 block compression, inclusive: the largest line naming the function (its
    # whole-function total; the others are parts of it, by source file of the inlined code).
    inclusive = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)],
                               capture_output=True, text=True, check=True).stdout
    sha = max((int(m.group(1).replace(",", "")) for line in inclusive.splitlines()
               if "sha2::sha256::compress256" in line
               for m in [re.match(r"\s*([\d,]+)", line)] if m), default=0)
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(\([^)]*\)\s+)?PROGRAM TOTALS", line)
        if m:
            total = int(m.group(1).replace(",", ""))
            continue
        m = re.match(r"\s*([\d,]+)\s+\(\s*([\d.]+)%\)\s+(.*)$", line)
        if m and total is not None and len(functions) < top:
            functions.append((int(m.group(1).replace(",", "")), m.group(3)))
    return total, functions, sha


def short(name):
    """A function name without its file prefix and generic noise."""
    name = re.sub(r"^[^:]*:", "", name, count=1) if re.match(r"^[^:]*\.rs:|^\?\?\?:|^/", name) else name
    name = re.sub(r" \[[^\]]*\]$", "", name)
    return name[:150]


def profile(args, bench, target, fake_base, case, workdir, bodies):
    body_name, n, api = CASES[case]
    if args.requests:
        n = args.requests
    body = bodies[body_name].read_bytes()
    out = workdir / f"callgrind.{target}.{case}.out"
    port = load.free_port()
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out}"]
    if target == "nginx":
        conf_dir = workdir / f"nginx-{case}"
        conf_dir.mkdir(exist_ok=True)
        upstream = fake_base.rsplit(":", 1)[1].split("/")[0]
        conf = load.NGINX_CONF.format(dir=conf_dir, upstream=upstream, port=port,
                                      user="user root;" if os.geteuid() == 0 else "")
        conf = conf.replace("daemon off;", "daemon off;\nmaster_process off;")
        (conf_dir / "nginx.conf").write_text(conf)
        argv = [*valgrind, shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(conf_dir),
                "-c", str(conf_dir / "nginx.conf"), "-e", str(conf_dir / "nginx-error.log")]
        proc = bench.start(f"cg-nginx-{case}", argv, bench.proxy_core)
        ready = f"http://127.0.0.1:{port}/v1/models"
    else:
        admin = load.free_port()
        config = workdir / "abridge.toml"
        config.write_text(f'[compaction.context_windows]\n"{load.LONG_MODEL}" = 16000\n')
        # Anthropic's routes go to `anthropic_upstream` when it is set (one abridge for
        # OpenAI clients and Claude Code at once): here the same fake, which answers every API.
        env = {"ABRIDGE_LISTEN": f"127.0.0.1:{port}", "ABRIDGE_ADMIN__LISTEN": f"127.0.0.1:{admin}",
               "ABRIDGE_UPSTREAM": fake_base, "ABRIDGE_ANTHROPIC_UPSTREAM": fake_base}
        if target == "abridge-redis":
            redis_proc, redis_url = bench.redis()
            if not redis_proc:
                sys.exit("redis-server is not installed (apt-get install redis-server)")
            env["ABRIDGE_REDIS_URL"] = redis_url
        argv = [*valgrind, args.abridge, "--config", str(config)]
        proc = bench.start(f"cg-abridge-{case}", argv, bench.proxy_core, env)
        ready = f"http://127.0.0.1:{admin}/healthz"
    try:
        load.wait_ready(ready, proc, timeout=120)
        send(port, api, body, args.warmup)  # pools, lazy tables, the checkpoint of `long`
        settle(proc.pid)  # abridge loads its tokenizer tables in the background at start
        control(proc.pid, "-i", "on")
        send(port, api, body, n)
        time.sleep(0.5)  # the record stage runs after the response
        control(proc.pid, "-i", "off")
        control(proc.pid, "-d")
    finally:
        proc.stop()
        bench.procs.remove(proc)
    dumps = sorted(workdir.glob(f"callgrind.{target}.{case}.out*"), key=lambda p: p.stat().st_size)
    dump = dumps[-1]
    total, functions, sha = annotate(dump, args.top)
    return n, total, functions, sha, dump


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="2k,2k-stream,200k,long", help=f"of {','.join(CASES)}")
    parser.add_argument("--targets", default="abridge,nginx",
                        help="of abridge, abridge-redis (a redis-server of its own), nginx")
    parser.add_argument("--requests", type=int, help="requests per case (default 200, 50 for 200 KB)")
    parser.add_argument("--warmup", type=int, default=20, help="requests before measuring")
    parser.add_argument("--top", type=int, default=25, help="functions listed per case")
    parser.add_argument("--cores", default="0,1")
    parser.add_argument("--keep", action="store_true", help="keep the callgrind files")
    parser.add_argument("--abridge", default=str(load.RELEASE / "abridge"),
                        help="the abridge binary to profile (e.g. one built from an older commit)")
    args = parser.parse_args()
    args.cores = [int(c) for c in args.cores.split(",")]
    if not shutil.which("valgrind"):
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    workdir = Path(tempfile.mkdtemp(prefix="abridge-callgrind-"))
    bench = load.Bench(args, workdir)
    results = []
    try:
        bodies = load.write_bodies(workdir)
        fake = bench.fake("fake-provider")
        for case in args.cases.split(","):
            for target in args.targets.split(","):
                if target == "nginx" and not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")):
                    continue
                load.log(f"callgrind: {target}, {case}")
                n, total, functions, sha, dump = profile(args, bench, target, fake, case, workdir, bodies)
                results.append((case, target, n, total, sha))
                print(f"\n## {target}, {case}: {total / n:,.0f} instructions per request "
                      f"({n} requests, {total:,} in all; SHA-256 compression {sha / n:,.0f}; {dump})")
                for ir, name in functions:
                    print(f"{ir / n:>12,.0f}  {100 * ir / total:5.1f}%  {short(name)}")
    finally:
        bench.stop_all()
    # Valgrind hides the CPU's SHA extensions, so SHA-256 runs its portable code here,
    # about ten times the instructions of the native path: shown apart.
    print("\n| case | target | instructions per request | of which SHA-256 (portable) | the rest |")
    print("|---|---|---:|---:|---:|")
    for case, target, n, total, sha in results:
        print(f"| {case} | {target} | {total / n:,.0f} | {sha / n:,.0f} | {(total - sha) / n:,.0f} |")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
