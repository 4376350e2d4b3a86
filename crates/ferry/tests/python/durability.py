"""Streams creates; prints each acknowledged name on its own line, flushed."""
import sys
import threading
from kubernetes import client, config

config.load_kube_config()
core = client.CoreV1Api()
n = int(sys.argv[1])
lock = threading.Lock()


def worker(start, step):
    for i in range(start, n, step):
        cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"cm-{i}"), data={"i": str(i)})
        try:
            core.create_namespaced_config_map("default", cm)
        except Exception:
            return
        with lock:
            sys.stdout.write(f"cm-{i}\n")
            sys.stdout.flush()


threads = [threading.Thread(target=worker, args=(k, 8)) for k in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
