#!/usr/bin/env python3
"""Holds connections to a `toolwire serve` the way a hostile client would,
then times one ordinary request and waits for the server to close the held
connections (docs/performance.md, "Idle and slowloris connections").

    python3 scripts/hold_connections.py PORT COUNT idle|slowloris

idle: connections that send nothing. slowloris: each sends one byte of a
request head per polling round. Prints one JSON line. Loopback only.
"""
import json
import socket
import sys
import time
import urllib.request

port, count, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
held = []
for _ in range(count):
    s = socket.socket()
    s.connect(("127.0.0.1", port))
    if mode == "slowloris":
        s.send(b"G")
    held.append(s)
started = time.monotonic()
with urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json", timeout=60) as r:
    r.read()
    status = r.status
answer_ms = (time.monotonic() - started) * 1000
waiting = time.monotonic()
still_open = set(range(count))
for s in held:
    s.settimeout(0.05)
while still_open and time.monotonic() - waiting < 60:
    for i in list(still_open):
        try:
            if mode == "slowloris":
                held[i].send(b"E")
            held[i].recv(4096)
            still_open.discard(i)  # end of file (or an answer): closed
        except socket.timeout:
            pass
        except OSError:
            still_open.discard(i)
    time.sleep(0.2)
print(json.dumps({
    "mode": mode,
    "held": count,
    "status": status,
    "answer_ms": round(answer_ms, 1),
    "all_closed_after_s": round(time.monotonic() - waiting, 1),
    "still_open": len(still_open),
}))
