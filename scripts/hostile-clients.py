#!/usr/bin/env python3
"""What hostile clients can hold of `tinygpt serve`: the figures of docs/faults.md.

    python3 scripts/hostile-clients.py            (needs a release build: cargo build --release)

Trains a small run in a temporary directory, then, each against a fresh server on loopback:
2,000 idle connections; 400 connections sending half a header, then 400 sending 350 KB of a
header that never ends; a client that stops reading a stream (at --write-timeout 30s and 1s);
SIGTERM with a client stalled mid-request, then a second SIGTERM. The client needs about 2,100
open files (ulimit -n).
"""
import json, os, signal, socket, subprocess, sys, tempfile, time, urllib.request

BIN = os.environ.get("TINYGPT") or os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "tinygpt")
PORT = 8770


def start(run, *extra):
    p = subprocess.Popen([BIN, "serve", "--checkpoint", run, "--port", str(PORT), "--backend", "fused", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    p.stdout.readline()
    return p


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait()


def health():
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=10).read())["stats"]


def rss_kib(p):
    with open(f"/proc/{p.pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))


def connect():
    return socket.create_connection(("127.0.0.1", PORT))


def flood(run):
    p = start(run, "--header-timeout", "5s")
    socks = [connect() for _ in range(2000)]
    time.sleep(1)
    refused = 0
    for s in socks:
        s.setblocking(False)
        try:
            refused += s.recv(64).startswith(b"HTTP/1.1 503")
        except BlockingIOError:
            pass
    t = time.time()
    for s in socks:
        s.settimeout(30)
        try:
            s.recv(64)
        except OSError:
            pass
    print(f"2000 idle connections: {2000 - refused} held, {refused} answered 503 at once; "
          f"the held ones closed by --header-timeout 5s ({time.time() - t:.1f} s after the last opened); "
          f"then {health()}")
    stop(p)


def heads(run):
    p = start(run)
    for pad, label in [(30, "half a header"), (350 * 1024, "350 KB of a header that never ends")]:
        before = rss_kib(p)
        socks = []
        for _ in range(400):
            s = connect()
            s.setblocking(False)
            try:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * pad)
            except BlockingIOError:
                pass
            socks.append(s)
        time.sleep(2)
        print(f"400 connections sending {label}: the server grew by {(rss_kib(p) - before) / 1024:.1f} MiB "
              f"(resident {rss_kib(p) / 1024:.1f} MiB)")
        for s in socks:
            s.close()
        time.sleep(1)
    stop(p)


def stalled_reader(run, timeout):
    p = start(run, "--max-concurrent", "1", "--max-tokens", "10000000", "--write-timeout", timeout)
    s = connect()
    body = json.dumps({"prompt": "Of", "max_tokens": 10_000_000, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    seen = b""
    while b"data: {" not in seen:
        seen += s.recv(4096)
    t, last, tokens = time.time(), time.time(), None
    while (h := health())["active"] != 0:
        if h["tokens"] != tokens:
            last, tokens = time.time(), h["tokens"]
        time.sleep(0.05)
    print(f"a client that stops reading, --write-timeout {timeout}: its worker freed {time.time() - t:.1f} s "
          f"after its last read ({time.time() - last:.1f} s after the buffers filled and generation paused)")
    stop(p)


def shutdown(run):
    for second in (False, True):
        p = start(run)
        s = connect()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-")
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        t = time.time()
        if second:
            time.sleep(1)
            p.send_signal(signal.SIGTERM)
            t = time.time()
        p.wait()
        what = "a second SIGTERM" if second else "SIGTERM (default --shutdown-timeout and --header-timeout, 30s)"
        print(f"{what} with a client stalled mid-request: exit {p.returncode} after {time.time() - t:.1f} s")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        subprocess.run([BIN, "train", "--config", "baby", "--max-iters", "20", "--out", run, "--backend", "fused"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for measure in (flood, heads, shutdown):
            measure(run)
        for timeout in ("30s", "1s"):
            stalled_reader(run, timeout)


if __name__ == "__main__":
    sys.exit(main())
