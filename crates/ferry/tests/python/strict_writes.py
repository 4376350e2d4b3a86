"""Writes upstream refuses: a patch that renames or moves the object (400) and duplicate JSON
keys under fieldValidation=Strict (400; a Warning under the default Warn)."""
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request

from kubernetes import client, config
from kubernetes.client.rest import ApiException

config.load_kube_config()
api = client.ApiClient()
core = client.CoreV1Api(api)
core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="s1"), data={"a": "1"}))


cfg = client.Configuration.get_default_copy()
ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else None
token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
if token and not token.startswith("Bearer "):
    token = "Bearer " + token


def raw(method, path, body, ctype="application/json", query=None):
    url = cfg.host + path + ("?" + urllib.parse.urlencode(query) if query else "")
    data = body if isinstance(body, str) else json.dumps(body)
    req = urllib.request.Request(url, data=data.encode(), method=method,
                                 headers={"Content-Type": ctype, "Accept": "application/json", "Authorization": token})
    try:
        with urllib.request.urlopen(req, context=ctx) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode()


for ctype, patch in [
    ("application/merge-patch+json", {"metadata": {"name": "renamed"}}),
    ("application/strategic-merge-patch+json", {"metadata": {"namespace": "kube-system"}}),
    ("application/json-patch+json", [{"op": "replace", "path": "/metadata/name", "value": "x"}]),
]:
    code, _, body = raw("PATCH", "/api/v1/namespaces/default/configmaps/s1", patch, ctype)
    assert code == 400, (ctype, code, body)
    assert "does not match" in json.loads(body)["message"], body
assert core.read_namespaced_config_map("s1", "default").data == {"a": "1"}

dup = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"d1"},"data":{"k":"1","k":"2"}}'
code, _, body = raw("POST", "/api/v1/namespaces/default/configmaps", dup, query=[("fieldValidation", "Strict")])
assert code == 400, (code, body)
msg = json.loads(body)["message"]
assert msg == 'ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error: duplicate field "data.k"', msg
try:
    core.read_namespaced_config_map("d1", "default")
    raise AssertionError("stored after a refusal")
except ApiException as e:
    assert e.status == 404
code, headers, body = raw("POST", "/api/v1/namespaces/default/configmaps", dup)
assert code == 201, (code, body)
assert 'duplicate field \\"data.k\\"' in headers.get("warning", ""), headers
code, headers, body = raw("POST", "/api/v1/namespaces/default/configmaps", dup.replace("d1", "d2"), query=[("fieldValidation", "Ignore")])
assert code == 201 and "warning" not in headers, (code, headers)
# No fieldManager: the manager comes from the User-Agent (upstream), as an Update entry.
mf = core.read_namespaced_config_map("s1", "default").metadata.managed_fields
assert [(m.manager, m.operation) for m in mf] == [("OpenAPI-Generator", "Update")], mf
# Upstream always serializes spec and status (Go structs held by value).
code, _, body = raw("POST", "/api/v1/namespaces/default/services", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "shape"}, "spec": {"ports": [{"port": 80}]}})
assert code == 201, (code, body)
assert json.loads(body)["status"] == {"loadBalancer": {}}, body
code, _, body = raw("POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases", {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "shape"}})
assert code == 201 and json.loads(body)["spec"] == {}, (code, body)
print("OK")
