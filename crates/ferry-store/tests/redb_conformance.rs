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

async fn make_with(options: RedbOptions) -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open_with(dir.path(), options).unwrap();
    (Arc::new(store), dir)
}

/// The suite with every batch a durable redb commit (no write-ahead log).
mod without_write_ahead_log {
    use super::*;
    ferry_store::conformance_tests!(async || make_with(RedbOptions {
        write_ahead_log: false,
        ..Default::default()
    })
    .await);
}

/// The suite with a checkpoint after every batch (the log starts over all the time).
mod checkpoint_every_batch {
    use super::*;
    ferry_store::conformance_tests!(async || make_with(RedbOptions {
        checkpoint_bytes: 1,
        ..Default::default()
    })
    .await);
}

/// Copies the store's files while it runs (nothing is written meanwhile): what a crash at
/// this point would leave on disk.
fn crash_copy(dir: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Acknowledged writes that only the write-ahead log holds (no checkpoint yet) are in the store
/// after a crash, with their history; a store opened without the log recovers them too and
/// removes the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_replayed_from_the_log() {
    for reopen_with_log in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(RedbStore::open(dir.path()).unwrap());
        let a = store
            .create("/w/a", Bytes::from_static(b"1"))
            .await
            .unwrap();
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .create(&format!("/w/many/{i:03}"), Bytes::from(vec![b'x'; 300]))
                        .await
                        .unwrap()
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let a2 = store
            .update("/w/a", Bytes::from_static(b"2"), a.mod_revision)
            .await
            .unwrap();
        let (_, deleted_at) = store.delete("/w/many/007", None).await.unwrap();
        let crashed = tempfile::tempdir().unwrap();
        crash_copy(dir.path(), crashed.path());
        assert!(crashed.path().join("ferry.redb.wal").exists());
        // The log is what holds them: redb alone has not got them durably.
        {
            let redb_only = tempfile::tempdir().unwrap();
            std::fs::copy(
                crashed.path().join("ferry.redb"),
                redb_only.path().join("ferry.redb"),
            )
            .unwrap();
            let s = RedbStore::open(redb_only.path()).unwrap();
            assert!(s.current_revision().await.unwrap() < deleted_at);
            s.close().await;
        }

        let options = RedbOptions {
            write_ahead_log: reopen_with_log,
            ..Default::default()
        };
        let copy = RedbStore::open_with(crashed.path(), options).unwrap();
        assert_eq!(copy.current_revision().await.unwrap(), deleted_at);
        assert_eq!(copy.get("/w/a").await.unwrap(), Some(a2.clone()));
        assert_eq!(copy.get("/w/many/007").await.unwrap(), None);
        let all = copy
            .range("/w/many/", RangeOptions::default())
            .await
            .unwrap();
        assert_eq!(all.kvs.len(), 49);
        // The history came back too: a watch from 0 replays every revision once, in order.
        let mut w = copy.watch("/", 0).await.unwrap();
        let mut revs = Vec::new();
        for _ in 0..deleted_at {
            revs.push(w.next().await.unwrap().unwrap().revision());
        }
        assert_eq!(revs, (1..=deleted_at).collect::<Vec<_>>());
        let next = copy.create("/w/next", Bytes::new()).await.unwrap();
        assert_eq!(next.mod_revision, deleted_at + 1);
        assert_eq!(
            crashed.path().join("ferry.redb.wal").exists(),
            reopen_with_log
        );
        drop(w);
        copy.close().await;
        // A clean stop leaves everything in redb: a second reopen sees the same.
        let again = RedbStore::open(crashed.path()).unwrap();
        assert_eq!(again.current_revision().await.unwrap(), deleted_at + 1);
        assert_eq!(again.get("/w/a").await.unwrap(), Some(a2));
        again.close().await;
        Arc::into_inner(store).unwrap().close().await;
    }
}

/// With small checkpoints, a crash copy taken after many of them recovers exactly the
/// acknowledged state (the log restarted over older records many times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_after_many_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let options = RedbOptions {
        checkpoint_bytes: 4096,
        ..Default::default()
    };
    let store = RedbStore::open_with(dir.path(), options).unwrap();
    let mut last = None;
    for i in 0..300 {
        let key = format!("/c/{}", i % 40);
        last = Some(match store.get(&key).await.unwrap() {
            Some(kv) => store
                .update(&key, Bytes::from(format!("{i}")), kv.mod_revision)
                .await
                .unwrap(),
            None => store
                .create(&key, Bytes::from(format!("{i}")))
                .await
                .unwrap(),
        });
    }
    let last = last.unwrap();
    let crashed = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), crashed.path());
    let copy = RedbStore::open(crashed.path()).unwrap();
    assert_eq!(copy.current_revision().await.unwrap(), last.mod_revision);
    let a = copy.range("/c/", RangeOptions::default()).await.unwrap();
    let b = store.range("/c/", RangeOptions::default()).await.unwrap();
    assert_eq!(a.kvs, b.kvs);
    copy.close().await;
    store.close().await;
}

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
    // The write-ahead log holds the same values (Secrets too).
    let wal = dir.path().join("data/store.redb.wal");
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&wal), 0o600);
    assert_eq!(mode(&dir.path().join("data")), 0o700);
    store.close().await;
    // A clean close removes the log; one left by a crash (or an older build) may be looser.
    assert!(!wal.exists());
    std::fs::write(&wal, b"").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = RedbStore::open(&file).unwrap();
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&wal), 0o600);
    assert_eq!(
        store.get("/k").await.unwrap().map(|kv| kv.value),
        Some(Bytes::from_static(b"v"))
    );
}
