//! Throughput of the redb backend: creates (sequential and 64 concurrent), get, range of 10k
//! keys, and live watch fan-out to 1000 watchers.
//!
//! `cargo bench -p ferry-store --bench store`. `FERRY_BENCH_KEYS` changes the key count
//! (default 10000), `FERRY_BENCH_EVENTS` the events per watcher (default 200).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use ferry_store::{RangeOptions, RedbStore, Store};
use futures::StreamExt;

const VALUE_SIZE: usize = 2048;
const CONCURRENCY: usize = 64;
const WATCHERS: usize = 1000;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn value() -> Bytes {
    Bytes::from(vec![b'x'; VALUE_SIZE])
}

fn fresh() -> (Arc<RedbStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    (Arc::new(RedbStore::open(dir.path()).unwrap()), dir)
}

async fn fill(store: &Arc<RedbStore>, keys: usize, concurrency: usize) {
    create_range(store, 0, keys, concurrency).await;
}

/// Creates `count` keys numbered from `first` with `concurrency` tasks.
async fn create_range(store: &Arc<RedbStore>, first: usize, count: usize, concurrency: usize) {
    let per = count.div_ceil(concurrency);
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let v = value();
                for i in (first + t * per)..(first + ((t + 1) * per).min(count)) {
                    store
                        .create(&format!("/registry/pods/default/pod-{i:08}"), v.clone())
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

fn creates(c: &mut Criterion) {
    let keys = env_usize("FERRY_BENCH_KEYS", 10_000);
    let rt = runtime();
    let mut g = c.benchmark_group("create");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(5));
    // Sequential creates wait for one fsync each: an iteration is a tenth of the keys, so the
    // ten samples together create them all (into one growing store).
    let chunk = (keys / 10).max(1);
    g.throughput(Throughput::Elements(chunk as u64));
    g.bench_function(format!("sequential/{keys}"), |b| {
        let (store, _dir) = fresh();
        let mut next = 0;
        b.to_async(&rt).iter_custom(|iters| {
            let store = store.clone();
            let first = next;
            next += iters as usize * chunk;
            async move {
                let start = Instant::now();
                for i in 0..iters as usize {
                    create_range(&store, first + i * chunk, chunk, 1).await;
                }
                start.elapsed()
            }
        })
    });
    g.throughput(Throughput::Elements(keys as u64));
    g.bench_function(format!("concurrent_{CONCURRENCY}/{keys}"), |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (store, dir) = fresh();
                let start = Instant::now();
                create_range(&store, 0, keys, CONCURRENCY).await;
                total += start.elapsed();
                drop(store);
                drop(dir);
            }
            total
        })
    });
    g.finish();
}

fn reads(c: &mut Criterion) {
    let keys = env_usize("FERRY_BENCH_KEYS", 10_000);
    let rt = runtime();
    let (store, _dir) = fresh();
    rt.block_on(fill(&store, keys, CONCURRENCY));
    let mut g = c.benchmark_group("read");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(1));
    let names: Vec<String> = (0..keys)
        .map(|i| format!("/registry/pods/default/pod-{i:08}"))
        .collect();
    g.bench_function("get", |b| {
        let mut i = 0usize;
        b.to_async(&rt).iter(|| {
            i = (i + 7919) % names.len();
            let (store, key) = (store.clone(), &names[i]);
            async move { store.get(key).await.unwrap().unwrap() }
        })
    });
    g.throughput(Throughput::Elements(keys as u64));
    g.bench_function(format!("range/{keys}"), |b| {
        b.to_async(&rt).iter(|| {
            let store = store.clone();
            async move {
                let r = store
                    .range("/registry/pods/", RangeOptions::default())
                    .await
                    .unwrap();
                assert_eq!(r.kvs.len(), keys);
            }
        })
    });
    g.finish();
}

fn watch_fanout(c: &mut Criterion) {
    let events = env_usize("FERRY_BENCH_EVENTS", 200);
    let rt = runtime();
    let mut g = c.benchmark_group("watch_fanout");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Elements((WATCHERS * events) as u64));
    g.bench_function(format!("{WATCHERS}_watchers_x_{events}_events"), |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (store, dir) = fresh();
                let from = store.current_revision().await.unwrap();
                let mut watchers = Vec::with_capacity(WATCHERS);
                for _ in 0..WATCHERS {
                    let mut w = store.watch("/registry/pods/", from).await.unwrap();
                    watchers.push(tokio::spawn(async move {
                        for _ in 0..events {
                            w.next().await.unwrap().unwrap();
                        }
                    }));
                }
                // Measured: writing the events and every watcher receiving all of them.
                let start = Instant::now();
                fill(&store, events, CONCURRENCY.min(events)).await;
                for w in watchers {
                    w.await.unwrap();
                }
                total += start.elapsed();
                drop(store);
                drop(dir);
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, creates, reads, watch_fanout);
criterion_main!(benches);
