use super::*;

#[test]
fn key_mapping() {
    let cases = [
        // prefix, trait key, etcd key
        ("/registry", "/registry/pods/ns/a", "/registry/pods/ns/a"),
        ("/registry", "/registry/", "/registry/"),
        (
            "/registry",
            "/registry/apps/deployments/ns/d",
            "/registry/apps/deployments/ns/d",
        ),
        ("/ferry/a/", "/registry/pods/ns/a", "/ferry/a/pods/ns/a"),
        ("/ferry", "/registry/", "/ferry/"),
        ("/ferry", "/conformance/x", "/ferry/-/conformance/x"),
        ("/registry", "/registryx/y", "/registry/-/registryx/y"),
        ("/registry", "/other", "/registry/-/other"),
    ];
    for (prefix, key, etcd) in cases {
        let m = KeyMap::new(prefix);
        assert_eq!(m.to_etcd(key), etcd.as_bytes(), "{prefix} {key}");
        assert_eq!(
            m.from_etcd(etcd.as_bytes()).as_deref(),
            Some(key),
            "{prefix} {etcd}"
        );
    }
    let m = KeyMap::new("/ferry");
    assert_eq!(m.from_etcd(b"/ferryx/pods"), None);
    assert_eq!(m.from_etcd(b"/other/pods"), None);
    assert_eq!(m.from_etcd(b"compact_rev_key"), None);
    assert_eq!(m.from_etcd(&[0xff, 0xfe]), None);
}

#[test]
fn prefix_ends() {
    let cases: [(&[u8], &[u8]); 5] = [
        (b"/a/", b"/a0"),
        (b"a", b"b"),
        (&[b'a', 0xff], b"b"),
        (&[0xff, 0xff], b""),
        (b"", b""),
    ];
    for (p, end) in cases {
        assert_eq!(prefix_end(p), end, "{p:?}");
    }
}

#[test]
fn range_starts() {
    let cases = [
        ("/p/", None, Some(RangeStart::Prefix)),
        ("/p/", Some("/a"), Some(RangeStart::Prefix)),
        ("/p/", Some("/p/"), Some(RangeStart::After("/p/".into()))),
        ("/p/", Some("/p/x"), Some(RangeStart::After("/p/x".into()))),
        ("/p/", Some("/p0"), None),
        ("/p/", Some("/q"), None),
    ];
    for (prefix, after, expected) in cases {
        assert_eq!(range_start(prefix, after), expected, "{prefix} {after:?}");
    }
}

#[test]
fn endpoints() {
    assert_eq!(
        normalize_endpoint("127.0.0.1:2379").unwrap(),
        "http://127.0.0.1:2379"
    );
    assert_eq!(normalize_endpoint(" http://h:1/ ").unwrap(), "http://h:1");
    assert!(normalize_endpoint("https://h:1").is_err());
}

#[test]
fn status_classification() {
    use tonic::{Code, Status};
    let cases = [
        (
            Status::new(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            "compacted",
        ),
        (
            Status::new(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            "future",
        ),
        (
            Status::new(Code::Unavailable, "etcdserver: no leader"),
            "notsent",
        ),
        (
            Status::new(Code::Unavailable, "tcp connect error: Connection refused"),
            "notsent",
        ),
        (
            Status::new(Code::Unavailable, "etcdserver: request timed out"),
            "endpoint",
        ),
        (Status::new(Code::InvalidArgument, "bad"), "final"),
        (
            Status::new(
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            "refused",
        ),
    ];
    for (status, want) in cases {
        let got = match classify(&status) {
            Failure::Final(StoreError::Compacted { .. }) => "compacted",
            Failure::Final(StoreError::FutureRevision(_)) => "future",
            Failure::Final(StoreError::WritesRefused(m)) if m.contains("space exceeded") => {
                "refused"
            }
            Failure::Final(_) => "final",
            Failure::NotSent(_) => "notsent",
            Failure::Endpoint(_) => "endpoint",
        };
        assert_eq!(got, want, "{status:?}");
    }
}

#[test]
fn delete_event_without_prev_keeps_key() {
    let keys = KeyMap::new("/registry");
    let ev = pb::Event {
        r#type: pb::EVENT_DELETE,
        kv: Some(pb::KeyValue {
            key: b"/registry/pods/ns/a".to_vec(),
            mod_revision: 9,
            ..Default::default()
        }),
        prev_kv: None,
    };
    match convert_event(&keys, ev) {
        Some(Event::Delete { prev, revision }) => {
            assert_eq!(prev.key, "/registry/pods/ns/a");
            assert_eq!(revision, 9);
        }
        other => panic!("{other:?}"),
    }
    let put = pb::Event {
        r#type: 0, // PUT
        kv: Some(pb::KeyValue {
            key: b"/elsewhere".to_vec(),
            mod_revision: 3,
            version: 1,
            ..Default::default()
        }),
        prev_kv: None,
    };
    assert_eq!(convert_event(&keys, put), None);
}
