//! Durable creates on the redb store, side by side in one run: the floor (a write + fdatasync of
//! a record of the same size into a zero-filled file, one writer, same directory), the store committing every batch
//! durably to redb (`write_ahead_log: false`, the old path), and the store with its write-ahead
//! log (the default). Sequential (one writer awaiting each create) and `FERRY_BENCH_CLIENTS`
//! (default 8) concurrent writers. Prints creates/s, p50/p99 and the ratios.
//!
//! `cargo bench -p ferry-store --bench durable_writes`. `FERRY_BENCH_SECS` (default 2) per
//! figure, `FERRY_BENCH_ROUNDS` (default 3; the figures are measured in turns, medians printed), `FERRY_BENCH_DIR` (default the temp dir) for the disk to measure.
#![allow(clippy::unwrap_used)]

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_store::{RedbOptions, RedbStore, Store};

/// About a stored ConfigMap.
const VALUE_SIZE: usize = 420;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Clone, Copy)]
struct Figure {
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
}

fn figure(count: usize, elapsed: Duration, mut lat: Vec<Duration>) -> Figure {
    lat.sort();
    let at = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Figure {
        per_s: count as f64 / elapsed.as_secs_f64(),
        p50_us: at(0.5),
        p99_us: at(0.99),
    }
}

fn floor(dir: &std::path::Path, secs: u64) -> Figure {
    let path = dir.join("floor.dat");
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .unwrap();
    let record = vec![b'x'; VALUE_SIZE + 64];
    // Zero-filled ahead (as the log is), so that a sync carries no size change.
    f.write_all(&vec![0u8; 64 << 20]).unwrap();
    f.sync_all().unwrap();
    let mut lat = Vec::new();
    let mut offset = 0u64;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        let t = Instant::now();
        f.write_all_at(&record, offset % (64 << 20)).unwrap();
        f.sync_data().unwrap();
        offset += record.len() as u64;
        lat.push(t.elapsed());
    }
    let n = lat.len();
    let elapsed = start.elapsed();
    std::fs::remove_file(&path).unwrap();
    figure(n, elapsed, lat)
}

async fn creates(store: Arc<RedbStore>, clients: usize, secs: u64) -> Figure {
    let value = Bytes::from(vec![b'v'; VALUE_SIZE]);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (store, value) = (store.clone(), value.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let key = format!("/registry/configmaps/default/c{clients}-{c}-{i}");
                    let t = Instant::now();
                    store.create(&key, value.clone()).await.unwrap();
                    lat.push(t.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    figure(lat.len(), elapsed, lat)
}

/// The figure with the median rate.
fn median(mut figures: Vec<Figure>) -> Figure {
    figures.sort_by(|a, b| a.per_s.total_cmp(&b.per_s));
    figures[figures.len() / 2]
}

fn print(name: &str, f: Figure) {
    println!(
        "{name:<40} {:>9.0}/s  p50 {:>7.0} us  p99 {:>7.0} us",
        f.per_s, f.p50_us, f.p99_us
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let secs = env_u64("FERRY_BENCH_SECS", 2);
    let clients = env_u64("FERRY_BENCH_CLIENTS", 8) as usize;
    let base = std::env::var("FERRY_BENCH_DIR").map_or_else(|_| std::env::temp_dir(), Into::into);
    let dir = tempfile::tempdir_in(base).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The disk is shared and its latency drifts: the three are measured in turns, `rounds`
    // times, and each figure is the median of its rounds.
    let rounds = env_u64("FERRY_BENCH_ROUNDS", 3) as usize;
    let modes = [
        ("redb durable commits", false),
        ("redb + write-ahead log", true),
    ];
    let mut floors = Vec::new();
    let mut runs: Vec<(Vec<Figure>, Vec<Figure>)> = vec![(Vec::new(), Vec::new()); modes.len()];
    for round in 0..rounds {
        let fl = floor(dir.path(), secs);
        print(&format!("[{round}] fdatasync floor (1 writer)"), fl);
        floors.push(fl);
        for (m, (name, wal)) in modes.iter().enumerate() {
            let path = dir.path().join(format!("{wal}-{round}.redb"));
            let options = RedbOptions {
                write_ahead_log: *wal,
                ..Default::default()
            };
            let store = Arc::new(RedbStore::open_with(&path, options).unwrap());
            let seq = rt.block_on(creates(store.clone(), 1, secs));
            print(&format!("[{round}] {name}, sequential"), seq);
            let conc = rt.block_on(creates(store.clone(), clients, secs));
            print(&format!("[{round}] {name}, {clients} writers"), conc);
            rt.block_on(Arc::into_inner(store).unwrap().close());
            runs[m].0.push(seq);
            runs[m].1.push(conc);
        }
    }
    println!("medians of {rounds} rounds:");
    let fl = median(floors);
    print("fdatasync floor (1 writer)", fl);
    let mut rows = Vec::new();
    for ((name, _), (seq, conc)) in modes.iter().zip(runs) {
        let (seq, conc) = (median(seq), median(conc));
        print(&format!("{name}, sequential"), seq);
        print(&format!("{name}, {clients} writers"), conc);
        rows.push((*name, seq, conc));
    }
    println!("ratios (same run):");
    for (name, seq, conc) in &rows {
        println!(
            "  {name:<28} sequential / floor {:>5.2}x   {clients} writers / floor {:>5.2}x",
            seq.per_s / fl.per_s,
            conc.per_s / fl.per_s
        );
    }
    if let [(_, old_seq, old_conc), (_, new_seq, new_conc)] = rows[..] {
        println!(
            "  write-ahead log / durable commits: sequential {:.2}x, {clients} writers {:.2}x",
            new_seq.per_s / old_seq.per_s,
            new_conc.per_s / old_conc.per_s
        );
    }
}
