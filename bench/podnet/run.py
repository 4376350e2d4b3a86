#!/usr/bin/env python3
"""Pod network benchmark (issue 10). Not a test: prints figures and ratios.

1. create -> Ready latency of 100 pods spread over 3 nodes of `ferry up --nodes 3` (netns pod
   network, reference CNI plugins): p50 / p99 / max, measured client-side from the create call
   to the watch event showing the pod Ready.
2. pod-to-pod TCP throughput across nodes (pod on node 1 -> pod on node 3: veth, bridge cni0,
   node veth, cluster bridge, node veth, cni0, veth) against the same kind of path set up by
   hand (two namespaces joined by one veth pair), as a ratio. Both sides use the same Python
   sender/receiver, so the ratio measures the path, not the tool.

Run as root: nice -n 19 python3 bench/podnet/run.py [path/to/ferry]
Everything lives in namespaces this script (or ferry) creates, removed at the end.
"""
import json, os, signal, subprocess, sys, tempfile, threading, time

FERRY = sys.argv[1] if len(sys.argv) > 1 else "target/release/ferry"
N_PODS = int(os.environ.get("PODS", "100"))
BYTES = int(os.environ.get("BYTES", str(512 * 1024 * 1024)))

RECV = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5201)); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); n = 0; t = None
buf = bytearray(1 << 20)
while True:
    k = c.recv_into(buf)
    if not k: break
    if t is None: t = time.perf_counter()
    n += k
print(n / (time.perf_counter() - t) / 1e6, flush=True)
"""
SEND = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], 5201))
b = b"x" * (1 << 20); left = int(sys.argv[2])
while left > 0:
    s.sendall(b); left -= len(b)
s.close()
"""


def sh(*a, **kw):
    return subprocess.run(a, check=True, capture_output=True, text=True, **kw).stdout


def throughput(recv_ns, send_ns, dst):
    r = subprocess.Popen(["ip", "netns", "exec", recv_ns, "python3", "-c", RECV],
                         stdout=subprocess.PIPE, text=True)
    assert r.stdout.readline().strip() == "ready"
    sh("ip", "netns", "exec", send_ns, "python3", "-c", SEND, dst, str(BYTES))
    mbps = float(r.stdout.readline())
    r.wait()
    return mbps


def by_hand():
    a, b = f"ferry-bench-a{os.getpid()}", f"ferry-bench-b{os.getpid()}"
    try:
        sh("ip", "netns", "add", a); sh("ip", "netns", "add", b)
        sh("ip", "-n", a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", b)
        for ns, ip in ((a, "198.19.0.1/24"), (b, "198.19.0.2/24")):
            sh("ip", "-n", ns, "addr", "add", ip, "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        return throughput(b, a, "198.19.0.2")
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "delete", ns])


def main():
    d = tempfile.mkdtemp(prefix="ferry-bench-")
    log = open(os.path.join(d, "ferry.log"), "w")
    p = subprocess.Popen([FERRY, "up", "--data-dir", d, "--pod-network", "netns", "--nodes", "3",
                          "--listen-api", "127.0.0.1:0", "--agent-port", "0",
                          "--dns-metrics-listen", "127.0.0.1:0", "--node-name", "bench",
                          "--proxy-healthz-listen", "off"], stdout=subprocess.DEVNULL, stderr=log)
    try:
        kc = os.path.join(d, "kubeconfig")
        while not os.path.exists(kc):
            time.sleep(0.1)
        from kubernetes import client, config, watch
        config.load_kube_config(kc)
        v1 = client.CoreV1Api()
        while sum(1 for n in v1.list_node().items for c in n.status.conditions or []
                  if c.type == "Ready" and c.status == "True") < 3:
            time.sleep(0.2)
        created, ready = {}, {}

        def watcher():
            w = watch.Watch()
            for ev in w.stream(v1.list_namespaced_pod, "default", timeout_seconds=600):
                pod = ev["object"]
                if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
                    ready.setdefault(pod.metadata.name, time.perf_counter())
                if len(ready) >= N_PODS:
                    w.stop()
        t = threading.Thread(target=watcher); t.start()
        time.sleep(0.5)
        for i in range(N_PODS):
            name = f"p{i}"
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": {"nodeName": f"bench-{i % 3 + 1}",
                             "containers": [{"name": "c", "image": "busybox",
                                             "command": ["sleep", "3600"]}]}}
            created[name] = time.perf_counter()
            v1.create_namespaced_pod("default", body)
        t.join()
        lat = sorted(ready[n] - created[n] for n in created if n in ready)
        pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
        print(f"create->Ready, {len(lat)} pods over 3 nodes: p50 {pct(0.5)*1000:.0f} ms, "
              f"p99 {pct(0.99)*1000:.0f} ms, max {lat[-1]*1000:.0f} ms")
        prefix = json.load(open(os.path.join(d, "netns.json")))["prefix"]
        uid = lambda n: v1.read_namespaced_pod(n, "default").metadata.uid
        ip = v1.read_namespaced_pod("p0", "default").status.pod_ip  # on node 1
        pod_ns = lambda n: f"{prefix}-pod-{uid(n)}"
        cross = throughput(pod_ns("p0"), pod_ns("p2"), ip)  # p2 is on node 3
        hand = by_hand()
        print(f"pod-to-pod TCP across nodes: {cross:.0f} MB/s; hand-made veth pair: {hand:.0f} MB/s; "
              f"ratio {cross / hand:.2f}")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)


if __name__ == "__main__":
    main()
