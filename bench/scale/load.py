#!/usr/bin/env python3
"""Load N namespaces, Services (some headless with EndpointSlices) and Pods with pod IPs
through a Kubernetes API server (plain HTTP + bearer token), with several client processes.

Pods: create, then a status merge-patch (phase Running, podIP/podIPs, Ready), as a kubelet would.
Usage: load.py URL TOKEN [--namespaces 100] [--services 10000] [--headless 1000] [--pods 150000] [--clients 8]
"""
import argparse, http.client, json, multiprocessing as mp, sys, time, urllib.parse


def conn(url):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=120)


def req(c, token, method, path, body, ctype="application/json"):
    data = json.dumps(body, separators=(",", ":")).encode()
    for attempt in range(20):
        try:
            c.request(method, path, body=data, headers={
                "Authorization": "Bearer " + token, "Content-Type": ctype,
                "Accept": "application/json"})
            r = c.getresponse()
            out = r.read()
            if r.status in (200, 201, 409):
                return r.status
            if r.status in (429, 500, 503, 504):
                time.sleep(0.2 * (attempt + 1)); continue
            raise RuntimeError(f"{method} {path}: {r.status} {out[:300]!r}")
        except (ConnectionError, http.client.HTTPException, OSError):
            time.sleep(0.2 * (attempt + 1))
            c.close(); c.connect()
    raise RuntimeError(f"{method} {path}: gave up")


def pod_ip(i):
    return f"10.{64 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}"


def work(args):
    url, token, kind, lo, hi, a = args
    c = conn(url)
    for i in range(lo, hi):
        ns = f"ns-{i % a.namespaces}"
        if kind == "svc":
            headless = i < a.headless
            name = f"svc-{i}"
            spec = {"ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}
            if headless:
                spec["clusterIP"] = "None"
            req(c, token, "POST", f"/api/v1/namespaces/{ns}/services",
                {"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": name, "namespace": ns, "labels": {"app": name}}, "spec": spec})
            if headless:
                eps = [{"addresses": [pod_ip(i * 3 + k)], "conditions": {"ready": True},
                        "hostname": f"h{k}"} for k in range(3)]
                req(c, token, "POST", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                    {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": {"name": f"{name}-abc", "namespace": ns,
                                  "labels": {"kubernetes.io/service-name": name,
                                             "endpointslice.kubernetes.io/managed-by": "bench"}},
                     "addressType": "IPv4", "endpoints": eps,
                     "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
        else:
            name = f"pod-{i}"
            ip = pod_ip(i)
            req(c, token, "POST", f"/api/v1/namespaces/{ns}/pods",
                {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": name, "namespace": ns, "labels": {"app": f"svc-{i % a.services}"}},
                 "spec": {"automountServiceAccountToken": False, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
            req(c, token, "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
                {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                            "conditions": [{"type": "Ready", "status": "True"}]}},
                ctype="application/merge-patch+json")
    return hi - lo


def run(url, token, kind, n, a):
    if n <= 0:
        return
    step = (n + a.clients * 4 - 1) // (a.clients * 4)
    chunks = [(url, token, kind, lo, min(n, lo + step), a) for lo in range(0, n, step)]
    t0 = time.time()
    with mp.Pool(a.clients) as p:
        done = sum(p.map(work, chunks))
    dt = time.time() - t0
    print(f"loaded {done} {kind} in {dt:.1f} s ({done / dt:.0f}/s)", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url"); p.add_argument("token")
    p.add_argument("--namespaces", type=int, default=100)
    p.add_argument("--services", type=int, default=10000)
    p.add_argument("--headless", type=int, default=1000)
    p.add_argument("--pods", type=int, default=150000)
    p.add_argument("--clients", type=int, default=8)
    a = p.parse_args()
    c = conn(a.url)
    for n in range(a.namespaces):
        req(c, a.token, "POST", "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"ns-{n}"}})
        # what the service-account controller would create (pod admission needs it)
        req(c, a.token, "POST", f"/api/v1/namespaces/ns-{n}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    run(a.url, a.token, "svc", a.services, a)
    run(a.url, a.token, "pod", a.pods, a)


if __name__ == "__main__":
    sys.exit(main())
