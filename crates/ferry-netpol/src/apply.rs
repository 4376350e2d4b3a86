//! Applies rendered tables to a network namespace with `nft -f -` batches (atomic: a batch
//! is one transaction), remembering what the kernel holds so that the next sync sends only
//! the difference. After a failed batch the next sync replaces the whole table. Also reads
//! the table's counters back (the verdict log).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::render::TABLE;
use crate::ruleset::{DiffStats, Ruleset, diff};

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("running nft: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("nft refused the batch: {0}")]
    Nft(String),
    #[error("nft printed JSON that could not be read: {0}")]
    Json(String),
}

/// Where `nft` runs: this process's network namespace, or the one at `netns` (e.g.
/// `/run/netns/NAME` or `/proc/PID/ns/net`), entered with `nsenter`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    pub netns: Option<PathBuf>,
}

impl Target {
    fn command(&self, args: &[&str]) -> Command {
        match &self.netns {
            Some(path) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", path.display()))
                    .arg("nft")
                    .args(args);
                c
            }
            None => {
                let mut c = Command::new("nft");
                c.args(args);
                c
            }
        }
    }

    /// Runs one batch.
    pub fn run_batch(&self, script: &str) -> Result<(), ApplyError> {
        let mut child = self
            .command(&["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(ApplyError::Nft(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ))
        }
    }

    /// `nft -j list table inet ferry-netpol` (None when the table does not exist).
    pub fn list_json(&self) -> Result<Option<serde_json::Value>, ApplyError> {
        let out = self
            .command(&["-j", "list", "table", "inet", TABLE])
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("No such file") {
                return Ok(None);
            }
            return Err(ApplyError::Nft(err.trim().to_string()));
        }
        serde_json::from_slice(&out.stdout)
            .map(Some)
            .map_err(|e| ApplyError::Json(e.to_string()))
    }
}

/// Keeps Ferry's table in one namespace in line with the rendered one.
#[derive(Debug, Default)]
pub struct Applier {
    pub target: Target,
    applied: Option<Ruleset>,
    /// Batches sent and failed (for health and metrics).
    pub batches: u64,
    pub failures: u64,
}

impl Applier {
    pub fn new(target: Target) -> Applier {
        Applier {
            target,
            ..Default::default()
        }
    }

    /// Sends the difference to `desired` (the whole table on the first call and after a
    /// failure). Returns what changed; an unchanged table sends nothing.
    pub fn apply(&mut self, desired: &Ruleset) -> Result<DiffStats, ApplyError> {
        let (script, stats) = diff(self.applied.as_ref(), desired);
        if script.is_empty() {
            return Ok(stats);
        }
        self.batches += 1;
        match self.target.run_batch(&script) {
            Ok(()) => {
                self.applied = Some(desired.clone());
                Ok(stats)
            }
            Err(e) => {
                self.failures += 1;
                self.applied = None;
                Err(e)
            }
        }
    }

    /// Forgets what was applied: the next sync replaces the whole table.
    pub fn resync(&mut self) {
        self.applied = None;
    }

    /// Removes Ferry's table (nothing else is touched).
    pub fn remove(&mut self) -> Result<(), ApplyError> {
        self.applied = None;
        self.target.run_batch(&format!(
            "add table inet {TABLE}\ndelete table inet {TABLE}\n"
        ))
    }
}
