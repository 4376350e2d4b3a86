#!/usr/bin/env python3
"""Times field-selected LISTs and watch starts of Pods against a running `ferry apiserver`
(plain HTTP on loopback), 3 of each; prints one JSON line.
Usage: field_selector.py PORT TOKEN [SELECTOR (default spec.nodeName=bench-node)]"""
import http.client, json, sys, time
port, token = int(sys.argv[1]), sys.argv[2]
sel = sys.argv[3] if len(sys.argv) > 3 else "spec.nodeName=bench-node"
H = {"Authorization": "Bearer " + token}
def get(path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t = time.monotonic(); c.request("GET", path, headers=H); r = c.getresponse(); b = r.read()
    return time.monotonic() - t, r.status, b
def watch(path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t = time.monotonic(); c.request("GET", path, headers=H); r = c.getresponse()
    n = 0
    while True:
        line = r.readline()
        if not line: break
        ev = json.loads(line)
        if ev["type"] == "BOOKMARK": break
        n += 1
    d = time.monotonic() - t; c.close(); return d, n
res = {}
for i in range(3):
    d, st, b = get(f"/api/v1/pods?fieldSelector={sel}")
    res.setdefault("list", []).append(round(d, 3)); items = len(json.loads(b)["items"])
for i in range(3):
    d, st, b = get(f"/api/v1/pods?fieldSelector={sel}&limit=500")
    res.setdefault("list_limit500", []).append(round(d, 3))
for i in range(3):
    d, n = watch(f"/api/v1/pods?watch=1&fieldSelector={sel}&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan")
    res.setdefault("watchlist_to_bookmark", []).append(round(d, 3))
d, st, b = get("/api/v1/pods?fieldSelector=status.phase=Running&limit=500")
res["phase_running_limit500"] = round(d, 3)
print(json.dumps({"selector": sel, "items": items, **res}))
