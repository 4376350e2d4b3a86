//! Crash test: a child process writes keys and prints every acknowledged write; it is killed
//! with SIGKILL mid-stream, and every acknowledged write must be in the reopened store.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_store::{RangeOptions, RedbStore, Store};

/// Set in the child: the database file to write to, and the round (part of every key).
const ENV_FILE: &str = "FERRY_STORE_CRASH_WRITER_FILE";
const ENV_ROUND: &str = "FERRY_STORE_CRASH_WRITER_ROUND";
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
        let store = Arc::new(RedbStore::open(Path::new(&file)).unwrap());
        let value = Bytes::from(vec![b'v'; 1024]);
        let tasks: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (store, value, round) = (store.clone(), value.clone(), round.clone());
                tokio::spawn(async move {
                    for i in 0u64.. {
                        let key = format!("/crash/{round}/{w:02}/{i:08}");
                        let kv = store.create(&key, value.clone()).await.unwrap();
                        // One write per line, flushed: the parent only counts complete lines.
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "ACK {key} {} END", kv.mod_revision).unwrap();
                        out.flush().unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// Runs one writer child, kills it after `kill_after` acknowledgements, returns every
/// acknowledged (key, revision).
fn run_child(file: &Path, round: usize, kill_after: usize) -> Vec<(String, i64)> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "crash_writer_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_FILE, file)
        .env(ENV_ROUND, round.to_string())
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
        if let ["ACK", key, rev, "END"] = parts[..] {
            acked.push((key.to_owned(), rev.parse().unwrap()));
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
    for (round, kill_after) in [(0usize, 700usize), (1, 1500)] {
        let acked = tokio::task::block_in_place(|| run_child(&file, round, kill_after));
        assert!(
            acked.len() >= kill_after.min(100),
            "round {round}: only {} acks",
            acked.len()
        );
        let store = RedbStore::open(&file).unwrap();
        let current = store.current_revision().await.unwrap();
        for (key, rev) in &acked {
            let kv = store.get(key).await.unwrap();
            let kv = kv.unwrap_or_else(|| panic!("round {round}: acknowledged {key} lost"));
            assert_eq!(kv.mod_revision, *rev, "{key}");
            assert!(*rev > last_revision && *rev <= current);
        }
        // Everything stored (acknowledged or not) has distinct revisions, and writing goes on
        // from the recovered revision.
        let all = store
            .range(&format!("/crash/{round}/"), RangeOptions::default())
            .await
            .unwrap();
        assert!(all.kvs.len() >= acked.len());
        let next = store
            .create(&format!("/after/{round}"), Bytes::new())
            .await
            .unwrap();
        assert_eq!(next.mod_revision, current + 1);
        last_revision = next.mod_revision;
        store.close().await;
        eprintln!(
            "round {round}: {} acknowledged, {} stored, revision {current}",
            acked.len(),
            all.kvs.len()
        );
    }
}
