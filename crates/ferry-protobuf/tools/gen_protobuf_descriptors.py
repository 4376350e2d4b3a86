#!/usr/bin/env python3
"""Generates `src/descriptors.rs`: the protobuf <-> JSON descriptor table of Ferry's served kinds.

Inputs (all read-only):
  --k8s-pb DIR        the `src/` directory of the `k8s-pb` crate (prost structs: field tags and wire types)
  --k8s-api DIR       a checkout of https://github.com/kubernetes/api (Go `types.go`: JSON names,
                      `omitempty`, pointer-ness, inlined structs, matched by protobuf tag number)
  --apimachinery DIR  a checkout of https://github.com/kubernetes/apimachinery (same, for meta/v1)
  --out FILE          the Rust file to write

Run from the crate directory, e.g.
  python3 tools/gen_protobuf_descriptors.py --k8s-pb ~/.cargo/registry/src/*/k8s-pb-0.9.0/src \
      --k8s-api /tmp/k8s-api --apimachinery /tmp/apimachinery --out src/descriptors.rs
The output is committed unformatted (`#[rustfmt::skip]`, one line per field). The Go checkouts only supply per-field JSON facts; fields the Go sources lack
(version skew) fall back to a camelCase name and are reported on stderr.
"""

import argparse
import os
import re
import sys

# (apiVersion, kind, k8s-pb module path, message name). kind "DeleteOptions" matches any apiVersion.
ROOTS = [
    ("v1", "Namespace", "api/core/v1", "Namespace"),
    ("v1", "Node", "api/core/v1", "Node"),
    ("v1", "Pod", "api/core/v1", "Pod"),
    ("v1", "Service", "api/core/v1", "Service"),
    ("v1", "Endpoints", "api/core/v1", "Endpoints"),
    ("v1", "ConfigMap", "api/core/v1", "ConfigMap"),
    ("v1", "Secret", "api/core/v1", "Secret"),
    ("v1", "Event", "api/core/v1", "Event"),
    ("v1", "ServiceAccount", "api/core/v1", "ServiceAccount"),
    ("apps/v1", "Deployment", "api/apps/v1", "Deployment"),
    ("apps/v1", "ReplicaSet", "api/apps/v1", "ReplicaSet"),
    ("apps/v1", "StatefulSet", "api/apps/v1", "StatefulSet"),
    ("apps/v1", "DaemonSet", "api/apps/v1", "DaemonSet"),
    ("apps/v1", "ControllerRevision", "api/apps/v1", "ControllerRevision"),
    ("batch/v1", "Job", "api/batch/v1", "Job"),
    ("batch/v1", "CronJob", "api/batch/v1", "CronJob"),
    ("policy/v1", "PodDisruptionBudget", "api/policy/v1", "PodDisruptionBudget"),
    ("policy/v1", "Eviction", "api/policy/v1", "Eviction"),
    ("discovery.k8s.io/v1", "EndpointSlice", "api/discovery/v1", "EndpointSlice"),
    ("networking.k8s.io/v1", "Ingress", "api/networking/v1", "Ingress"),
    ("networking.k8s.io/v1", "IngressClass", "api/networking/v1", "IngressClass"),
    ("networking.k8s.io/v1", "NetworkPolicy", "api/networking/v1", "NetworkPolicy"),
    ("coordination.k8s.io/v1", "Lease", "api/coordination/v1", "Lease"),
    ("events.k8s.io/v1", "Event", "api/events/v1", "Event"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "api/rbac/v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "api/rbac/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "api/rbac/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role", "api/rbac/v1", "Role"),
    ("authentication.k8s.io/v1", "TokenRequest", "api/authentication/v1", "TokenRequest"),
    ("authentication.k8s.io/v1", "TokenReview", "api/authentication/v1", "TokenReview"),
    ("authentication.k8s.io/v1", "SelfSubjectReview", "api/authentication/v1", "SelfSubjectReview"),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview", "api/authorization/v1", "SelfSubjectAccessReview"),
    ("authorization.k8s.io/v1", "SubjectAccessReview", "api/authorization/v1", "SubjectAccessReview"),
    ("authorization.k8s.io/v1", "LocalSubjectAccessReview", "api/authorization/v1", "LocalSubjectAccessReview"),
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview", "api/authorization/v1", "SelfSubjectRulesReview"),
    ("meta.k8s.io/v1", "DeleteOptions", "apimachinery/pkg/apis/meta/v1", "DeleteOptions"),
]

# Messages with a custom JSON form: (module path, name) -> Rust `Ty` variant.
SPECIAL = {
    ("apimachinery/pkg/util/intstr", "IntOrString"): "IntOrString",
    ("apimachinery/pkg/api/resource", "Quantity"): "Quantity",
    ("apimachinery/pkg/apis/meta/v1", "Time"): "Time",
    ("apimachinery/pkg/apis/meta/v1", "MicroTime"): "MicroTime",
    ("apimachinery/pkg/apis/meta/v1", "Duration"): "Duration",
    ("apimachinery/pkg/apis/meta/v1", "FieldsV1"): "RawJson",
    ("apimachinery/pkg/runtime", "RawExtension"): "RawJson",
}

SCALARS = {"string": "String", "int32": "Int32", "int64": "Int64", "bool": "Bool", "double": "Double",
           "bytes": "Bytes"}


# ---------------------------------------------------------------- k8s-pb (prost) sources

def parse_prost(src_root):
    """Returns {(module, Name): [field dicts in declaration order]}."""
    messages = {}
    for dirpath, _, files in os.walk(src_root):
        if "mod.rs" not in files:
            continue
        module = os.path.relpath(dirpath, src_root).replace(os.sep, "/")
        with open(os.path.join(dirpath, "mod.rs"), encoding="utf-8") as f:
            text = f.read()
        # Drop doc comments so that braces/attributes inside them cannot confuse us.
        text = "\n".join(line for line in text.splitlines() if not line.strip().startswith("//"))
        for m in re.finditer(r"pub struct (\w+) \{(.*?)\n\}", text, re.S):
            name, body = m.group(1), m.group(2)
            fields = []
            for chunk in body.split("#[prost(")[1:]:
                attrs, _, rest = chunk.partition(")]")
                fm = re.search(r"pub (?:r#)?(\w+):\s*(.*),\s*$", rest.strip(), re.S)
                if not fm:
                    sys.exit(f"cannot parse field in {module}::{name}: {chunk!r}")
                rust_name, rust_ty = fm.group(1), re.sub(r"\s+", "", fm.group(2)).replace(",>", ">")
                tag = int(re.search(r'tag\s*=\s*"(\d+)"', attrs).group(1))
                field = {"tag": tag, "rust": rust_name}
                mm = re.match(r'btree_map\s*=\s*"(\w+),\s*(\w+)"', attrs)
                if mm:
                    if mm.group(1) != "string":
                        sys.exit(f"non-string map key in {module}::{name}")
                    field["card"] = "map"
                    field["elem"] = mm.group(2)
                    if mm.group(2) == "message":
                        field["ref"] = resolve(module, map_value_type(rust_ty))
                else:
                    elem = attrs.split(",")[0].split("=")[0].strip()
                    field["elem"] = elem
                    field["card"] = "repeated" if "repeated" in attrs else "single"
                    if elem == "message":
                        field["ref"] = resolve(module, strip_wrappers(rust_ty))
                    elif elem not in SCALARS:
                        sys.exit(f"unsupported prost type {elem} in {module}::{name}")
                fields.append(field)
            messages[(module, name)] = fields
    return messages


def strip_wrappers(ty):
    for prefix in ("::core::option::Option<", "::prost::alloc::vec::Vec<", "::prost::alloc::boxed::Box<"):
        while ty.startswith(prefix):
            ty = ty[len(prefix):-1]
    return ty


def map_value_type(ty):
    inner = ty[ty.index("<") + 1:-1]
    return inner.split(",", 1)[1]


def resolve(module, path):
    parts = path.split("::")
    mod = module.split("/")
    for p in parts[:-1]:
        if p == "super":
            mod.pop()
        else:
            mod.append(p)
    return ("/".join(mod), parts[-1])


# ---------------------------------------------------------------- Go sources

def go_dir(module, k8s_api, apimachinery):
    if module.startswith("api/"):
        return os.path.join(k8s_api, module[len("api/"):])
    if module.startswith("apimachinery/"):
        return os.path.join(apimachinery, module[len("apimachinery/"):])
    return None


GO_CACHE = {}


def go_structs(directory):
    """Returns {lowercase struct name: [field facts in source order]} for the Go package in `directory`."""
    if directory in GO_CACHE:
        return GO_CACHE[directory]
    structs = {}
    if directory and os.path.isdir(directory):
        for fname in sorted(os.listdir(directory)):
            if (not fname.endswith(".go") or fname.endswith("_test.go") or fname.startswith("zz_generated")
                    or fname in ("generated.pb.go", "types_swagger_doc_generated.go")):
                continue
            with open(os.path.join(directory, fname), encoding="utf-8") as f:
                text = f.read()
            for m in re.finditer(r"^type (\w+) struct \{\n(.*?)^\}", text, re.S | re.M):
                fields = []
                for line in m.group(2).splitlines():
                    line = line.strip()
                    if not line or line.startswith("//") or "`" not in line:
                        continue
                    decl, tags = line.split("`", 1)
                    tokens = decl.split()
                    pm = re.search(r'protobuf:"(\w+),(\d+),', tags)
                    jm = re.search(r'json:"([^"]*)"', tags)
                    if not pm or not jm:
                        continue
                    json_parts = jm.group(1).split(",")
                    embedded = len(tokens) == 1
                    go_ty = tokens[-1]
                    fields.append({
                        "tag": int(pm.group(2)),
                        "json": json_parts[0],
                        "omitempty": "omitempty" in json_parts[1:],
                        "pointer": go_ty.startswith("*"),
                        "inline": embedded and (json_parts[0] == "" or "inline" in json_parts[1:]),
                        "skip": json_parts[0] == "-",
                    })
                structs[m.group(1).lower()] = fields
    GO_CACHE[directory] = structs
    return structs


def camel(snake):
    head, *rest = snake.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


# ---------------------------------------------------------------- output

def ident(key):
    module, name = key
    parts = [p for p in module.split("/") if p not in ("pkg",)]
    return "M_" + "_".join(p.upper() for p in parts) + "_" + re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", name).upper()


def qualified(key):
    module, name = key
    if module.startswith("api/"):
        return "io.k8s.api." + module[4:].replace("/", ".") + "." + name
    return "io.k8s." + module.replace("/", ".") + "." + name


def ty_expr(elem, ref):
    if elem == "message":
        if ref in SPECIAL:
            return "Ty::" + SPECIAL[ref]
        return f"Ty::Message(&{ident(ref)})"
    return "Ty::" + SCALARS[elem]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k8s-pb", required=True)
    ap.add_argument("--k8s-api", required=True)
    ap.add_argument("--apimachinery", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    prost = parse_prost(args.k8s_pb)
    order, seen = [], set()
    stack = [(r[2], r[3]) for r in ROOTS]
    while stack:
        key = stack.pop(0)
        if key in seen or key in SPECIAL:
            continue
        if key not in prost:
            sys.exit(f"message {key} not found in k8s-pb")
        seen.add(key)
        order.append(key)
        for f in prost[key]:
            if "ref" in f:
                stack.append(f["ref"])

    out = []
    warnings = 0
    for key in order:
        module, name = key
        go = go_structs(go_dir(module, args.k8s_api, args.apimachinery)).get(name.lower())
        go_by_tag = {g["tag"]: (i, g) for i, g in enumerate(go or [])}
        rows = []
        for f in prost[key]:
            pos, g = go_by_tag.get(f["tag"], (None, None))
            if g is None:
                warnings += 1
                print(f"warning: {qualified(key)} tag {f['tag']} ({f['rust']}) not in Go sources", file=sys.stderr)
                g = {"json": camel(f["rust"]), "omitempty": True, "pointer": True, "inline": False, "skip": False}
                pos = 10_000 + f["tag"]
            if g["skip"]:
                continue
            flags = []
            if g["pointer"]:
                flags.append("PTR")
            if g["omitempty"]:
                flags.append("OMIT")
            if g["inline"]:
                flags.append("INLINE")
            card = {"single": "Card::Single", "repeated": "Card::Repeated", "map": "Card::Map"}[f["card"]]
            rows.append((pos, f"Field {{ tag: {f['tag']}, json: {g['json']!r}, ty: {ty_expr(f['elem'], f.get('ref'))}, "
                              f"card: {card}, flags: {'|'.join(flags) or '0'} }},".replace("'", '"')))
        rows.sort(key=lambda r: r[0])
        out.append(f"pub(crate) static {ident(key)}: Msg = Msg {{\n    name: \"{qualified(key)}\",\n    fields: &[\n"
                   + "".join(f"        {r}\n" for _, r in rows) + "    ],\n};\n")

    kinds = "".join(f"    (\"{av}\", \"{kind}\", &{ident((mod, name))}),\n" for av, kind, mod, name in ROOTS)
    header = ("// @generated by tools/gen_protobuf_descriptors.py from the k8s-pb 0.9 prost sources (tags, wire types)\n"
              "// and the Kubernetes Go types (JSON names, omitempty, pointers, inlining). Do not edit by hand.\n\n"
              "use super::schema::{Card, Field, INLINE, Msg, OMIT, PTR, Ty};\n\n"
              "/// Served kinds: (apiVersion, kind, top-level message).\n"
              f"pub(crate) static KINDS: &[(&str, &str, &Msg)] = &[\n{kinds}];\n\n")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(header + "\n".join(out))
    print(f"{len(order)} messages, {warnings} warnings", file=sys.stderr)


if __name__ == "__main__":
    main()
