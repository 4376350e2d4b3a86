use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use serde_json::json;

use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn label_selector_parse_and_match() {
    let set = labels(&[("app", "web"), ("tier", "front"), ("n", "5")]);
    // (selector, canonical string, matches `set`)
    let cases: &[(&str, &str, bool)] = &[
        ("", "", true),
        ("   ", "", true),
        ("app=web", "app=web", true),
        ("app==web", "app==web", true),
        ("app = web", "app=web", true),
        ("app!=web", "app!=web", false),
        ("app!=db", "app!=db", true),
        ("missing!=x", "missing!=x", true),
        ("app", "app", true),
        ("!app", "!app", false),
        ("!missing", "!missing", true),
        ("app in (web,db)", "app in (db,web)", true),
        ("app in(db)", "app in (db)", false),
        ("app notin (db)", "app notin (db)", true),
        ("missing notin (db)", "missing notin (db)", true),
        ("missing in (db)", "missing in (db)", false),
        ("tier=front,app=web", "app=web,tier=front", true),
        ("tier=front, app=db", "app=db,tier=front", false),
        ("n>3", "n>3", true),
        ("n<3", "n<3", false),
        ("app>3", "app>3", false),
        ("x in (in,notin)", "x in (in,notin)", false),
        ("app=", "app=", false),
        ("x in (,a)", "x in (,a)", false),
        ("x in ()", "x in ()", false),
        ("example.com/role=a", "example.com/role=a", false),
        ("\tapp\n=\rweb", "app=web", true),
    ];
    for (input, canonical, want) in cases {
        let sel = parse_label_selector(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(&sel.to_string(), canonical, "{input:?}");
        assert_eq!(sel.matches(&set), *want, "{input:?}");
        assert_eq!(sel.is_empty(), canonical.is_empty(), "{input:?}");
    }
}

#[test]
fn label_selector_parse_errors() {
    let name_regex = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    let value_regex = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
    let cases: Vec<(&str, String)> = vec![
        ("a=b,", "found '', expected: identifier after ','".into()),
        (",a", "found ',', expected: !, identifier, or 'end of string'".into()),
        ("=a", "found '=', expected: !, identifier, or 'end of string'".into()),
        ("a b", "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt".into()),
        ("a=b c", "found 'c', expected: ',' or 'end of string'".into()),
        ("!a=b", "found '=', expected: ',' or 'end of string'".into()),
        ("a in b", "unable to parse requirement: found 'b' expected: '('".into()),
        ("a in (b", "unable to parse requirement: found '', expected: ',' or ')'".into()),
        ("a in (=)", "unable to parse requirement: found '=', expected: ',', ')' or identifier".into()),
        ("a==(", "unable to parse requirement: found '(', expected: identifier".into()),
        // Upstream's quirk: an empty value after a non-empty one, right before `)`.
        ("x in (a,,)", "unable to parse requirement: found ')', expected: ',', or identifier".into()),
        ("a$b=c", format!("unable to parse requirement: <nil>: Invalid value: \"a$b\": {name_regex}")),
        ("a=b$", format!("unable to parse requirement: values[0][a]: Invalid value: \"b$\": {value_regex}")),
        (
            "a>b",
            "unable to parse requirement: values[0]: Invalid value: \"b\": for 'Gt', 'Lt' operators, the value must be an integer".into(),
        ),
        ("/a", "unable to parse requirement: <nil>: Invalid value: \"/a\": prefix part must be non-empty".into()),
        ("a/", format!("unable to parse requirement: <nil>: Invalid value: \"a/\": name part must be non-empty; {name_regex}")),
        (
            "Ex.com/a",
            "unable to parse requirement: <nil>: Invalid value: \"Ex.com/a\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into(),
        ),
        (
            "a/b/c",
            "unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into(),
        ),
    ];
    for (input, want) in cases {
        assert_eq!(
            parse_label_selector(input).map_err(|e| e.to_string()),
            Err(want),
            "{input:?}"
        );
    }
    let long = "a".repeat(64);
    let err = parse_label_selector(&long)
        .expect_err("too long")
        .to_string();
    assert!(
        err.contains("name part must be no more than 63 characters"),
        "{err}"
    );
    let err = parse_label_selector(&format!("a={long}"))
        .expect_err("too long")
        .to_string();
    assert!(
        err.contains("values[0][a]: Invalid value:")
            && err.contains("must be no more than 63 characters"),
        "{err}"
    );
}

#[test]
fn structured_label_selectors() {
    let set = labels(&[("app", "web"), ("tier", "front")]);
    // (selector, Ok((string form, matches)) or Err(message))
    type Case<'a> = (serde_json::Value, Result<(&'a str, bool), &'a str>);
    let cases: &[Case] = &[
        (json!({}), Ok(("", true))),
        (
            json!({"matchLabels": {"app": "web"}}),
            Ok(("app=web", true)),
        ),
        (
            json!({"matchLabels": {"tier": "front"}, "matchExpressions": [
                {"key": "app", "operator": "In", "values": ["web", "db"]}]}),
            Ok(("app in (db,web),tier=front", true)),
        ),
        (
            json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}),
            Ok(("app notin (web)", false)),
        ),
        (
            json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
            Ok(("app", true)),
        ),
        (
            json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
            Ok(("!app", false)),
        ),
        (
            json!({"matchExpressions": [{"key": "app", "operator": "Foo"}]}),
            Err("\"Foo\" is not a valid label selector operator"),
        ),
        (
            json!({"matchExpressions": [{"key": "app", "operator": "In", "values": []}]}),
            Err(
                "values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty",
            ),
        ),
        (
            json!({"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["a"]}]}),
            Err(
                "values: Invalid value: []string{\"a\"}: values set must be empty for exists and does not exist",
            ),
        ),
    ];
    for (raw, want) in cases {
        let ls: meta::LabelSelector = serde_json::from_value(raw.clone()).expect("selector");
        match (from_label_selector(&ls), want) {
            (Ok(sel), Ok((text, matches))) => {
                assert_eq!(&sel.to_string(), text, "{raw}");
                assert_eq!(sel.matches(&set), *matches, "{raw}");
            }
            (Err(e), Err(want)) => assert_eq!(&e.to_string(), want, "{raw}"),
            (got, want) => panic!("{raw}: got {got:?}, want {want:?}"),
        }
    }
    let nothing = from_optional_label_selector(None).expect("nil");
    assert!(
        nothing.is_nothing()
            && !nothing.is_empty()
            && !nothing.matches(&set)
            && !nothing.matches(&BTreeMap::new())
    );
    let everything =
        from_optional_label_selector(Some(&meta::LabelSelector::default())).expect("empty");
    assert!(everything.is_empty() && everything.matches(&BTreeMap::new()));
    assert_eq!(format_label_selector(None), "<none>");
    assert_eq!(
        format_label_selector(Some(&meta::LabelSelector::default())),
        "<none>"
    );
}

#[test]
fn map_selectors() {
    let sel = selector_from_map(&labels(&[("app", "web")]));
    assert!(sel.matches(&labels(&[("app", "web"), ("x", "y")])));
    assert!(!sel.matches(&labels(&[("app", "db")])));
    assert!(!sel.matches(&BTreeMap::new()));
    assert_eq!(sel.requires_exact_match("app"), Some("web"));
    assert!(selector_from_map(&BTreeMap::new()).matches(&BTreeMap::new()));
    assert_eq!(
        format_labels(Some(&labels(&[("b", "2"), ("a", "1")]))),
        "a=1,b=2"
    );
    assert_eq!(format_labels(None), "<none>");
}

#[test]
fn field_selector_parse_and_match() {
    let fields = |f: &str| -> Option<String> {
        match f {
            "metadata.name" => Some("web-1".into()),
            "status.phase" => Some("Running".into()),
            "spec.nodeName" => Some(String::new()),
            "odd" => Some("a,b=c\\d".into()),
            _ => None,
        }
    };
    let cases: &[(&str, Result<bool, &str>)] = &[
        ("", Ok(true)),
        ("metadata.name=web-1", Ok(true)),
        ("metadata.name==web-1", Ok(true)),
        ("metadata.name!=web-1", Ok(false)),
        ("status.phase!=Failed,metadata.name=web-1", Ok(true)),
        ("status.phase=Failed,metadata.name=web-1", Ok(false)),
        ("spec.nodeName=", Ok(true)),
        ("spec.nodeName!=", Ok(false)),
        ("odd=a\\,b\\=c\\\\d", Ok(true)),
        ("metadata.name=web-1,", Ok(true)),
        (
            "status.phase=Running,spec.unknown=x",
            Err("field label not supported: spec.unknown"),
        ),
        (
            "status.phase=Failed,spec.unknown=x",
            Err("field label not supported: spec.unknown"),
        ),
        (
            " status.phase=Running",
            Err("field label not supported:  status.phase"),
        ),
    ];
    for (input, want) in cases {
        let sel = parse_field_selector(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(
            sel.matches(fields).map_err(|e| e.to_string()),
            want.map_err(str::to_string),
            "{input:?}"
        );
    }
    let sel = parse_field_selector("metadata.name=a\\,b,status.phase!=x").expect("parse");
    assert_eq!(sel.requires_exact_match("metadata.name"), Some("a,b"));
    assert_eq!(sel.requires_exact_match("status.phase"), None);
    assert_eq!(sel.to_string(), "metadata.name=a\\,b,status.phase!=x");
}

#[test]
fn field_selector_parse_errors() {
    let cases: &[(&str, &str)] = &[
        ("foo", "invalid selector: 'foo'; can't understand 'foo'"),
        (
            "a=b,foo",
            "invalid selector: 'a=b,foo'; can't understand 'foo'",
        ),
        (
            "a=b=c",
            "invalid field selector: unescaped character in value: 61",
        ),
        (
            "a!==b",
            "invalid field selector: unescaped character in value: 61",
        ),
        (
            "a=b\\x",
            "invalid field selector: invalid escape sequence: \\x",
        ),
        (
            "a=b\\",
            "invalid field selector: invalid escape sequence: \\",
        ),
    ];
    for (input, want) in cases {
        assert_eq!(
            parse_field_selector(input).map_err(|e| e.to_string()),
            Err(want.to_string()),
            "{input:?}"
        );
    }
}

fn typed<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("object")
}

#[test]
fn per_kind_fields() {
    let po: k8s_openapi::api::core::v1::Pod = typed(json!({
        "metadata": {"name": "p"},
        "spec": {"nodeName": "n1", "restartPolicy": "Always", "schedulerName": "default-scheduler",
                 "serviceAccountName": "sa", "hostNetwork": true, "containers": []},
        "status": {"phase": "Running", "podIP": "10.0.0.9", "podIPs": [{"ip": "10.0.0.9"}, {"ip": "fd00::9"}],
                   "nominatedNodeName": "n2"}
    }));
    let cases: &[(&str, Option<&str>)] = &[
        ("spec.nodeName", Some("n1")),
        ("spec.host", Some("n1")),
        ("spec.restartPolicy", Some("Always")),
        ("spec.schedulerName", Some("default-scheduler")),
        ("spec.serviceAccountName", Some("sa")),
        ("spec.hostNetwork", Some("true")),
        ("status.phase", Some("Running")),
        ("status.podIP", Some("10.0.0.9")),
        ("status.nominatedNodeName", Some("n2")),
        ("spec.containers", None),
        ("metadata.labels", None),
    ];
    for (field, want) in cases {
        assert_eq!(pod(&po, field).as_deref(), *want, "pod {field}");
    }
    let empty_pod: k8s_openapi::api::core::v1::Pod = typed(json!({"metadata": {"name": "p"}}));
    assert_eq!(
        pod(&empty_pod, "spec.hostNetwork").as_deref(),
        Some("false")
    );
    assert_eq!(pod(&empty_pod, "spec.nodeName").as_deref(), Some(""));

    let ev: k8s_openapi::api::core::v1::Event = typed(json!({
        "metadata": {"name": "e"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "p", "uid": "u1",
                           "apiVersion": "v1", "resourceVersion": "7", "fieldPath": "spec.containers{c}"},
        "reason": "Started", "type": "Normal", "reportingComponent": "kubelet"
    }));
    let cases: &[(&str, Option<&str>)] = &[
        ("involvedObject.kind", Some("Pod")),
        ("involvedObject.namespace", Some("default")),
        ("involvedObject.name", Some("p")),
        ("involvedObject.uid", Some("u1")),
        ("involvedObject.apiVersion", Some("v1")),
        ("involvedObject.resourceVersion", Some("7")),
        ("involvedObject.fieldPath", Some("spec.containers{c}")),
        ("reason", Some("Started")),
        ("type", Some("Normal")),
        ("reportingComponent", Some("kubelet")),
        ("source", Some("kubelet")),
        ("message", None),
    ];
    for (field, want) in cases {
        assert_eq!(core_event(&ev, field).as_deref(), *want, "event {field}");
    }

    let ev2: k8s_openapi::api::events::v1::Event = typed(json!({
        "metadata": {"name": "e"}, "eventTime": "2024-01-01T00:00:00.000000Z",
        "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "Started", "type": "Normal", "reportingController": "kubelet"
    }));
    let cases: &[(&str, Option<&str>)] = &[
        ("regarding.kind", Some("Pod")),
        ("regarding.name", Some("p")),
        ("regarding.namespace", Some("default")),
        ("regarding.uid", Some("")),
        ("reason", Some("Started")),
        ("type", Some("Normal")),
        ("reportingController", Some("kubelet")),
        ("involvedObject.kind", None),
        ("source", None),
    ];
    for (field, want) in cases {
        assert_eq!(
            events_event(&ev2, field).as_deref(),
            *want,
            "events.k8s.io event {field}"
        );
    }

    let secret_obj: k8s_openapi::api::core::v1::Secret =
        typed(json!({"metadata": {"name": "s"}, "type": "Opaque"}));
    assert_eq!(secret(&secret_obj, "type").as_deref(), Some("Opaque"));
    assert_eq!(secret(&secret_obj, "data"), None);
    let ns: k8s_openapi::api::core::v1::Namespace =
        typed(json!({"metadata": {"name": "n"}, "status": {"phase": "Active"}}));
    assert_eq!(namespace(&ns, "status.phase").as_deref(), Some("Active"));
    let node_obj: k8s_openapi::api::core::v1::Node =
        typed(json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}}));
    assert_eq!(
        node(&node_obj, "spec.unschedulable").as_deref(),
        Some("true")
    );
    let rs: k8s_openapi::api::apps::v1::ReplicaSet =
        typed(json!({"metadata": {"name": "r"}, "status": {"replicas": 3}}));
    assert_eq!(replica_set(&rs, "status.replicas").as_deref(), Some("3"));
    let svc: k8s_openapi::api::core::v1::Service = typed(
        json!({"metadata": {"name": "s"}, "spec": {"clusterIP": "None", "type": "ClusterIP"}}),
    );
    assert_eq!(service(&svc, "spec.clusterIP").as_deref(), Some("None"));
    assert_eq!(service(&svc, "spec.type").as_deref(), Some("ClusterIP"));
    assert_eq!(service(&svc, "spec.ports"), None);
    let cm: k8s_openapi::api::core::v1::ConfigMap = typed(json!({"metadata": {"name": "c"}}));
    assert_eq!(config_map(&cm, "data"), None);
}

#[test]
fn field_selector_over_a_kind() {
    let p: k8s_openapi::api::core::v1::Pod = typed(json!({
        "metadata": {"name": "p"}, "spec": {"nodeName": "n1", "containers": []}, "status": {"phase": "Pending"}
    }));
    let sel = parse_field_selector("spec.nodeName=n1,status.phase!=Running").expect("parse");
    assert_eq!(sel.matches(|f| pod(&p, f)), Ok(true));
    let sel = parse_field_selector("spec.nodeName=n2").expect("parse");
    assert_eq!(sel.matches(|f| pod(&p, f)), Ok(false));
}

mod props {
    use proptest::prelude::*;

    use super::super::*;

    fn key() -> impl Strategy<Value = String> {
        "([a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?\\.)?[a-z0-9]{1,4}/?[A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?"
            .prop_filter("one optional slash, non-empty prefix", |k| !k.starts_with('/') && !k.ends_with('/'))
    }

    fn value() -> impl Strategy<Value = String> {
        "([A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?)?"
    }

    proptest! {
        /// A selector's string form parses back to the same selector.
        #[test]
        fn label_selector_string_round_trips(
            reqs in proptest::collection::vec((key(), 0usize..7, proptest::collection::vec(value(), 1..4)), 0..5)
        ) {
            // Empty values inside `( )` hit upstream's parser quirks (`(a,,)` is rejected);
            // the canonical form is what must round-trip.
            let parts: Vec<String> = reqs
                .iter()
                .map(|(k, op, vals)| {
                    let vals: Vec<String> =
                        vals.iter().map(|v| if v.is_empty() { "v".to_string() } else { v.clone() }).collect();
                    (k, op, vals)
                })
                .map(|(k, op, vals)| match op {
                    0 => format!("{k}={}", vals[0]),
                    1 => format!("{k}!={}", vals[0]),
                    2 => format!("{k} in ({})", vals.join(",")),
                    3 => format!("{k} notin ({})", vals.join(",")),
                    4 => k.clone(),
                    5 => format!("!{k}"),
                    _ => format!("{k}=={}", vals[0]),
                })
                .collect();
            let sel = parse_label_selector(&parts.join(",")).expect("valid selector");
            let again = parse_label_selector(&sel.to_string()).expect("canonical form parses");
            prop_assert_eq!(sel.to_string(), again.to_string());
        }

        /// Any value survives escaping inside a field selector.
        #[test]
        fn field_values_round_trip(v in ".*") {
            let sel = parse_field_selector(&format!("spec.x={}", escape_value(&v))).expect("parses");
            prop_assert_eq!(sel.requires_exact_match("spec.x"), Some(v.as_str()));
            prop_assert_eq!(sel.matches(|_| Some(v.clone())), Ok(true));
        }

        /// Parsing never panics, whatever the input.
        #[test]
        fn parsers_do_not_panic(s in ".*") {
            let _ = parse_label_selector(&s);
            let _ = parse_field_selector(&s);
        }
    }
}
