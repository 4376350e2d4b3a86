//! etcd (a real single-member etcd on loopback, started here) against redb, in the same run:
//! writes/s (sequential and 64 concurrent creates), list latency (range of N keys) and watch
//! fan-out (W watchers each receiving E events). Prints one line per figure and the ratios.
//!
//! `cargo bench -p ferry-store --bench etcd_vs_redb`. `FERRY_BENCH_KEYS` (default 2000),
//! `FERRY_BENCH_WATCHERS` (default 100), `FERRY_BENCH_EVENTS` (default 200).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_store::etcd_store::testing::EtcdCluster;
use ferry_store::{RangeOptions, RedbStore, Store};
use futures::StreamExt;

const VALUE_SIZE: usize = 2048;
const CONCURRENCY: usize = 64;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Clone, Copy)]
struct Figures {
    seq_writes_per_s: f64,
    conc_writes_per_s: f64,
    list_ms: f64,
    fanout_events_per_s: f64,
}

async fn measure(store: Arc<dyn Store>, keys: usize, watchers: usize, events: usize) -> Figures {
    let value = Bytes::from(vec![b'x'; VALUE_SIZE]);
    // Sequential creates.
    let n_seq = (keys / 4).max(100);
    let t = Instant::now();
    for i in 0..n_seq {
        store
            .create(&format!("/registry/seq/{i:06}"), value.clone())
            .await
            .unwrap();
    }
    let seq = n_seq as f64 / t.elapsed().as_secs_f64();
    // Concurrent creates: `keys` objects, 64 writers.
    let t = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..CONCURRENCY {
        let store = store.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while i < keys {
                store
                    .create(&format!("/registry/list/{i:06}"), value.clone())
                    .await
                    .unwrap();
                i += CONCURRENCY;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let conc = keys as f64 / t.elapsed().as_secs_f64();
    // List latency: median of 10 full ranges.
    let mut lat = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        let r = store
            .range("/registry/list/", RangeOptions::default())
            .await
            .unwrap();
        assert_eq!(r.kvs.len(), keys);
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    let list_ms = lat[lat.len() / 2];
    // Watch fan-out: `watchers` live watches, `events` writes, until every watcher has all.
    let from = store.current_revision().await.unwrap();
    let mut handles = Vec::new();
    for _ in 0..watchers {
        let mut w = store.watch("/registry/fan/", from).await.unwrap();
        handles.push(tokio::spawn(async move {
            let mut got = 0;
            while got < events {
                match tokio::time::timeout(Duration::from_secs(60), w.next()).await {
                    Ok(Some(Ok(_))) => got += 1,
                    other => panic!("watch: {other:?}"),
                }
            }
        }));
    }
    let t = Instant::now();
    let small = Bytes::from_static(b"v");
    for i in 0..events {
        store
            .create(&format!("/registry/fan/{i:06}"), small.clone())
            .await
            .unwrap();
    }
    for h in handles {
        h.await.unwrap();
    }
    let fanout = (watchers * events) as f64 / t.elapsed().as_secs_f64();
    Figures {
        seq_writes_per_s: seq,
        conc_writes_per_s: conc,
        list_ms,
        fanout_events_per_s: fanout,
    }
}

fn main() {
    let keys = env_usize("FERRY_BENCH_KEYS", 2000);
    let watchers = env_usize("FERRY_BENCH_WATCHERS", 100);
    let events = env_usize("FERRY_BENCH_EVENTS", 200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let redb: Arc<dyn Store> =
            Arc::new(RedbStore::open(&dir.path().join("store.redb")).unwrap());
        let r = measure(redb, keys, watchers, events).await;
        let etcd = EtcdCluster::start(&dir.path().join("etcd"), 1)
            .await
            .unwrap();
        let store: Arc<dyn Store> = Arc::new(etcd.store("/registry").unwrap());
        let e = measure(store, keys, watchers, events).await;
        println!(
            "keys={keys} value={VALUE_SIZE}B watchers={watchers} events={events}\n\
             figure                      redb        etcd   etcd/redb\n\
             sequential creates/s  {:>10.0}  {:>10.0}  {:>9.2}\n\
             64-way creates/s      {:>10.0}  {:>10.0}  {:>9.2}\n\
             list {keys} keys (ms)   {:>10.2}  {:>10.2}  {:>9.2}\n\
             watch fan-out ev/s    {:>10.0}  {:>10.0}  {:>9.2}",
            r.seq_writes_per_s,
            e.seq_writes_per_s,
            e.seq_writes_per_s / r.seq_writes_per_s,
            r.conc_writes_per_s,
            e.conc_writes_per_s,
            e.conc_writes_per_s / r.conc_writes_per_s,
            r.list_ms,
            e.list_ms,
            e.list_ms / r.list_ms,
            r.fanout_events_per_s,
            e.fanout_events_per_s,
            e.fanout_events_per_s / r.fanout_events_per_s,
        );
    });
}
