//! The backend conformance suite: every [`Store`] implementation must pass these cases.
//!
//! Each case is an `async fn(Arc<dyn Store>)` that panics on failure. Cases only touch keys
//! under `/conformance/<case>/`, assume nothing about the absolute revision numbers (a backend
//! may start at any revision and revisions need not be contiguous), and expect that no one else
//! compacts the store while they run.
//!
//! Run the whole suite with [`conformance_tests!`](crate::conformance_tests), which expands to
//! one `#[tokio::test]` per case (the calling crate needs `tokio` with the `macros` and
//! `rt-multi-thread` features):
//!
//! ```ignore
//! ferry_store::conformance_tests!(async || {
//!     let dir = tempfile::tempdir().unwrap();
//!     let store = ferry_store::RedbStore::open(dir.path()).unwrap();
//!     // The harness keeps `dir` alive as long as the test runs.
//!     (std::sync::Arc::new(store) as std::sync::Arc<dyn ferry_store::Store>, dir)
//! });
//! ```

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use crate::{Event, KeyValue, RangeOptions, Revision, Store, StoreError, WatchStream};

/// What a conformance factory returns: a store, possibly with something that must live as long
/// as the test (a temporary directory, a server process...).
pub trait Harness: Send + 'static {
    fn store(&self) -> Arc<dyn Store>;
}

impl Harness for Arc<dyn Store> {
    fn store(&self) -> Arc<dyn Store> {
        self.clone()
    }
}

impl<G: Send + 'static> Harness for (Arc<dyn Store>, G) {
    fn store(&self) -> Arc<dyn Store> {
        self.0.clone()
    }
}

/// How long a case waits for an expected watch event.
const WAIT: Duration = Duration::from_secs(10);

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

async fn next_event(w: &mut WatchStream) -> Event {
    match tokio::time::timeout(WAIT, w.next()).await {
        Ok(Some(Ok(e))) => e,
        Ok(Some(Err(e))) => panic!("watch failed: {e}"),
        Ok(None) => panic!("watch ended"),
        Err(_) => panic!("no watch event within {WAIT:?}"),
    }
}

async fn next_events(w: &mut WatchStream, n: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next_event(w).await);
    }
    out
}

/// Asserts that the watch has nothing more to say right now.
async fn assert_quiet(w: &mut WatchStream) {
    if let Ok(item) = tokio::time::timeout(Duration::from_millis(200), w.next()).await {
        panic!("unexpected watch item: {item:?}");
    }
}

fn put_summary(e: &Event) -> (String, Revision, Option<String>) {
    match e {
        Event::Put { kv, .. } => (
            format!("put {}={}", kv.key, String::from_utf8_lossy(&kv.value)),
            kv.mod_revision,
            None,
        ),
        Event::Delete { prev, revision } => (
            format!("delete {}", prev.key),
            *revision,
            Some(String::from_utf8_lossy(&prev.value).into_owned()),
        ),
    }
}

/// Every write gets a revision above every earlier one; `current_revision` follows.
pub async fn revisions_monotonic(store: Arc<dyn Store>) {
    let p = "/conformance/revisions_monotonic/";
    let start = store.current_revision().await.expect("current_revision");
    let a = store
        .create(&format!("{p}a"), b("1"))
        .await
        .expect("create");
    assert!(a.mod_revision > start);
    assert_eq!(a.create_revision, a.mod_revision);
    assert_eq!(store.current_revision().await.expect("rev"), a.mod_revision);
    let a2 = store
        .update(&format!("{p}a"), b("2"), a.mod_revision)
        .await
        .expect("update");
    assert!(a2.mod_revision > a.mod_revision);
    assert_eq!(
        a2.create_revision, a.create_revision,
        "update keeps create_revision"
    );
    let c = store
        .create(&format!("{p}c"), b("3"))
        .await
        .expect("create");
    assert!(c.mod_revision > a2.mod_revision);
    let (deleted, del_rev) = store
        .delete(&format!("{p}a"), Some(a2.mod_revision))
        .await
        .expect("delete");
    assert_eq!(deleted, a2);
    assert!(del_rev > c.mod_revision);
    assert_eq!(store.current_revision().await.expect("rev"), del_rev);
    // Re-creating a deleted key starts a new life.
    let a3 = store
        .create(&format!("{p}a"), b("4"))
        .await
        .expect("recreate");
    assert!(a3.mod_revision > del_rev);
    assert_eq!(a3.create_revision, a3.mod_revision);
}

/// `get` returns what was written, `None` for absent keys.
pub async fn get_roundtrip(store: Arc<dyn Store>) {
    let p = "/conformance/get_roundtrip/";
    assert_eq!(store.get(&format!("{p}x")).await.expect("get"), None);
    let value = Bytes::from(vec![0u8, 1, 2, 255]);
    let kv = store
        .create(&format!("{p}x"), value.clone())
        .await
        .expect("create");
    assert_eq!(kv.value, value);
    assert_eq!(kv.key, format!("{p}x"));
    assert_eq!(
        store.get(&format!("{p}x")).await.expect("get"),
        Some(kv.clone())
    );
    let kv2 = store
        .update(&format!("{p}x"), b(""), kv.mod_revision)
        .await
        .expect("update to empty");
    assert_eq!(store.get(&format!("{p}x")).await.expect("get"), Some(kv2));
    store.delete(&format!("{p}x"), None).await.expect("delete");
    assert_eq!(store.get(&format!("{p}x")).await.expect("get"), None);
}

/// Creating an existing key fails and changes nothing.
pub async fn create_twice_already_exists(store: Arc<dyn Store>) {
    let key = "/conformance/create_twice/k";
    let first = store.create(key, b("1")).await.expect("create");
    let rev = store.current_revision().await.expect("rev");
    assert_eq!(
        store.create(key, b("2")).await,
        Err(StoreError::AlreadyExists)
    );
    assert_eq!(store.get(key).await.expect("get"), Some(first));
    assert_eq!(
        store.current_revision().await.expect("rev"),
        rev,
        "a failed write uses no revision"
    );
}

/// Update and delete with a stale revision fail with `Conflict` carrying the current value.
pub async fn stale_revision_conflict(store: Arc<dyn Store>) {
    let key = "/conformance/stale_revision_conflict/k";
    let v1 = store.create(key, b("1")).await.expect("create");
    let v2 = store
        .update(key, b("2"), v1.mod_revision)
        .await
        .expect("update");
    match store.update(key, b("3"), v1.mod_revision).await {
        Err(StoreError::Conflict { current }) => assert_eq!(*current, v2),
        other => panic!("stale update: {other:?}"),
    }
    match store.delete(key, Some(v1.mod_revision)).await {
        Err(StoreError::Conflict { current }) => assert_eq!(*current, v2),
        other => panic!("stale delete: {other:?}"),
    }
    assert_eq!(store.get(key).await.expect("get"), Some(v2.clone()));
    let (gone, _) = store
        .delete(key, Some(v2.mod_revision))
        .await
        .expect("delete");
    assert_eq!(gone, v2);
}

/// Update or delete of an absent key is `NotFound`.
pub async fn missing_key_not_found(store: Arc<dyn Store>) {
    let key = "/conformance/missing_key_not_found/k";
    assert_eq!(store.delete(key, None).await, Err(StoreError::NotFound));
    assert_eq!(store.delete(key, Some(1)).await, Err(StoreError::NotFound));
    assert_eq!(
        store.update(key, b("x"), 1).await,
        Err(StoreError::NotFound)
    );
    let kv = store.create(key, b("x")).await.expect("create");
    store
        .delete(key, Some(kv.mod_revision))
        .await
        .expect("delete");
    assert_eq!(store.delete(key, None).await, Err(StoreError::NotFound));
}

async fn fill(store: &Arc<dyn Store>, keys: &[&str]) {
    for key in keys {
        store.create(key, b(key)).await.expect("create");
    }
}

fn keys_of(kvs: &[KeyValue]) -> Vec<&str> {
    kvs.iter().map(|kv| kv.key.as_str()).collect()
}

/// A prefix matches only keys starting with it: "/a/b/" does not match "/a/bc/x" or "/a/b".
pub async fn range_prefix_boundaries(store: Arc<dyn Store>) {
    let p = "/conformance/range_prefix";
    let keys = [
        format!("{p}/a/b"),
        format!("{p}/a/b/1"),
        format!("{p}/a/b/2/deep"),
        format!("{p}/a/bc/1"),
        format!("{p}/a/b0"),
        format!("{p}/a/a/1"),
    ];
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    fill(&store, &refs).await;
    let r = store
        .range(&format!("{p}/a/b/"), RangeOptions::default())
        .await
        .expect("range");
    assert_eq!(
        keys_of(&r.kvs),
        [format!("{p}/a/b/1"), format!("{p}/a/b/2/deep")]
    );
    assert!(!r.more);
    assert_eq!(r.revision, store.current_revision().await.expect("rev"));
    let r = store
        .range(&format!("{p}/a/"), RangeOptions::default())
        .await
        .expect("range");
    assert_eq!(r.kvs.len(), 6);
    let r = store
        .range(&format!("{p}/zzz/"), RangeOptions::default())
        .await
        .expect("range");
    assert!(r.kvs.is_empty() && !r.more);
    // The values are the stored ones.
    let r = store
        .range(&format!("{p}/a/bc/"), RangeOptions::default())
        .await
        .expect("range");
    assert_eq!(r.kvs[0].value, b(&format!("{p}/a/bc/1")));
}

/// Keys come back in byte order; `limit` cuts the list and sets `more`.
pub async fn range_order_and_limit(store: Arc<dyn Store>) {
    let p = "/conformance/range_order/";
    let names = ["m", "b", "z", "a", "B", "aa", "a0", "~", "0"];
    let keys: Vec<String> = names.iter().map(|n| format!("{p}{n}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    fill(&store, &refs).await;
    let mut sorted = keys.clone();
    sorted.sort();
    let all = store
        .range(p, RangeOptions::default())
        .await
        .expect("range");
    assert_eq!(keys_of(&all.kvs), sorted);
    assert!(!all.more);
    for limit in [1usize, 3, 8, 9, 10, 100] {
        let r = store
            .range(
                p,
                RangeOptions {
                    limit,
                    ..Default::default()
                },
            )
            .await
            .expect("range");
        let n = limit.min(keys.len());
        assert_eq!(keys_of(&r.kvs), &sorted[..n], "limit {limit}");
        assert_eq!(r.more, limit < keys.len(), "more with limit {limit}");
    }
}

/// Paging with `start_after` + `limit` at a fixed revision visits every key once.
pub async fn range_paging(store: Arc<dyn Store>) {
    let p = "/conformance/range_paging/";
    let keys: Vec<String> = (0..25).map(|i| format!("{p}{i:03}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    fill(&store, &refs).await;
    let revision = store.current_revision().await.expect("rev");
    // Writes after the first page must not show up in later pages read at `revision`.
    let mut seen = Vec::new();
    let mut start_after = None;
    let mut pages = 0;
    loop {
        let r = store
            .range(
                p,
                RangeOptions {
                    limit: 7,
                    start_after: start_after.clone(),
                    revision,
                },
            )
            .await
            .expect("range page");
        assert_eq!(r.revision, revision);
        pages += 1;
        if pages == 1 {
            store
                .create(&format!("{p}0999"), b("late"))
                .await
                .expect("create");
            store
                .delete(&format!("{p}020"), None)
                .await
                .expect("delete");
        }
        seen.extend(r.kvs.iter().map(|kv| kv.key.clone()));
        if !r.more {
            break;
        }
        start_after = r.kvs.last().map(|kv| kv.key.clone());
    }
    assert_eq!(seen, keys);
    assert_eq!(pages, 4);
    // `start_after` below the prefix starts at the prefix; above all keys gives nothing.
    let r = store
        .range(
            p,
            RangeOptions {
                start_after: Some("/a".into()),
                limit: 1,
                ..Default::default()
            },
        )
        .await
        .expect("range");
    assert_eq!(keys_of(&r.kvs), [keys[0].as_str()]);
    let r = store
        .range(
            p,
            RangeOptions {
                start_after: Some(format!("{p}~")),
                ..Default::default()
            },
        )
        .await
        .expect("range");
    assert!(r.kvs.is_empty() && !r.more);
}

/// `range` at an old revision sees the values of that time; a future revision is an error.
pub async fn range_at_revision(store: Arc<dyn Store>) {
    let p = "/conformance/range_at_revision/";
    let a1 = store
        .create(&format!("{p}a"), b("a1"))
        .await
        .expect("create");
    let b1 = store
        .create(&format!("{p}b"), b("b1"))
        .await
        .expect("create");
    let d1 = store
        .create(&format!("{p}d"), b("d1"))
        .await
        .expect("create");
    let at = store.current_revision().await.expect("rev");
    let a2 = store
        .update(&format!("{p}a"), b("a2"), a1.mod_revision)
        .await
        .expect("update");
    store.delete(&format!("{p}b"), None).await.expect("delete");
    store
        .create(&format!("{p}c"), b("c1"))
        .await
        .expect("create");
    store
        .update(&format!("{p}a"), b("a3"), a2.mod_revision)
        .await
        .expect("update");
    let old = store
        .range(
            p,
            RangeOptions {
                revision: at,
                ..Default::default()
            },
        )
        .await
        .expect("range at old revision");
    assert_eq!(old.revision, at);
    assert_eq!(old.kvs, vec![a1.clone(), b1.clone(), d1.clone()]);
    let limited = store
        .range(
            p,
            RangeOptions {
                revision: at,
                limit: 2,
                ..Default::default()
            },
        )
        .await
        .expect("range");
    assert_eq!(limited.kvs, vec![a1, b1.clone()]);
    assert!(limited.more);
    let paged = store
        .range(
            p,
            RangeOptions {
                revision: at,
                start_after: Some(format!("{p}a")),
                limit: 1,
            },
        )
        .await
        .expect("range");
    assert_eq!(paged.kvs, vec![b1]);
    assert!(paged.more);
    let now = store
        .range(p, RangeOptions::default())
        .await
        .expect("range");
    assert_eq!(
        keys_of(&now.kvs),
        [format!("{p}a"), format!("{p}c"), format!("{p}d")]
    );
    assert_eq!(now.kvs[0].value, b("a3"));
    let future = now.revision + 1000;
    match store
        .range(
            p,
            RangeOptions {
                revision: future,
                ..Default::default()
            },
        )
        .await
    {
        Err(StoreError::FutureRevision(r)) => assert_eq!(r, future),
        other => panic!("future revision: {other:?}"),
    }
}

/// Watch from 0 replays the whole history of the prefix, then goes live.
pub async fn watch_from_zero_replays_history(store: Arc<dyn Store>) {
    let p = "/conformance/watch_history/";
    let a = store
        .create(&format!("{p}a"), b("1"))
        .await
        .expect("create");
    store
        .create("/conformance/watch_history_other/x", b("no"))
        .await
        .expect("create");
    let a2 = store
        .update(&format!("{p}a"), b("2"), a.mod_revision)
        .await
        .expect("update");
    let (_, del) = store.delete(&format!("{p}a"), None).await.expect("delete");
    let mut w = store.watch(p, 0).await.expect("watch");
    let events = next_events(&mut w, 3).await;
    assert_eq!(
        events[0],
        Event::Put {
            kv: a.clone(),
            prev: None
        }
    );
    assert_eq!(
        events[1],
        Event::Put {
            kv: a2.clone(),
            prev: Some(a)
        }
    );
    assert_eq!(
        events[2],
        Event::Delete {
            prev: a2,
            revision: del
        }
    );
    assert_quiet(&mut w).await;
    let c = store
        .create(&format!("{p}c"), b("3"))
        .await
        .expect("create");
    assert_eq!(next_event(&mut w).await, Event::Put { kv: c, prev: None });
}

/// Watch from revision N sees only events after N.
pub async fn watch_from_revision(store: Arc<dyn Store>) {
    let p = "/conformance/watch_from_revision/";
    let a = store
        .create(&format!("{p}a"), b("1"))
        .await
        .expect("create");
    let bb = store
        .create(&format!("{p}b"), b("2"))
        .await
        .expect("create");
    let mut w = store.watch(p, a.mod_revision).await.expect("watch");
    assert_eq!(
        next_event(&mut w).await,
        Event::Put {
            kv: bb.clone(),
            prev: None
        }
    );
    assert_quiet(&mut w).await;
    // From the current revision: only live events.
    let mut live = store.watch(p, bb.mod_revision).await.expect("watch");
    assert_quiet(&mut live).await;
    let c = store
        .create(&format!("{p}c"), b("3"))
        .await
        .expect("create");
    assert_eq!(
        next_event(&mut live).await,
        Event::Put {
            kv: c.clone(),
            prev: None
        }
    );
    assert_eq!(next_event(&mut w).await, Event::Put { kv: c, prev: None });
}

/// Delete and update events carry the previous value; other prefixes are filtered out.
pub async fn watch_prev_values(store: Arc<dyn Store>) {
    let p = "/conformance/watch_prev/";
    let start = store.current_revision().await.expect("rev");
    let mut w = store.watch(p, start).await.expect("watch");
    let v1 = store
        .create(&format!("{p}k"), b("v1"))
        .await
        .expect("create");
    store
        .create("/conformance/watch_prevx", b("other"))
        .await
        .expect("create");
    let v2 = store
        .update(&format!("{p}k"), b("v2"), v1.mod_revision)
        .await
        .expect("update");
    let (gone, rev) = store
        .delete(&format!("{p}k"), Some(v2.mod_revision))
        .await
        .expect("delete");
    assert_eq!(gone, v2);
    let events = next_events(&mut w, 3).await;
    assert_eq!(
        events,
        vec![
            Event::Put {
                kv: v1.clone(),
                prev: None
            },
            Event::Put {
                kv: v2.clone(),
                prev: Some(v1)
            },
            Event::Delete {
                prev: v2,
                revision: rev
            },
        ]
    );
    assert_quiet(&mut w).await;
}

/// Several watchers of the same prefix see the same events in the same, increasing order.
pub async fn watchers_agree(store: Arc<dyn Store>) {
    let p = "/conformance/watchers_agree/";
    let start = store.current_revision().await.expect("rev");
    let mut watchers = Vec::new();
    for _ in 0..5 {
        watchers.push(store.watch(p, start).await.expect("watch"));
    }
    let writers: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..10 {
                    let key = format!("{p}{t}/{i}");
                    let kv = store.create(&key, b("x")).await.expect("create");
                    store
                        .update(&key, b("y"), kv.mod_revision)
                        .await
                        .expect("update");
                }
            })
        })
        .collect();
    for w in writers {
        w.await.expect("writer task");
    }
    let mut first: Option<Vec<_>> = None;
    for w in &mut watchers {
        let events: Vec<_> = next_events(w, 160).await.iter().map(put_summary).collect();
        assert!(
            events.windows(2).all(|p| p[0].1 < p[1].1),
            "revisions increase"
        );
        match &first {
            None => first = Some(events),
            Some(f) => assert_eq!(f, &events),
        }
        assert_quiet(w).await;
    }
}

/// A watch started while writes go on sees every event exactly once (no gap and no duplicate
/// between replay and live phases).
pub async fn watch_replay_live_handover(store: Arc<dyn Store>) {
    let p = "/conformance/watch_handover/";
    let start = store.current_revision().await.expect("rev");
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut revs = Vec::new();
            for i in 0..300 {
                revs.push(
                    store
                        .create(&format!("{p}{i:04}"), b("x"))
                        .await
                        .expect("create")
                        .mod_revision,
                );
            }
            revs
        })
    };
    let mut watches = Vec::new();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(3)).await;
        watches.push(store.watch(p, start).await.expect("watch"));
    }
    let revs = writer.await.expect("writer");
    for w in &mut watches {
        let got: Vec<Revision> = next_events(w, revs.len())
            .await
            .iter()
            .map(Event::revision)
            .collect();
        assert_eq!(got, revs);
        assert_quiet(w).await;
    }
}

/// Watching or reading at a compacted revision is `Compacted`; later revisions still work.
pub async fn compacted_revision_too_old(store: Arc<dyn Store>) {
    let p = "/conformance/compaction/";
    let a = store
        .create(&format!("{p}a"), b("1"))
        .await
        .expect("create");
    let a2 = store
        .update(&format!("{p}a"), b("2"), a.mod_revision)
        .await
        .expect("update");
    let bb = store
        .create(&format!("{p}b"), b("3"))
        .await
        .expect("create");
    store.compact(a2.mod_revision).await.expect("compact");
    assert!(store.compacted_revision().await.expect("compacted") >= a2.mod_revision);
    match store.watch(p, a.mod_revision - 1).await {
        Err(StoreError::Compacted { .. }) => {}
        Err(e) => panic!("watch from compacted revision: {e}"),
        Ok(mut w) => match tokio::time::timeout(WAIT, w.next()).await {
            Ok(Some(Err(StoreError::Compacted { .. }))) => {}
            other => panic!("watch from compacted revision: {other:?}"),
        },
    }
    match store
        .range(
            p,
            RangeOptions {
                revision: a.mod_revision,
                ..Default::default()
            },
        )
        .await
    {
        Err(StoreError::Compacted { .. }) => {}
        other => panic!("range at compacted revision: {other:?}"),
    }
    let mut w = store
        .watch(p, a2.mod_revision)
        .await
        .expect("watch after compaction point");
    assert_eq!(
        next_event(&mut w).await,
        Event::Put {
            kv: bb.clone(),
            prev: None
        }
    );
    let r = store
        .range(p, RangeOptions::default())
        .await
        .expect("range");
    assert_eq!(r.kvs, vec![a2, bb]);
    // Compacting again at or below the compacted revision is harmless.
    store.compact(a.mod_revision).await.expect("compact below");
}

/// Concurrent creates of one key: exactly one wins, the others get `AlreadyExists`.
pub async fn concurrent_create_one_wins(store: Arc<dyn Store>) {
    let key = "/conformance/create_race/k";
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.create(key, b(&i.to_string())).await })
        })
        .collect();
    let mut winners = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(kv) => winners.push(kv),
            Err(StoreError::AlreadyExists) => {}
            Err(e) => panic!("create race: {e}"),
        }
    }
    assert_eq!(winners.len(), 1);
    assert_eq!(store.get(key).await.expect("get"), Some(winners.remove(0)));
}

/// 1000 concurrent writers: distinct revisions, every write stored, every write watched.
pub async fn thousand_concurrent_writers(store: Arc<dyn Store>) {
    let p = "/conformance/thousand/";
    let start = store.current_revision().await.expect("rev");
    let mut w = store.watch(p, start).await.expect("watch");
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.create(&format!("{p}{i:04}"), b("v")).await })
        })
        .collect();
    let mut revs = BTreeMap::new();
    for t in tasks {
        let kv = t.await.expect("task").expect("create");
        assert!(
            revs.insert(kv.mod_revision, kv.key).is_none(),
            "duplicate revision"
        );
    }
    assert!(*revs.keys().next().expect("some") > start);
    let r = store
        .range(p, RangeOptions::default())
        .await
        .expect("range");
    assert_eq!(r.kvs.len(), 1000);
    assert!(r.revision >= *revs.keys().last().expect("some"));
    let watched: Vec<Revision> = next_events(&mut w, 1000)
        .await
        .iter()
        .map(Event::revision)
        .collect();
    assert_eq!(watched, revs.keys().copied().collect::<Vec<_>>());
    let distinct: HashSet<_> = r.kvs.iter().map(|kv| kv.mod_revision).collect();
    assert_eq!(distinct.len(), 1000);
}

/// A value over [`crate::MAX_VALUE_BYTES`] is `TooLarge` on create and update; nothing is
/// written.
pub async fn oversized_value_refused(store: Arc<dyn Store>) {
    let key = "/conformance/oversized/k";
    let big = Bytes::from(vec![b'x'; crate::MAX_VALUE_BYTES + 1]);
    assert!(matches!(
        store.create(key, big.clone()).await,
        Err(StoreError::TooLarge { .. })
    ));
    assert_eq!(store.get(key).await.expect("get"), None);
    let kv = store.create(key, b("small")).await.expect("create");
    assert!(matches!(
        store.update(key, big, kv.mod_revision).await,
        Err(StoreError::TooLarge { .. })
    ));
    assert_eq!(store.get(key).await.expect("get"), Some(kv));
}

/// `shutdown` lets the writes already submitted finish, then refuses writes (`Unavailable`,
/// nothing written) while reads and watches go on; calling it again is `Ok`.
pub async fn shutdown_is_clean(store: Arc<dyn Store>) {
    let p = "/conformance/shutdown/";
    let mut w = store.watch(p, 0).await.expect("watch");
    let kept = store
        .create(&format!("{p}kept"), b("v"))
        .await
        .expect("create");
    // Writes racing the shutdown: each either succeeds (and stays) or is refused.
    let racing: Vec<_> = (0..20)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.create(&format!("{p}race-{i:02}"), b("r")).await })
        })
        .collect();
    store.shutdown().await.expect("shutdown");
    let mut won = Vec::new();
    for (i, t) in racing.into_iter().enumerate() {
        match t.await.expect("task") {
            Ok(kv) => won.push(kv),
            Err(StoreError::Unavailable(_)) => {
                let key = format!("{p}race-{i:02}");
                assert_eq!(store.get(&key).await.expect("get"), None, "{key}");
            }
            Err(e) => panic!("write racing the shutdown: {e}"),
        }
    }
    let rev = store.current_revision().await.expect("revision");
    // Refused after: create, update, delete; nothing changes.
    assert!(matches!(
        store.create(&format!("{p}late"), b("x")).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.update(&kept.key, b("w"), kept.mod_revision).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.delete(&kept.key, None).await,
        Err(StoreError::Unavailable(_))
    ));
    store.shutdown().await.expect("second shutdown");
    assert_eq!(store.current_revision().await.expect("revision"), rev);
    // Reads still work and show exactly what was acknowledged.
    assert_eq!(store.get(&kept.key).await.expect("get"), Some(kept.clone()));
    let listed = store
        .range(p, RangeOptions::default())
        .await
        .expect("range");
    let mut want: Vec<KeyValue> = std::iter::once(kept.clone()).chain(won).collect();
    want.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(listed.kvs, want);
    // The watch saw every acknowledged write, and nothing else.
    let events = next_events(&mut w, want.len()).await;
    let mut seen: Vec<String> = events.iter().map(|e| e.key().to_owned()).collect();
    seen.sort();
    assert_eq!(
        seen,
        want.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>()
    );
    assert_quiet(&mut w).await;
}

/// Runs every case, each against a fresh store from `make`.
pub async fn run_all<H, F, Fut>(make: F)
where
    H: Harness,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = H>,
{
    macro_rules! run {
        ($($case:ident),*) => {$(
            let h = make().await;
            $case(h.store()).await;
            drop(h);
        )*};
    }
    run!(
        revisions_monotonic,
        get_roundtrip,
        create_twice_already_exists,
        stale_revision_conflict,
        missing_key_not_found,
        range_prefix_boundaries,
        range_order_and_limit,
        range_paging,
        range_at_revision,
        watch_from_zero_replays_history,
        watch_from_revision,
        watch_prev_values,
        watchers_agree,
        watch_replay_live_handover,
        compacted_revision_too_old,
        concurrent_create_one_wins,
        thousand_concurrent_writers,
        oversized_value_refused,
        shutdown_is_clean
    );
}

/// Expands to one `#[tokio::test]` per conformance case. The argument is a factory (an async
/// closure or a closure returning a future) producing a [`Harness`]: an `Arc<dyn Store>` or a
/// tuple `(Arc<dyn Store>, guard)`. Each case gets a fresh store.
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::__conformance_cases!(
            $factory;
            revisions_monotonic,
            get_roundtrip,
            create_twice_already_exists,
            stale_revision_conflict,
            missing_key_not_found,
            range_prefix_boundaries,
            range_order_and_limit,
            range_paging,
            range_at_revision,
            watch_from_zero_replays_history,
            watch_from_revision,
            watch_prev_values,
            watchers_agree,
            watch_replay_live_handover,
            compacted_revision_too_old,
            concurrent_create_one_wins,
            thousand_concurrent_writers,
            oversized_value_refused,
            shutdown_is_clean,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($factory:expr; $($case:ident),* $(,)?) => {$(
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let make = $factory;
            let harness = make().await;
            $crate::conformance::$case($crate::conformance::Harness::store(&harness)).await;
            drop(harness);
        }
    )*};
}
