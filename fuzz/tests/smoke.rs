//! A short, bounded run of every fuzz target without libFuzzer: the seed corpus, then random
//! mutations of it (byte flips, insertions, deletions, splices) from a fixed seed, for
//! `FERRY_FUZZ_SMOKE_SECS` seconds per target (default 5) or `FERRY_FUZZ_SMOKE_RUNS` inputs
//! (default 200,000), whichever comes first. A panic is a finding: the input is printed.

use std::path::Path;
use std::time::{Duration, Instant};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Interesting bytes for text formats.
const DICT: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"-",
    b"/",
    b"~1",
    b"~0",
    b"op",
    b"add",
    b"copy",
    b"move",
    b"from",
    b"path",
    b"$patch",
    b"delete",
    b"replace",
    b"$retainKeys",
    b"$setElementOrder/",
    b"containers",
    b"name",
    b"&a",
    b"*a",
    b"<<",
    b"- ",
    b"\n",
    b"!=",
    b"==",
    b" in (",
    b" notin (",
    b")",
    b"!",
    b"=",
    b"\\",
    b"\xc0\x0c",
    b"\0\0",
    b"\xff",
];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], cur: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !cur.is_empty() => {
                let i = rng.below(cur.len());
                cur[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(cur.len() + 1);
                cur.insert(i, rng.next() as u8);
            }
            2 if !cur.is_empty() => {
                let i = rng.below(cur.len());
                let n = 1 + rng.below(8.min(cur.len() - i));
                cur.drain(i..i + n);
            }
            3 => {
                let i = rng.below(cur.len() + 1);
                let d = DICT[rng.below(DICT.len())];
                cur.splice(i..i, d.iter().copied());
            }
            4 if !seeds.is_empty() => {
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let a = rng.below(other.len());
                    let b = a + rng.below(other.len() - a + 1);
                    let i = rng.below(cur.len() + 1);
                    cur.splice(i..i, other[a..b].iter().copied());
                }
            }
            _ => {
                if !cur.is_empty() {
                    let i = rng.below(cur.len());
                    let j = rng.below(cur.len());
                    cur.swap(i, j);
                }
            }
        }
    }
    cur.truncate(1 << 16);
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| std::fs::read(e.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    if out.is_empty() {
        out.push(Vec::new());
    }
    out
}

#[test]
fn every_target_survives_a_short_run() {
    let secs: u64 = std::env::var("FERRY_FUZZ_SMOKE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let max_runs: u64 = std::env::var("FERRY_FUZZ_SMOKE_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    for (name, target) in ferry_fuzz::TARGETS {
        let seeds = seeds(name);
        for s in &seeds {
            target(s);
        }
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ name.len() as u64);
        let start = Instant::now();
        let mut runs = 0u64;
        while start.elapsed() < Duration::from_secs(secs) && runs < max_runs {
            let mut input = seeds[rng.below(seeds.len())].clone();
            mutate(&mut rng, &seeds, &mut input);
            let r = std::panic::catch_unwind(|| target(&input));
            if r.is_err() {
                panic!(
                    "{name}: finding on input {:?}",
                    String::from_utf8_lossy(&input)
                );
            }
            runs += 1;
        }
        eprintln!("{name}: {} seeds, {runs} mutated inputs", seeds.len());
    }
}
