//! The verdict log read back from the kernel: every pod chain ends in a counted deny rule
//! (`comment "deny ingress NS/POD"`) and every policy rule's accept is counted
//! (`comment "allow NS/POLICY ingress[K]"`). Denied first packets are also sent, rate-limited,
//! to an nflog group (readable with any NFLOG listener, e.g. ulogd or tcpdump -i nflog:100).
//! Counters live in the rules: a pod chain rewritten because its set of policies changed
//! starts counting from zero again (peer and port changes are set elements and keep them).

use std::fmt::Write as _;

/// One counted rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterRow {
    /// `deny` or `allow`.
    pub verdict: String,
    /// For `deny`: `ingress`/`egress` and the pod; for `allow`: the policy and its rule.
    pub subject: String,
    pub direction: String,
    pub packets: u64,
    pub bytes: u64,
}

/// Counted rules of `nft -j list table inet ferry-netpol` output.
pub fn counters(json: &serde_json::Value) -> Vec<CounterRow> {
    let mut out = Vec::new();
    for item in json
        .get("nftables")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
    {
        let Some(rule) = item.get("rule") else {
            continue;
        };
        let Some(comment) = rule.get("comment").and_then(|c| c.as_str()) else {
            continue;
        };
        let Some(counter) = rule
            .get("expr")
            .and_then(|e| e.as_array())
            .and_then(|e| e.iter().find_map(|x| x.get("counter")))
        else {
            continue;
        };
        let n = |k: &str| counter.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        let words: Vec<&str> = comment.split_whitespace().collect();
        let row = match words.as_slice() {
            ["deny", dir, pod] => CounterRow {
                verdict: "deny".into(),
                subject: pod.to_string(),
                direction: dir.to_string(),
                packets: n("packets"),
                bytes: n("bytes"),
            },
            ["allow", policy, rule] => CounterRow {
                verdict: "allow".into(),
                subject: format!("{policy} {rule}"),
                direction: rule.split('[').next().unwrap_or("").to_string(),
                packets: n("packets"),
                bytes: n("bytes"),
            },
            _ => continue,
        };
        out.push(row);
    }
    // One row per subject (a rule has one counted accept per address family).
    out.sort_by(|a, b| {
        (&a.verdict, &a.subject, &a.direction).cmp(&(&b.verdict, &b.subject, &b.direction))
    });
    let mut merged: Vec<CounterRow> = Vec::new();
    for r in out {
        match merged.last_mut() {
            Some(m)
                if m.verdict == r.verdict
                    && m.subject == r.subject
                    && m.direction == r.direction =>
            {
                m.packets += r.packets;
                m.bytes += r.bytes;
            }
            _ => merged.push(r),
        }
    }
    merged
}

/// A table for people; allowed counters only when asked for, zero rows left out.
pub fn format(rows: &[CounterRow], allowed: bool) -> String {
    let mut out = String::from("VERDICT\tDIRECTION\tSUBJECT\tPACKETS\tBYTES\n");
    for r in rows {
        if (r.verdict == "allow" && !allowed) || r.packets == 0 {
            continue;
        }
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}",
            r.verdict, r.direction, r.subject, r.packets, r.bytes
        );
    }
    out
}

/// The same as Prometheus counters (OpenMetrics text; the names and labels of the node
/// enforcement's `/metrics`).
pub fn prometheus(rows: &[CounterRow], node: &str) -> String {
    crate::metrics::verdicts_text(node, rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_counted_rules() {
        let j = json!({"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"rule": {"chain": "i_x_b", "comment": "deny ingress x/b", "expr": [{"counter": {"packets": 3, "bytes": 180}}, {"reject": null}]}},
            {"rule": {"chain": "r_x_p_i0", "comment": "allow x/p ingress[0]", "expr": [{"match": {}}, {"counter": {"packets": 7, "bytes": 420}}, {"accept": null}]}},
            {"rule": {"chain": "pods_ingress", "expr": [{"accept": null}]}},
            {"rule": {"chain": "e_x_a", "comment": "deny egress x/a", "expr": [{"counter": {"packets": 0, "bytes": 0}}, {"drop": null}]}}
        ]});
        let rows = counters(&j);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].subject, "x/p ingress[0]");
        assert_eq!(rows[0].direction, "ingress");
        let t = format(&rows, false);
        assert!(t.contains("deny\tingress\tx/b\t3\t180"), "{t}");
        assert!(!t.contains("x/a") && !t.contains("allow"), "{t}");
        assert!(format(&rows, true).contains("allow\tingress\tx/p ingress[0]\t7\t420"));
        let p = prometheus(&rows, "n1");
        assert!(
            p.contains(
                "ferry_netpol_denied_packets_total{node=\"n1\",direction=\"ingress\",pod=\"x/b\"} 3"
            ),
            "{p}"
        );
        assert!(
            p.contains("ferry_netpol_allowed_packets_total{node=\"n1\",direction=\"ingress\",policy=\"x/p\",rule=\"ingress[0]\"} 7"),
            "{p}"
        );
    }
}
