"""The processes of the load benchmark (`load.py`): starting them pinned to a core,
their process trees, CPU time, peak RSS, and waiting for them to answer. Linux only
(/proc)."""

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A process started here, pinned to `core`, its output in `log_path`."""

    def __init__(self, name, argv, core, log_path, env=None):
        self.name = name
        self.log_path = log_path
        self.log_file = open(log_path, "wb")
        self.popen = subprocess.Popen(
            ["taskset", "-c", str(core), *argv],
            stdout=self.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        self.pid = self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def stop(self):
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.log_file.close()


def process_tree(pid):
    """`pid` and all its descendants (nginx: master and worker)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def cpu_times(pids):
    """(utime + stime, stime) of the processes (all their threads), in seconds."""
    total = kernel = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
            kernel += int(fields[12])
        except OSError:
            pass
    return total / TICK, kernel / TICK


def cpu_seconds(pids):
    """utime + stime of the processes (all their threads), in seconds."""
    return cpu_times(pids)[0]


def status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


RSS_RESET_FAILED = []  # pids whose peak RSS could not be reset (needs root)


def reset_peak_rss(pids):
    for pid in pids:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
        except OSError:
            RSS_RESET_FAILED.append(pid)


def peak_rss_mb(pids):
    return sum(status_kb(p, "VmHWM") for p in pids) / 1024


def http(method, url, body=None, headers=None, timeout=30):
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def wait_ready(url, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited; see {proc.log_path}")
        try:
            http("GET", url, timeout=2)
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout} s")
