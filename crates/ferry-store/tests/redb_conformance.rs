//! The conformance suite against the redb backend, plus redb-specific behaviour.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use bytes::Bytes;
use ferry_store::{RangeOptions, RedbOptions, RedbStore, Store, StoreError};
use futures::StreamExt;

async fn make() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path()).unwrap();
    (Arc::new(store), dir)
}

ferry_store::conformance_tests!(async || make().await);

#[tokio::test]
async fn reopen_restores_counters_and_history() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nested/dir/store.redb");
    let (last, compacted) = {
        let store = RedbStore::open(&file).unwrap();
        assert_eq!(store.path(), file);
        let a = store
            .create("/r/a", Bytes::from_static(b"1"))
            .await
            .unwrap();
        let a2 = store
            .update("/r/a", Bytes::from_static(b"2"), a.mod_revision)
            .await
            .unwrap();
        store
            .create("/r/b", Bytes::from_static(b"3"))
            .await
            .unwrap();
        store.compact(a.mod_revision).await.unwrap();
        let (_, last) = store.delete("/r/b", None).await.unwrap();
        assert_eq!(a2.mod_revision, 2);
        store.close().await;
        (last, a.mod_revision)
    };
    let store = RedbStore::open(&file).unwrap();
    assert_eq!(store.current_revision().await.unwrap(), last);
    assert_eq!(store.compacted_revision().await.unwrap(), compacted);
    let a = store.get("/r/a").await.unwrap().unwrap();
    assert_eq!(a.value, Bytes::from_static(b"2"));
    // History after the compacted revision is still there.
    let mut w = store.watch("/r/", compacted).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(w.next().await.unwrap().unwrap().revision());
    }
    assert_eq!(got, vec![2, 3, 4]);
    assert!(matches!(
        store.watch("/r/", 0).await,
        Err(StoreError::Compacted { .. })
    ));
    let next = store
        .create("/r/c", Bytes::from_static(b"4"))
        .await
        .unwrap();
    assert_eq!(next.mod_revision, last + 1);
}

#[tokio::test]
async fn lagging_watcher_gets_watch_lagged() {
    let dir = tempfile::tempdir().unwrap();
    let options = RedbOptions {
        watch_buffer: 4,
        ..Default::default()
    };
    let store = RedbStore::open_with(dir.path(), options).unwrap();
    let mut w = store.watch("/lag/", 0).await.unwrap();
    for i in 0..20 {
        store
            .create(&format!("/lag/{i}"), Bytes::from_static(b"x"))
            .await
            .unwrap();
    }
    // Replay-free watch (started at 0 on an empty store): the live buffer overflowed.
    let mut items = Vec::new();
    while let Some(item) = w.next().await {
        items.push(item);
    }
    assert_eq!(items.last(), Some(&Err(StoreError::WatchLagged)));
    // Everything before the error is a gap-free prefix of the history.
    let revs: Vec<_> = items
        .iter()
        .filter_map(|i| i.as_ref().ok())
        .map(|e| e.revision())
        .collect();
    assert_eq!(revs, (1..=revs.len() as i64).collect::<Vec<_>>());
}

#[tokio::test]
async fn range_of_many_keys_reads_old_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open(dir.path()).unwrap());
    let tasks: Vec<_> = (0..500)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .create(&format!("/many/{i:05}"), Bytes::from(vec![b'v'; 100]))
                    .await
                    .unwrap()
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let at = store.current_revision().await.unwrap();
    for i in (0..500).step_by(2) {
        store.delete(&format!("/many/{i:05}"), None).await.unwrap();
    }
    let now = store
        .range("/many/", RangeOptions::default())
        .await
        .unwrap();
    assert_eq!(now.kvs.len(), 250);
    let old = store
        .range(
            "/many/",
            RangeOptions {
                revision: at,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(old.kvs.len(), 500);
    assert!(old.kvs.windows(2).all(|w| w[0].key < w[1].key));
}

#[tokio::test]
async fn compactor_bounds_history() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path()).unwrap());
    for i in 0..30 {
        store
            .create(&format!("/c/{i}"), Bytes::from_static(b"x"))
            .await
            .unwrap();
    }
    let handle =
        ferry_store::spawn_compactor(store.clone(), std::time::Duration::from_millis(20), 10);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while store.compacted_revision().await.unwrap() != 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "compactor did not run"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    handle.stop();
    assert!(store.watch("/c/", 19).await.is_err());
    assert!(store.watch("/c/", 20).await.is_ok());
}

/// Issue 14, finding 5: the store file is `0600` (created so, whatever the umask), a new parent
/// directory `0700`, and a store file left world-readable by an older build is tightened when
/// opened.
#[cfg(unix)]
#[tokio::test]
async fn store_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data/store.redb");
    let store = RedbStore::open(&file).unwrap();
    store.create("/k", Bytes::from_static(b"v")).await.unwrap();
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&dir.path().join("data")), 0o700);
    store.close().await;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = RedbStore::open(&file).unwrap();
    assert_eq!(mode(&file), 0o600);
    assert_eq!(
        store.get("/k").await.unwrap().map(|kv| kv.value),
        Some(Bytes::from_static(b"v"))
    );
}
