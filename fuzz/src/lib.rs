//! Fuzz targets for Ferry's parsers of untrusted input, as plain functions: each takes the
//! fuzzer's bytes, runs the code under test and checks what must hold for every input (it
//! panics otherwise). `fuzz_targets/*.rs` hand them to libFuzzer; `tests/smoke.rs` runs them on
//! the seed corpus and bounded random mutations of it, without libFuzzer.
//!
//! | target | code under test |
//! | --- | --- |
//! | [`json_body`] | request bodies as JSON (`ferry_apiserver::body::decode`), then typed decoding |
//! | [`yaml_body`] | request bodies as YAML (alias and depth budgets) |
//! | [`protobuf_body`] | request bodies as Kubernetes protobuf |
//! | [`strategic_merge`] | strategic merge patch (and JSON merge patch) on typed kinds |
//! | [`json_patch`] | RFC 6902 JSON patch within upstream's limits |
//! | [`label_selector`] | label selector parsing, matching, printing |
//! | [`field_selector`] | field selector parsing, matching, printing; value escaping |
//! | [`dns_wire`] | the DNS wire parser and encoder (queries and upstream responses) |
//! | [`proxy_protocol`] | the PROXY protocol (v1, v2) header writer, checked by a parser here |

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ferry_api::decode::{MAX_DEPTH, depth};
use ferry_api::patch;
use serde_json::Value;

/// Reads up to two JSON documents from `data`, one after the other.
fn two_json(data: &[u8]) -> Option<(Value, Value)> {
    let mut it = serde_json::Deserializer::from_slice(data).into_iter::<Value>();
    let a = it.next()?.ok()?;
    let b = it.next()?.ok()?;
    Some((a, b))
}

/// The checks every decoded body must pass.
fn decoded_ok(v: &Value) {
    assert!(
        depth(v) <= MAX_DEPTH,
        "a decoded body is deeper than the limit"
    );
    // Typed decoding of whatever came out must not panic either.
    let _ = ferry_api::decode::decode::<k8s_openapi::api::core::v1::Pod>(v);
    let _ = ferry_api::decode::decode::<k8s_openapi::api::core::v1::Service>(v);
    let _ = ferry_api::decode::encoded_len_within(v, 1 << 20);
}

/// A create/update body sent as JSON.
pub fn json_body(data: &[u8]) {
    if let Ok(v) = ferry_apiserver::body::decode("application/json", data) {
        decoded_ok(&v);
        // What was decoded encodes and decodes to itself, fractional numbers included
        // (serde_json's `float_roundtrip` reads every shortest-form float back exactly).
        let bytes = serde_json::to_vec(&v).expect("a decoded value encodes");
        let again = ferry_apiserver::body::decode("application/json", &bytes)
            .expect("an encoded body decodes again");
        assert_eq!(again, v);
    }
}

/// A body sent as YAML (or JSON with a YAML content type).
pub fn yaml_body(data: &[u8]) {
    if let Ok(v) = ferry_apiserver::body::decode("application/yaml", data) {
        decoded_ok(&v);
    }
}

/// A body sent as Kubernetes protobuf (the `k8s\0` magic is added when missing, so the
/// fuzzer's bytes reach the envelope and object decoders).
pub fn protobuf_body(data: &[u8]) {
    let magic = b"k8s\0";
    let owned;
    let body = if data.starts_with(magic) {
        data
    } else {
        owned = [magic.as_slice(), data].concat();
        &owned
    };
    if let Ok(v) = ferry_apiserver::body::decode("application/vnd.kubernetes.protobuf", body) {
        decoded_ok(&v);
    }
}

const KINDS: &[(&str, &str)] = &[
    ("v1", "Pod"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("v1", "ConfigMap"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
];

/// A strategic merge patch (first byte: the kind whose schema applies) and a JSON merge patch
/// of the same two documents: the original and the patch.
pub fn strategic_merge(data: &[u8]) {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    let Some((base, p)) = two_json(rest) else {
        return;
    };
    let (api_version, kind) = KINDS[usize::from(k) % KINDS.len()];
    let root = patch::root_type(api_version, kind).unwrap_or(patch::TypeRef::UNTYPED);
    let _ = patch::strategic::apply(&base, &p, root);
    let _ = patch::strategic::apply(&base, &p, patch::TypeRef::UNTYPED);
    let merged = patch::merge::apply(&base, &p);
    // RFC 7386: applying the same merge patch twice changes nothing more.
    assert_eq!(
        patch::merge::apply(&merged, &p),
        merged,
        "merge patch is not idempotent"
    );
    // The API server's wrappers bound the results.
    for r in [
        ferry_apiserver::patching::strategic(&base, &p, api_version, kind),
        ferry_apiserver::patching::merge(&base, &p),
    ] {
        if let Ok(v) = r {
            assert!(depth(&v) <= MAX_DEPTH);
        }
    }
}

/// A JSON patch (the document, then the operations) within upstream's limits.
pub fn json_patch(data: &[u8]) {
    let Some((doc, ops)) = two_json(data) else {
        return;
    };
    let result = patch::json_patch::apply(&doc, &ops);
    if let Value::Array(a) = &ops
        && a.len() > patch::json_patch::MAX_OPERATIONS
    {
        assert!(matches!(result, Err(patch::PatchError::TooLarge(_))));
    }
    if let Ok(v) = &result {
        // Operations never nest the document deeper than the limit (unless it already was).
        assert!(
            depth(v) <= depth(&doc).max(MAX_DEPTH),
            "patched deeper than the limit"
        );
    }
    // The same with a small copy budget: every copy is charged.
    let tight = patch::json_patch::Limits {
        max_copy_bytes: 64,
        max_depth: 8,
        ..Default::default()
    };
    if let Ok(v) = patch::json_patch::apply_with(&doc, &ops, &tight) {
        assert!(depth(&v) <= depth(&doc).max(8));
    }
}

/// Labels from the fuzzer's bytes: `k=v` pairs separated by `;`.
fn labels_from(s: &str) -> BTreeMap<String, String> {
    s.split(';')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The comma-separated pieces of a printed selector, sorted.
fn terms(s: &str) -> Vec<&str> {
    let mut v: Vec<&str> = s.split(',').collect();
    v.sort_unstable();
    v
}

/// A label selector (before a `\n`) matched against labels (after it).
pub fn label_selector(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (sel, labels) = text.split_once('\n').unwrap_or((&text, ""));
    let Ok(parsed) = ferry_api::selectors::parse_label_selector(sel) else {
        return;
    };
    let labels = labels_from(labels);
    let matched = parsed.matches(&labels);
    // What a selector prints parses to the same selector.
    let printed = parsed.to_string();
    let again = ferry_api::selectors::parse_label_selector(&printed)
        .unwrap_or_else(|e| panic!("{printed:?} (printed from {sel:?}) does not parse: {e}"));
    assert_eq!(terms(&again.to_string()), terms(&printed));
    assert_eq!(again.matches(&labels), matched);
}

/// A field selector (before a `\n`) matched against fields (after it); value escaping.
pub fn field_selector(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (sel, fields) = text.split_once('\n').unwrap_or((&text, ""));
    let v = ferry_api::selectors::escape_value(sel);
    assert_eq!(
        ferry_api::selectors::unescape_value(&v),
        Ok(sel.to_string())
    );
    let Ok(parsed) = ferry_api::selectors::parse_field_selector(sel) else {
        return;
    };
    let fields = labels_from(fields);
    let matched = parsed.matches(|f| fields.get(f).cloned());
    let printed = parsed.to_string();
    let again = ferry_api::selectors::parse_field_selector(&printed)
        .unwrap_or_else(|e| panic!("{printed:?} (printed from {sel:?}) does not parse: {e}"));
    // The same terms (their order may change: they are ANDed).
    assert_eq!(terms(&again.to_string()), terms(&printed));
    assert_eq!(again.matches(|f| fields.get(f).cloned()), matched);
}

/// A DNS message: parsed as a query (and answered), scanned as an upstream response.
pub fn dns_wire(data: &[u8]) {
    use ferry_dns::wire::{self, RData, Record, Response};
    if let Ok(req) = wire::parse_request(data) {
        let _ = req.compute_qname();
        let _ = req.lower_qname_wire();
        let limit = req.udp_limit();
        let name = req.qname.clone().unwrap_or_default();
        let resp = Response {
            rcode: 0,
            authoritative: true,
            answers: vec![
                Record::new(name.clone(), 30, RData::A(Ipv4Addr::new(10, 0, 0, 1))),
                Record::new(name.clone(), 30, RData::Cname(format!("x.{name}"))),
            ],
            authority: vec![],
            additional: vec![Record::new(
                name.clone(),
                30,
                RData::Txt("t".repeat(data.len())),
            )],
        };
        for limit in [limit, 512, 65535] {
            let out = wire::encode_response(&req, &resp, limit);
            assert!(out.len() <= limit.max(512), "{} > {limit}", out.len());
            assert!(out.len() >= 12);
        }
        let _ = wire::encode_rcode(&req, 2, true);
        let _ = wire::parse_request_lazy(data);
    }
    if let Some(s) = wire::scan_response(data) {
        assert!(s.question_end <= data.len());
        for off in s.ttl_offsets {
            assert!(off + 4 <= data.len());
        }
    }
    if let Some(&p) = data.first() {
        let _ = wire::read_name_at(data, usize::from(p));
    }
}

/// Addresses from the fuzzer's bytes.
fn addr(b: &[u8], v6: bool) -> SocketAddr {
    let mut x = [0u8; 18];
    for (d, s) in x.iter_mut().zip(b) {
        *d = *s;
    }
    let port = u16::from_be_bytes([x[16], x[17]]);
    let ip = if v6 {
        let mut o = [0u8; 16];
        o.copy_from_slice(&x[..16]);
        IpAddr::V6(Ipv6Addr::from(o))
    } else {
        IpAddr::V4(Ipv4Addr::new(x[0], x[1], x[2], x[3]))
    };
    SocketAddr::new(ip, port)
}

/// The PROXY protocol header for addresses from the fuzzer's bytes, checked by an independent
/// reading of HAProxy's specification.
pub fn proxy_protocol(data: &[u8]) {
    use ferry_proxy::model::ProxyProtocol;
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (a, b) = rest.split_at(rest.len().min(18));
    let src = addr(a, flags & 1 != 0);
    let dst = addr(b, flags & 2 != 0);
    let same = src.is_ipv4() == dst.is_ipv4();
    // Version 1: one ASCII line of at most 107 bytes.
    let v1 = ferry_proxy::proxyproto::header(ProxyProtocol::V1, src, dst);
    assert!(v1.len() <= 107 && v1.is_ascii() && v1.ends_with(b"\r\n"));
    let line = std::str::from_utf8(&v1[..v1.len() - 2]).expect("ascii");
    let f: Vec<&str> = line.split(' ').collect();
    if same {
        assert_eq!(f.len(), 6, "{line}");
        assert_eq!(f[0], "PROXY");
        assert_eq!(f[1], if src.is_ipv4() { "TCP4" } else { "TCP6" });
        assert_eq!(f[2].parse::<IpAddr>().ok(), Some(src.ip()));
        assert_eq!(f[3].parse::<IpAddr>().ok(), Some(dst.ip()));
        assert_eq!(f[4].parse::<u16>().ok(), Some(src.port()));
        assert_eq!(f[5].parse::<u16>().ok(), Some(dst.port()));
        // No leading zeros in ports (the spec's decimal form).
        assert!(!(f[4].len() > 1 && f[4].starts_with('0')));
    } else {
        assert_eq!(line, "PROXY UNKNOWN");
    }
    // Version 2: signature, version/command, family, length, addresses.
    let v2 = ferry_proxy::proxyproto::header(ProxyProtocol::V2, src, dst);
    assert_eq!(&v2[..12], &ferry_proxy::proxyproto::V2_SIGNATURE);
    assert_eq!(v2[12], 0x21);
    let len = usize::from(u16::from_be_bytes([v2[14], v2[15]]));
    assert_eq!(v2.len(), 16 + len);
    let body = &v2[16..];
    match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            assert_eq!((v2[13], len), (0x11, 12));
            assert_eq!(body[..4], s.ip().octets());
            assert_eq!(body[4..8], d.ip().octets());
            assert_eq!(u16::from_be_bytes([body[8], body[9]]), s.port());
            assert_eq!(u16::from_be_bytes([body[10], body[11]]), d.port());
        }
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            assert_eq!((v2[13], len), (0x21, 36));
            assert_eq!(body[..16], s.ip().octets());
            assert_eq!(body[16..32], d.ip().octets());
            assert_eq!(u16::from_be_bytes([body[32], body[33]]), s.port());
            assert_eq!(u16::from_be_bytes([body[34], body[35]]), d.port());
        }
        _ => assert_eq!((v2[13], len), (0x00, 0)),
    }
}

/// Every target by name (for the smoke run and the runner script).
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("json_body", json_body),
    ("yaml_body", yaml_body),
    ("protobuf_body", protobuf_body),
    ("strategic_merge", strategic_merge),
    ("json_patch", json_patch),
    ("label_selector", label_selector),
    ("field_selector", field_selector),
    ("dns_wire", dns_wire),
    ("proxy_protocol", proxy_protocol),
];
