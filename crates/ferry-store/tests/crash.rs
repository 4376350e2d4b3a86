//! Crash test: a child process writes keys (16 concurrent writers: creates, updates, deletes)
//! and prints every acknowledged write; it is killed with SIGKILL mid-stream, and every
//! acknowledged write must be in the reopened store, with a gap-free history. Rounds run with
//! the write-ahead log (default checkpoints, and checkpoints every few KiB so that the log
//! starts over many times before the kill) and without it.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};

use ferry_store::{Event, RangeOptions, RedbOptions, RedbStore, Store};
use futures::StreamExt;

/// Set in the child: the database file to write to, and the round (part of every key).
const ENV_FILE: &str = "FERRY_STORE_CRASH_WRITER_FILE";
const ENV_ROUND: &str = "FERRY_STORE_CRASH_WRITER_ROUND";
/// Set in the child: `wal`, `wal-small` (checkpoints every 16 KiB) or `no-wal`.
const ENV_MODE: &str = "FERRY_STORE_CRASH_WRITER_MODE";
const WRITERS: usize = 16;

/// The child's body; a no-op unless started by `acknowledged_writes_survive_kill_9`.
#[test]
fn crash_writer_child() {
    let (Ok(file), Ok(round)) = (std::env::var(ENV_FILE), std::env::var(ENV_ROUND)) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mode = std::env::var(ENV_MODE).unwrap_or_default();
        let options = RedbOptions {
            write_ahead_log: mode != "no-wal",
            checkpoint_bytes: if mode == "wal-small" {
                16 << 10
            } else {
                8 << 20
            },
            ..Default::default()
        };
        let store = Arc::new(RedbStore::open_with(Path::new(&file), options).unwrap());
        let value = Bytes::from(vec![b'v'; 1024]);
        let tasks: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (store, value, round) = (store.clone(), value.clone(), round.clone());
                tokio::spawn(async move {
                    // One write per line, flushed: the parent only counts complete lines.
                    let ack = |op: &str, key: &str, rev: i64| {
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "ACK {op} {key} {rev} END").unwrap();
                        out.flush().unwrap();
                    };
                    for i in 0u64.. {
                        let key = format!("/crash/{round}/{w:02}/{i:08}");
                        let mut kv = store.create(&key, value.clone()).await.unwrap();
                        ack("put", &key, kv.mod_revision);
                        if i % 3 == 1 {
                            kv = store
                                .update(&key, Bytes::from(format!("u{i}")), kv.mod_revision)
                                .await
                                .unwrap();
                            ack("put", &key, kv.mod_revision);
                        }
                        if i % 5 == 2 {
                            let (_, rev) = store.delete(&key, Some(kv.mod_revision)).await.unwrap();
                            ack("del", &key, rev);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// One acknowledged write: `put` or `del`, the key, the revision.
type Ack = (String, String, i64);

/// Runs one writer child, kills it after `kill_after` acknowledgements, returns every
/// acknowledged write in the order acknowledged.
fn run_child(file: &Path, round: usize, mode: &str, kill_after: usize) -> Vec<Ack> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "crash_writer_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_FILE, file)
        .env(ENV_ROUND, round.to_string())
        .env(ENV_MODE, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let started = Instant::now();
    let mut acked = Vec::new();
    let mut killed = false;
    // Keep reading after the kill: lines already in the pipe were acknowledged too.
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let parts: Vec<&str> = line.split(' ').collect();
        if let ["ACK", op, key, rev, "END"] = parts[..] {
            acked.push((op.to_owned(), key.to_owned(), rev.parse().unwrap()));
        }
        if !killed && (acked.len() >= kill_after || started.elapsed() > Duration::from_secs(60)) {
            child.kill().unwrap(); // SIGKILL
            killed = true;
        }
    }
    let status = child.wait().unwrap();
    assert!(killed, "writer exited on its own: {status:?}");
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    if std::env::var(ENV_FILE).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("crash.redb");
    let mut last_revision = 0;
    let rounds = [
        (0usize, "wal", 700usize),
        (1, "wal-small", 1500),
        (2, "no-wal", 400),
        (3, "wal", 1500),
    ];
    for (round, mode, kill_after) in rounds {
        let acked = tokio::task::block_in_place(|| run_child(&file, round, mode, kill_after));
        assert!(
            acked.len() >= kill_after.min(100),
            "round {round}: only {} acks",
            acked.len()
        );
        let store = RedbStore::open(&file).unwrap();
        let current = store.current_revision().await.unwrap();
        // The last acknowledged write of each key. Each writer works on one key at a time, so
        // only its last key may have had a later, unacknowledged write (applied or not).
        let mut last: BTreeMap<&str, (&str, i64)> = BTreeMap::new();
        let mut newest_of_writer: BTreeMap<&str, &str> = BTreeMap::new();
        for (op, key, rev) in &acked {
            assert!(*rev > last_revision && *rev <= current, "{key} at {rev}");
            last.insert(key, (op, *rev));
            let writer = &key[..key.rfind('/').unwrap()];
            newest_of_writer.insert(writer, key);
        }
        let in_flight: BTreeSet<&str> = newest_of_writer.values().copied().collect();
        for (key, (op, rev)) in &last {
            let kv = store.get(key).await.unwrap();
            match (*op, kv) {
                ("put", Some(kv)) if kv.mod_revision == *rev => {}
                ("del", None) => {}
                (_, other) if in_flight.contains(key) => {
                    // A later write of this key may have been applied without its ack.
                    if let Some(kv) = other {
                        assert!(kv.mod_revision >= *rev, "round {round}: {key} went back");
                    }
                }
                (op, other) => {
                    panic!("round {round}: acknowledged {op} of {key} at {rev} lost: {other:?}")
                }
            }
        }
        // The history is complete: a watch from the last round's end replays every revision
        // up to the recovered one once, in order, and matches the acknowledged writes.
        let mut w = store.watch("/", last_revision).await.unwrap();
        let mut history = BTreeMap::new();
        for expected in (last_revision + 1)..=current {
            let event = w.next().await.unwrap().unwrap();
            assert_eq!(
                event.revision(),
                expected,
                "round {round}: gap in the history"
            );
            history.insert(expected, event);
        }
        drop(w);
        for (op, key, rev) in &acked {
            match &history[rev] {
                Event::Put { kv, .. } => assert!(op == "put" && kv.key == *key),
                Event::Delete { prev, .. } => assert!(op == "del" && prev.key == *key),
            }
        }
        // Everything stored (acknowledged or not) has distinct revisions, and writing goes on
        // from the recovered revision.
        let all = store
            .range(&format!("/crash/{round}/"), RangeOptions::default())
            .await
            .unwrap();
        let live = last.values().filter(|(op, _)| *op == "put").count();
        assert!(all.kvs.len() + in_flight.len() >= live);
        let next = store
            .create(&format!("/after/{round}"), Bytes::new())
            .await
            .unwrap();
        assert_eq!(next.mod_revision, current + 1);
        last_revision = next.mod_revision;
        store.close().await;
        eprintln!(
            "round {round} ({mode}): {} acknowledged, {} stored, revision {current}",
            acked.len(),
            all.kvs.len()
        );
    }
}
