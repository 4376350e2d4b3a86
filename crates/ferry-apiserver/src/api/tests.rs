//! Table tests of the REST layer's pure steps: DeleteOptions, the metadata an update may not
//! change, no-op detection, and the name/namespace checks of a write.

use serde_json::{Value, json};

use super::{DeleteOptions, check_name_matches, prepare_update_meta, unchanged_but_times};
use crate::request::Query;
use ferry_api::kinds::KindInfo;

fn kind(group: &str, kind: &str) -> &'static KindInfo {
    ferry_api::kinds::all()
        .iter()
        .map(|s| s.info())
        .find(|i| i.group == group && i.kind == kind)
        .expect("a served kind")
}

#[test]
fn delete_options() {
    #[derive(Default)]
    struct Want {
        propagation: Option<&'static str>,
        grace: Option<i64>,
        uid: Option<&'static str>,
        rv: Option<&'static str>,
        dry_run: bool,
    }
    let table: Vec<(&str, Option<Value>, Want)> = vec![
        ("", None, Want::default()),
        (
            "propagationPolicy=Foreground",
            None,
            Want {
                propagation: Some("Foreground"),
                ..Default::default()
            },
        ),
        (
            "orphanDependents=true",
            None,
            Want {
                propagation: Some("Orphan"),
                ..Default::default()
            },
        ),
        (
            "orphanDependents=false",
            None,
            Want {
                propagation: Some("Background"),
                ..Default::default()
            },
        ),
        // An explicit policy wins over orphanDependents.
        (
            "propagationPolicy=Foreground&orphanDependents=true",
            None,
            Want {
                propagation: Some("Foreground"),
                ..Default::default()
            },
        ),
        // The body wins over the query.
        (
            "propagationPolicy=Orphan&gracePeriodSeconds=10",
            Some(json!({"propagationPolicy": "Background", "gracePeriodSeconds": 3})),
            Want {
                propagation: Some("Background"),
                grace: Some(3),
                ..Default::default()
            },
        ),
        (
            "",
            Some(json!({"orphanDependents": true})),
            Want {
                propagation: Some("Orphan"),
                ..Default::default()
            },
        ),
        // A negative grace period means "as short as possible": 1, as upstream.
        (
            "gracePeriodSeconds=-5",
            None,
            Want {
                grace: Some(1),
                ..Default::default()
            },
        ),
        (
            "",
            Some(
                json!({"preconditions": {"uid": "u1", "resourceVersion": "7"}, "dryRun": ["All"]}),
            ),
            Want {
                uid: Some("u1"),
                rv: Some("7"),
                dry_run: true,
                ..Default::default()
            },
        ),
        (
            "dryRun=All",
            None,
            Want {
                dry_run: true,
                ..Default::default()
            },
        ),
    ];
    for (q, body, want) in table {
        let o = DeleteOptions::parse(&Query::parse(Some(q)), body.as_ref())
            .unwrap_or_else(|e| panic!("{q} {body:?}: {}", e.message));
        assert_eq!(o.propagation.as_deref(), want.propagation, "{q} {body:?}");
        assert_eq!(o.grace_period, want.grace, "{q} {body:?}");
        assert_eq!(o.precondition_uid.as_deref(), want.uid, "{q} {body:?}");
        assert_eq!(o.precondition_rv.as_deref(), want.rv, "{q} {body:?}");
        assert_eq!(o.dry_run, want.dry_run, "{q} {body:?}");
    }
    for (q, body) in [
        ("propagationPolicy=Sideways", None),
        ("", Some(json!({"propagationPolicy": "orphan"}))),
    ] {
        let e = DeleteOptions::parse(&Query::parse(Some(q)), body.as_ref())
            .expect_err("an unsupported policy");
        assert_eq!(e.code, 422, "{q}");
        assert!(
            e.message
                .contains("supported values: \"Foreground\", \"Background\", \"Orphan\"")
        );
    }
}

#[test]
fn update_keeps_server_owned_metadata() {
    let info = kind("", "ConfigMap");
    let old = json!({"metadata": {"name": "a", "namespace": "d", "uid": "u1",
        "creationTimestamp": "2024-01-01T00:00:00Z", "generation": 3,
        "deletionTimestamp": "2024-01-02T00:00:00Z", "deletionGracePeriodSeconds": 0,
        "managedFields": [{"manager": "m"}], "labels": {"a": "1"}}});
    // The client tries to change everything the server owns, and a label.
    let mut new = json!({"metadata": {"name": "b", "namespace": "e",
        "creationTimestamp": "2030-01-01T00:00:00Z", "generation": 9,
        "labels": {"a": "2"}}, "data": {"k": "v"}});
    prepare_update_meta(&mut new, &old, info).expect("no uid given");
    let m = &new["metadata"];
    assert_eq!(m["name"], "a");
    assert_eq!(m["namespace"], "d");
    assert_eq!(m["uid"], "u1");
    assert_eq!(m["creationTimestamp"], "2024-01-01T00:00:00Z");
    assert_eq!(m["generation"], 3);
    assert_eq!(m["deletionTimestamp"], "2024-01-02T00:00:00Z");
    assert_eq!(m["deletionGracePeriodSeconds"], 0);
    assert_eq!(m["managedFields"], json!([{"manager": "m"}]));
    assert_eq!(
        m["labels"],
        json!({"a": "2"}),
        "user metadata is the client's"
    );
    assert_eq!(new["data"], json!({"k": "v"}));

    // What the old object lacks is removed from the new one.
    let bare = json!({"metadata": {"name": "a", "uid": "u1"}});
    let mut new = json!({"metadata": {"name": "a", "generation": 4,
        "deletionTimestamp": "2024-01-02T00:00:00Z"}});
    prepare_update_meta(&mut new, &bare, info).expect("no uid given");
    assert!(new["metadata"].get("generation").is_none(), "{new}");
    assert!(new["metadata"].get("deletionTimestamp").is_none(), "{new}");

    // A UID that is not the stored one is a failed precondition (409).
    let mut new = json!({"metadata": {"name": "a", "uid": "u2"}});
    let e = prepare_update_meta(&mut new, &old, info).expect_err("uid mismatch");
    assert_eq!(e.code, 409);
    assert!(
        e.message
            .contains("Precondition failed: UID in precondition: u2, UID in object meta: u1"),
        "{}",
        e.message
    );
}

#[test]
fn no_op_writes() {
    let old = json!({"metadata": {"name": "a", "resourceVersion": "5",
        "managedFields": [{"manager": "m", "time": "2024-01-01T00:00:00Z"}]}, "data": {"k": "v"}});
    let table = [
        // Only the resourceVersion or a managed-field timestamp differ: unchanged.
        (
            json!({"metadata": {"name": "a",
            "managedFields": [{"manager": "m", "time": "2025-01-01T00:00:00Z"}]}, "data": {"k": "v"}}),
            true,
        ),
        (
            json!({"metadata": {"name": "a", "resourceVersion": "9",
            "managedFields": [{"manager": "m"}]}, "data": {"k": "v"}}),
            true,
        ),
        // Data, or the managed fields themselves: a change.
        (
            json!({"metadata": {"name": "a",
            "managedFields": [{"manager": "m", "time": "2024-01-01T00:00:00Z"}]}, "data": {"k": "w"}}),
            false,
        ),
        (
            json!({"metadata": {"name": "a",
            "managedFields": [{"manager": "other", "time": "2024-01-01T00:00:00Z"}]}, "data": {"k": "v"}}),
            false,
        ),
    ];
    for (new, want) in table {
        assert_eq!(unchanged_but_times(&new, &old), want, "{new}");
    }
}

#[test]
fn names_on_the_url_and_in_the_body() {
    let cm = kind("", "ConfigMap");
    let ns_kind = kind("", "Namespace");
    // (body, name on the URL, namespace on the URL, kind, the 400's message)
    type Row<'a> = (
        Value,
        &'a str,
        Option<&'a str>,
        &'a KindInfo,
        Option<&'a str>,
    );
    let table: [Row; 7] = [
        (json!({"metadata": {"name": "a"}}), "a", Some("d"), cm, None),
        // Missing name or namespace in the body: taken from the URL.
        (json!({"metadata": {}}), "a", Some("d"), cm, None),
        (
            json!({"metadata": {"name": "a", "namespace": "d"}}),
            "a",
            Some("d"),
            cm,
            None,
        ),
        (
            json!({"metadata": {"name": "b"}}),
            "a",
            Some("d"),
            cm,
            Some("the name of the object (b) does not match the name on the URL (a)"),
        ),
        (
            json!({"metadata": {"name": "a", "namespace": "e"}}),
            "a",
            Some("d"),
            cm,
            Some(
                "the namespace of the provided object does not match the namespace sent on the request",
            ),
        ),
        // A cluster-scoped kind ignores a namespace in the body.
        (
            json!({"metadata": {"name": "a", "namespace": "e"}}),
            "a",
            None,
            ns_kind,
            None,
        ),
        (json!({"metadata": {"name": "a"}}), "a", None, ns_kind, None),
    ];
    for (body, name, ns, info, want) in table {
        let got = check_name_matches(&body, name, ns, info).err();
        assert_eq!(got.as_ref().map(|e| e.code), want.map(|_| 400), "{body}");
        assert_eq!(got.map(|e| e.message), want.map(String::from), "{body}");
    }
}
