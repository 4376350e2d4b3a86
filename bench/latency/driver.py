#!/usr/bin/env python3
"""Programming latency: from an API write (plain HTTP, no kubectl) to the data plane acting on it.

  driver.py dns   URL TOKEN DNS_ADDR  --changes N
      Each change creates a new Service (POST) and polls `ferry dns` (UDP, every ~0.5 ms) until
      `<name>.<ns>.svc.cluster.local A` answers the ClusterIP the API server allocated.
  driver.py slices URL TOKEN ENDPOINT_IP --services N
      Loads one EndpointSlice (one endpoint, port 8080) for each of bench/scale/load.py's
      Services with a ClusterIP, so that the proxies hold a full table.
  driver.py proxy URL TOKEN BACKEND_IP --changes N
      One Service `lat-proxy` with an EndpointSlice; each change moves the endpoint to a new
      port (merge patch of the slice) and polls new TCP connections to the ClusterIP (every ~0.5 ms) until the
      answer comes from the new port. Backends (one per port, answering their port number) run
      in a child process on BACKEND_IP.

Each sample is timed from just before the write request is sent to the first answer that
reflects it (so it includes the write's own durable commit); the part after the write's response
(watch delivery + the server's own processing) is printed as well. Changes are spaced by --gap ms so
that each one is timed alone. Prints one line per mode: count, p50, p90, p99, max (ms) and the
write's own p50/p99.
"""
import argparse, http.client, json, multiprocessing as mp, os, random, selectors, socket, struct, sys, time, urllib.parse


# Pause between two polls: fine enough for a 100 ms goal without a busy loop stealing the CPU
# the servers under test need (2 cores).
POLL = 0.0005


def api(url):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=30)


def call(c, token, method, path, body=None, ctype="application/json"):
    data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
    c.request(method, path, body=data, headers={
        "Authorization": "Bearer " + token, "Content-Type": ctype, "Accept": "application/json"})
    r = c.getresponse()
    out = r.read()
    if r.status not in (200, 201):
        raise RuntimeError(f"{method} {path}: {r.status} {out[:300]!r}")
    return json.loads(out)


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))]


def summary(label, lat, writes):
    ms = [x * 1000 for x in lat]
    wms = [x * 1000 for x in writes]
    # What the watch + the server's own work add once the API server has answered the write.
    after = [(l - w) * 1000 for l, w in zip(lat, writes)]
    print(f"{label}: n={len(ms)} p50={pct(ms, .5):.2f} p90={pct(ms, .9):.2f} p99={pct(ms, .99):.2f} "
          f"max={max(ms):.2f} ms (the write alone: p50={pct(wms, .5):.2f} p99={pct(wms, .99):.2f} ms; "
          f"after the write's response: p50={pct(after, .5):.2f} p99={pct(after, .99):.2f} ms)",
          flush=True)


# --- DNS ---------------------------------------------------------------------------------

def dns_query(name, qid):
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + q + struct.pack(">HH", 1, 1)


def dns_a(resp):
    """The A addresses of a response (answers only, names compressed or not)."""
    if len(resp) < 12:
        return []
    _, flags, qd, an, _, _ = struct.unpack(">HHHHHH", resp[:12])
    if flags & 0xF:  # rcode
        return []
    i = 12

    def skip_name(i):
        while True:
            l = resp[i]
            if l == 0:
                return i + 1
            if l & 0xC0 == 0xC0:
                return i + 2
            i += l + 1

    for _ in range(qd):
        i = skip_name(i) + 4
    out = []
    for _ in range(an):
        i = skip_name(i)
        t, _, _, rdlen = struct.unpack(">HHIH", resp[i:i + 10])
        i += 10
        if t == 1 and rdlen == 4:
            out.append(socket.inet_ntoa(resp[i:i + 4]))
        i += rdlen
    return out


def run_dns(a):
    host, port = a.target.rsplit(":", 1)
    dst = (host, int(port))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(0.0003)
    c = api(a.url)
    tag = f"{os.getpid() % 10000}-{int(time.time()) % 100000}"
    lat, writes = [], []
    qid = 1
    for i in range(a.changes):
        ns = f"ns-{i % a.namespaces}"
        name = f"lat-{tag}-{i}"
        body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
                "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}
        t0 = time.perf_counter()
        svc = call(c, a.token, "POST", f"/api/v1/namespaces/{ns}/services", body)
        writes.append(time.perf_counter() - t0)
        ip = svc["spec"]["clusterIP"]
        fq = f"{name}.{ns}.svc.cluster.local"
        deadline = t0 + a.timeout
        while True:
            qid = (qid + 1) & 0xFFFF
            s.sendto(dns_query(fq, qid), dst)
            try:
                while True:
                    resp = s.recv(4096)
                    if struct.unpack(">H", resp[:2])[0] == qid:
                        break
                if ip in dns_a(resp):
                    lat.append(time.perf_counter() - t0)
                    break
            except socket.timeout:
                pass
            if time.perf_counter() > deadline:
                raise SystemExit(f"{fq} never answered {ip}")
            time.sleep(POLL)
        time.sleep(a.gap / 1000 * (0.5 + random.random()))
    summary("dns: API write -> ferry dns answers the new Service", lat, writes)


# --- proxy -------------------------------------------------------------------------------

def backends(ip, ports, ready):
    sel = selectors.DefaultSelector()
    for p in ports:
        l = socket.socket()
        l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        l.bind((ip, p))
        l.listen(256)
        l.setblocking(False)
        sel.register(l, selectors.EVENT_READ, str(p).encode() + b"\n")
    ready.set()
    while True:
        for key, _ in sel.select():
            try:
                conn, _ = key.fileobj.accept()
            except BlockingIOError:
                continue
            try:
                conn.sendall(key.data)
            except OSError:
                pass
            conn.close()


def fetch(addr, timeout):
    s = socket.socket()
    s.settimeout(timeout)
    try:
        s.connect(addr)
        return s.recv(64).decode().strip()
    except OSError:
        return None
    finally:
        s.close()


def run_proxy(a):
    base = a.base_port
    ports = [base + i for i in range(a.changes + 1)]
    ready = mp.Event()
    child = mp.Process(target=backends, args=(a.target, ports, ready), daemon=True)
    child.start()
    ready.wait(30)
    c = api(a.url)
    ns, name = "ns-0", f"lat-proxy-{a.label}"
    svc = call(c, a.token, "POST", f"/api/v1/namespaces/{ns}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
    vip = (svc["spec"]["clusterIP"], 80)
    slice_path = f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"

    def ports_of(p):
        return [{"name": "http", "port": p, "protocol": "TCP"}]

    call(c, a.token, "POST", slice_path, {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"{name}-1", "namespace": ns,
                     "labels": {"kubernetes.io/service-name": name,
                                "endpointslice.kubernetes.io/managed-by": "bench"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a.target], "conditions": {"ready": True}}],
        "ports": ports_of(base)})
    deadline = time.perf_counter() + 120
    while fetch(vip, 0.5) != str(base):
        if time.perf_counter() > deadline:
            raise SystemExit(f"{vip} never forwarded to the first endpoint")
        time.sleep(0.01)
    lat, writes = [], []
    for i in range(1, a.changes + 1):
        want = str(base + i)
        t0 = time.perf_counter()
        call(c, a.token, "PATCH", f"{slice_path}/{name}-1", {"ports": ports_of(base + i)},
             ctype="application/merge-patch+json")
        writes.append(time.perf_counter() - t0)
        deadline = t0 + a.timeout
        while True:
            got = fetch(vip, 0.5)
            if got == want:
                lat.append(time.perf_counter() - t0)
                break
            if time.perf_counter() > deadline:
                raise SystemExit(f"{vip} never forwarded to port {want} (last answer {got!r})")
            time.sleep(POLL)
        time.sleep(a.gap / 1000 * (0.5 + random.random()))
    call(c, a.token, "DELETE", f"{slice_path}/{name}-1")
    call(c, a.token, "DELETE", f"/api/v1/namespaces/{ns}/services/{name}")
    child.terminate()
    summary(f"proxy ({a.label}): API write -> new connections reach the new endpoint", lat, writes)


# --- load: an EndpointSlice for every Service bench/scale/load.py made with a ClusterIP --------

def slice_chunk(args):
    url, token, lo, hi, a = args
    c = api(url)
    for i in range(lo, hi):
        ns, name = f"ns-{i % a.namespaces}", f"svc-{i}"
        call(c, token, "POST", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{name}-lat", "namespace": ns,
                         "labels": {"kubernetes.io/service-name": name,
                                    "endpointslice.kubernetes.io/managed-by": "bench"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [a.target], "conditions": {"ready": True}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
    return hi - lo


def run_slices(a):
    lo = a.services // 10  # load.py's headless Services have slices already
    step = max(1, (a.services - lo + 31) // 32)
    chunks = [(a.url, a.token, x, min(a.services, x + step), a) for x in range(lo, a.services, step)]
    t0 = time.time()
    with mp.Pool(8) as p:
        n = sum(p.map(slice_chunk, chunks))
    print(f"loaded {n} EndpointSlices in {time.time() - t0:.1f} s", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["dns", "proxy", "slices"])
    p.add_argument("url"); p.add_argument("token"); p.add_argument("target")
    p.add_argument("--changes", type=int, default=200)
    p.add_argument("--namespaces", type=int, default=100)
    p.add_argument("--gap", type=float, default=100.0, help="mean ms between changes")
    p.add_argument("--timeout", type=float, default=30.0, help="s before a change counts as lost")
    p.add_argument("--base-port", type=int, default=31000)
    p.add_argument("--label", default="userspace")
    p.add_argument("--services", type=int, default=10000)
    a = p.parse_args()
    {"dns": run_dns, "proxy": run_proxy, "slices": run_slices}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
