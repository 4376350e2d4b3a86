//! Model-based test: random writes against `RedbStore` and an in-memory model; every revision's
//! state must be readable with `range` at that revision, and watch from 0 must replay exactly
//! the model's events.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use bytes::Bytes;
use ferry_store::{Event, KeyValue, RangeOptions, RedbStore, Store, StoreError};
use futures::StreamExt;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Create(usize),
    /// Update with the right revision, or a stale one.
    Update(usize, bool),
    Delete(usize, bool),
}

const KEYS: [&str; 6] = ["/p/a", "/p/b", "/p/b/c", "/p/bc", "/q/a", "/p"];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..KEYS.len()).prop_map(Op::Create),
        (0..KEYS.len(), any::<bool>()).prop_map(|(k, s)| Op::Update(k, s)),
        (0..KEYS.len(), any::<bool>()).prop_map(|(k, s)| Op::Delete(k, s)),
    ]
}

async fn check(ops: Vec<Op>, limit: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path()).unwrap();
    let mut model: BTreeMap<String, KeyValue> = BTreeMap::new();
    let mut history = vec![model.clone()];
    let mut events = Vec::new();
    for (n, op) in ops.into_iter().enumerate() {
        let value = Bytes::from(format!("v{n}"));
        let rev = history.len() as i64;
        match op {
            Op::Create(k) => {
                let key = KEYS[k];
                let got = store.create(key, value.clone()).await;
                if model.contains_key(key) {
                    assert_eq!(got, Err(StoreError::AlreadyExists));
                    continue;
                }
                let kv = KeyValue {
                    key: key.into(),
                    value,
                    create_revision: rev,
                    mod_revision: rev,
                };
                assert_eq!(got.unwrap(), kv);
                events.push(Event::Put {
                    kv: kv.clone(),
                    prev: None,
                });
                model.insert(key.into(), kv);
            }
            Op::Update(k, stale) => {
                let key = KEYS[k];
                let cur = model.get(key).cloned();
                let expected = cur
                    .as_ref()
                    .map_or(1, |c| c.mod_revision - i64::from(stale));
                let got = store.update(key, value.clone(), expected).await;
                match cur {
                    None => {
                        assert_eq!(got, Err(StoreError::NotFound));
                        continue;
                    }
                    Some(c) if stale => {
                        assert_eq!(
                            got,
                            Err(StoreError::Conflict {
                                current: Box::new(c)
                            })
                        );
                        continue;
                    }
                    Some(c) => {
                        let kv = KeyValue {
                            key: key.into(),
                            value,
                            create_revision: c.create_revision,
                            mod_revision: rev,
                        };
                        assert_eq!(got.unwrap(), kv);
                        events.push(Event::Put {
                            kv: kv.clone(),
                            prev: Some(c),
                        });
                        model.insert(key.into(), kv);
                    }
                }
            }
            Op::Delete(k, stale) => {
                let key = KEYS[k];
                let cur = model.get(key).cloned();
                let expected = cur.as_ref().map(|c| c.mod_revision - i64::from(stale));
                let got = store.delete(key, expected).await;
                match cur {
                    None => {
                        assert_eq!(got, Err(StoreError::NotFound));
                        continue;
                    }
                    Some(c) if stale => {
                        assert_eq!(
                            got,
                            Err(StoreError::Conflict {
                                current: Box::new(c)
                            })
                        );
                        continue;
                    }
                    Some(c) => {
                        assert_eq!(got.unwrap(), (c.clone(), rev));
                        events.push(Event::Delete {
                            prev: c,
                            revision: rev,
                        });
                        model.remove(key);
                    }
                }
            }
        }
        history.push(model.clone());
    }
    let current = store.current_revision().await.unwrap();
    assert_eq!(current as usize, history.len() - 1);
    for (rev, state) in history.iter().enumerate() {
        if rev == 0 && current > 0 {
            // Revision 0 means "current" to `range`; the empty start state is not readable.
            continue;
        }
        for prefix in ["/p/", "/p", "/p/b", "/q/", ""] {
            let want: Vec<KeyValue> = state
                .values()
                .filter(|kv| kv.key.starts_with(prefix))
                .cloned()
                .collect();
            // Page through at this revision.
            let mut got = Vec::new();
            let mut start_after = None;
            loop {
                let opts = RangeOptions {
                    limit,
                    start_after: start_after.clone(),
                    revision: rev as i64,
                };
                let r = store.range(prefix, opts).await.unwrap();
                assert_eq!(r.revision, rev as i64);
                got.extend(r.kvs.iter().cloned());
                if !r.more {
                    break;
                }
                assert_eq!(r.kvs.len(), limit);
                start_after = r.kvs.last().map(|kv| kv.key.clone());
            }
            assert_eq!(got, want, "revision {rev} prefix {prefix:?} limit {limit}");
        }
    }
    let mut w = store.watch("/p/", 0).await.unwrap();
    let want: Vec<Event> = events
        .into_iter()
        .filter(|e| e.key().starts_with("/p/"))
        .collect();
    for e in &want {
        assert_eq!(&w.next().await.unwrap().unwrap(), e);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn range_at_every_revision_matches_model(ops in proptest::collection::vec(op(), 1..60), limit in 0usize..4) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(check(ops, limit));
    }
}
