//! Reachability matrices, printed as upstream's e2e truth tables: rows are sources, columns
//! destinations, `.` connected and `X` blocked.

use crate::model::{Model, PodKey, Proto};
use crate::verdict::{Conn, Endpoint, evaluate};

/// Allowed or not for every (source, destination) pair, in the order of `pods`.
pub fn matrix(model: &Model, pods: &[PodKey], proto: Proto, port: u16) -> Vec<Vec<bool>> {
    pods.iter()
        .map(|from| {
            pods.iter()
                .map(|to| {
                    evaluate(
                        model,
                        &Conn {
                            src: Endpoint::pod(from.clone()),
                            dst: Endpoint::pod(to.clone()),
                            proto,
                            port,
                        },
                    )
                    .allowed
                })
                .collect()
        })
        .collect()
}

/// The truth table as text (header: the port, then the destinations).
pub fn format(pods: &[PodKey], grid: &[Vec<bool>], proto: Proto, port: u16) -> String {
    let names: Vec<String> = pods.iter().map(|p| p.to_string()).collect();
    let w = names
        .iter()
        .map(|n| n.len())
        .max()
        .unwrap_or(1)
        .max(format!("{port}/{proto}").len());
    let mut out = format!("{:<w$}", format!("{port}/{proto}"));
    for n in &names {
        out.push('\t');
        out.push_str(n);
    }
    out.push('\n');
    for (i, row) in grid.iter().enumerate() {
        out.push_str(&format!(
            "{:<w$}",
            names.get(i).map(String::as_str).unwrap_or("?")
        ));
        for cell in row {
            out.push('\t');
            out.push_str(if *cell { "." } else { "X" });
        }
        out.push('\n');
    }
    out
}

/// Upstream's e2e style expectation: every pair allowed, then `deny` pairs blocked.
pub fn expect_all_but(pods: &[PodKey], deny: impl Fn(&PodKey, &PodKey) -> bool) -> Vec<Vec<bool>> {
    pods.iter()
        .map(|f| pods.iter().map(|t| !deny(f, t)).collect())
        .collect()
}
