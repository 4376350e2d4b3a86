//! Topology aware hints (seed 004 §9), no IO: endpoints are allotted to zones in proportion to
//! the allocatable CPU of the ready nodes in each zone. Hints are withheld (and the reason
//! reported) when a safeguard trips:
//! 1. fewer ready endpoints than zones;
//! 2. no allotment keeps every zone under the overload threshold (20%);
//! 3. a ready node lacks a zone label or allocatable CPU;
//! 4. an endpoint has no zone (it could not carry a hint for its own zone);
//! 5. an endpoint's zone has no ready nodes, or a zone would be left without endpoints.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, ForZone};

use super::desired::node_zone;

pub const HINTS_ANNOTATION: &str = "service.kubernetes.io/topology-aware-hints";
pub const MODE_ANNOTATION: &str = "service.kubernetes.io/topology-mode";
pub const OVERLOAD_THRESHOLD: f64 = 0.2;

/// Whether the Service asks for hints (`topology-mode: Auto`, else the older annotation `auto`).
pub fn hints_requested(svc: &Service) -> bool {
    let a = svc.metadata.annotations.as_ref();
    match a.and_then(|a| a.get(MODE_ANNOTATION)) {
        Some(m) => m.eq_ignore_ascii_case("auto"),
        None => a
            .and_then(|a| a.get(HINTS_ANNOTATION))
            .is_some_and(|v| v.eq_ignore_ascii_case("auto")),
    }
}

/// Why hints were withheld.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Withheld {
    NotEnoughEndpoints { endpoints: usize, zones: usize },
    OverloadThreshold,
    InsufficientNodeInfo,
    EndpointWithoutZone,
    ZoneMissing(String),
    NoZones,
}

impl Withheld {
    pub fn message(&self) -> String {
        match self {
            Withheld::NotEnoughEndpoints { endpoints, zones } => format!(
                "Insufficient number of endpoints ({endpoints}) for the number of zones ({zones})"
            ),
            Withheld::OverloadThreshold => "Unable to allocate minimum required endpoints to each zone without exceeding overload threshold".into(),
            Withheld::InsufficientNodeInfo => "Insufficient Node information: allocatable CPU or zone not specified on one or more nodes".into(),
            Withheld::EndpointWithoutZone => "One or more endpoints do not have a zone specified".into(),
            Withheld::ZoneMissing(z) => format!("Zone {z} has no ready nodes or would receive no endpoints"),
            Withheld::NoZones => "No zones with ready nodes".into(),
        }
    }
}

/// Allocatable CPU (millicores) of ready nodes per zone; `Err` when a ready node lacks a zone or
/// CPU.
pub fn zone_cpu(nodes: &[&Node]) -> Result<BTreeMap<String, u64>, Withheld> {
    let mut out = BTreeMap::new();
    for n in nodes {
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !ready {
            continue;
        }
        let zone = node_zone(n).ok_or(Withheld::InsufficientNodeInfo)?;
        let cpu = n
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("cpu"))
            .and_then(|q| parse_cpu_millis(&q.0))
            .filter(|c| *c > 0)
            .ok_or(Withheld::InsufficientNodeInfo)?;
        *out.entry(zone).or_insert(0) += cpu;
    }
    if out.is_empty() {
        return Err(Withheld::NoZones);
    }
    Ok(out)
}

/// Parses a CPU quantity (`2`, `1500m`, `0.5`) to millicores.
pub fn parse_cpu_millis(q: &str) -> Option<u64> {
    let q = q.trim();
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    let v: f64 = q.parse().ok()?;
    (v >= 0.0).then(|| (v * 1000.0).round() as u64)
}

/// Per-zone endpoint targets: proportional shares (largest remainder), each at least the
/// minimum that keeps the zone under the overload threshold.
pub fn allocate(
    n: usize,
    cpu: &BTreeMap<String, u64>,
) -> Result<BTreeMap<String, usize>, Withheld> {
    let zones = cpu.len();
    if zones == 0 {
        return Err(Withheld::NoZones);
    }
    if n < zones {
        return Err(Withheld::NotEnoughEndpoints {
            endpoints: n,
            zones,
        });
    }
    let total: u64 = cpu.values().sum();
    let mut min_total = 0usize;
    let mut out = BTreeMap::new();
    let mut rema: Vec<(f64, String)> = Vec::new();
    for (z, c) in cpu {
        let desired = *c as f64 / total as f64 * n as f64;
        let minimum = (desired / (1.0 + OVERLOAD_THRESHOLD)).ceil() as usize;
        min_total += minimum;
        if min_total > n {
            return Err(Withheld::OverloadThreshold);
        }
        let base = (desired.floor() as usize).max(minimum);
        out.insert(z.clone(), base);
        rema.push((desired - desired.floor(), z.clone()));
    }
    let mut assigned: usize = out.values().sum();
    rema.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut i = 0;
    while assigned < n && !rema.is_empty() {
        if let Some(v) = out.get_mut(&rema[i % rema.len()].1) {
            *v += 1;
        }
        assigned += 1;
        i += 1;
    }
    // Over-assigned by minimums: take back from the zones furthest above their share.
    while assigned > n {
        let Some((z, _)) = out
            .iter()
            .filter(|(z, v)| {
                let c = cpu.get(*z).copied().unwrap_or(0);
                let desired = c as f64 / total as f64 * n as f64;
                **v > (desired / (1.0 + OVERLOAD_THRESHOLD)).ceil() as usize
            })
            .max_by(|a, b| a.1.cmp(b.1))
            .map(|(z, v)| (z.clone(), *v))
        else {
            return Err(Withheld::OverloadThreshold);
        };
        if let Some(v) = out.get_mut(&z) {
            *v -= 1;
        }
        assigned -= 1;
    }
    Ok(out)
}

fn is_ready(e: &Endpoint) -> bool {
    e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false)
}

/// Sets `hints.forZones` on the ready endpoints (clears them on the others), or clears every
/// hint and says why. Endpoints first serve their own zone; surplus ones go to zones short of
/// their target.
pub fn assign_hints(
    endpoints: &mut [&mut Endpoint],
    cpu: Result<&BTreeMap<String, u64>, Withheld>,
) -> Result<BTreeMap<String, usize>, Withheld> {
    let result = (|| {
        let cpu = cpu?;
        let ready: Vec<usize> = (0..endpoints.len())
            .filter(|i| is_ready(endpoints[*i]))
            .collect();
        let targets = allocate(ready.len(), cpu)?;
        let mut by_zone: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for &i in &ready {
            let z = endpoints[i]
                .zone
                .clone()
                .filter(|z| !z.is_empty())
                .ok_or(Withheld::EndpointWithoutZone)?;
            if !cpu.contains_key(&z) {
                return Err(Withheld::ZoneMissing(z));
            }
            by_zone.entry(z).or_default().push(i);
        }
        let mut hint: Vec<Option<String>> = vec![None; endpoints.len()];
        let mut surplus: Vec<usize> = Vec::new();
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        for (z, idx) in &by_zone {
            let t = targets.get(z).copied().unwrap_or(0);
            for (k, &i) in idx.iter().enumerate() {
                if k < t {
                    hint[i] = Some(z.clone());
                    *count.entry(z.clone()).or_insert(0) += 1;
                } else {
                    surplus.push(i);
                }
            }
        }
        surplus.reverse();
        for (z, t) in &targets {
            let have = count.get(z).copied().unwrap_or(0);
            for _ in have..*t {
                let Some(i) = surplus.pop() else { break };
                hint[i] = Some(z.clone());
                *count.entry(z.clone()).or_insert(0) += 1;
            }
        }
        if let Some(z) = targets
            .keys()
            .find(|z| count.get(*z).copied().unwrap_or(0) == 0)
        {
            return Err(Withheld::ZoneMissing(z.clone()));
        }
        if hint
            .iter()
            .enumerate()
            .any(|(i, h)| h.is_none() && is_ready(endpoints[i]))
        {
            return Err(Withheld::OverloadThreshold);
        }
        Ok((hint, count))
    })();
    match result {
        Ok((hint, count)) => {
            for (e, h) in endpoints.iter_mut().zip(hint) {
                e.hints = h.map(|z| EndpointHints {
                    for_zones: Some(vec![ForZone { name: z }]),
                    ..Default::default()
                });
            }
            Ok(count)
        }
        Err(w) => {
            for e in endpoints.iter_mut() {
                e.hints = None;
            }
            Err(w)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, zone: Option<&str>, cpu: Option<&str>, ready: bool) -> Node {
        let mut labels = serde_json::Map::new();
        if let Some(z) = zone {
            labels.insert("topology.kubernetes.io/zone".into(), json!(z));
        }
        let mut alloc = serde_json::Map::new();
        if let Some(c) = cpu {
            alloc.insert("cpu".into(), json!(c));
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        }))
        .unwrap()
    }

    fn ep(zone: Option<&str>, ready: bool) -> Endpoint {
        serde_json::from_value(json!({
            "addresses": ["10.0.0.1"], "zone": zone, "conditions": {"ready": ready}
        }))
        .unwrap()
    }

    fn hinted(eps: &[Endpoint]) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for e in eps {
            if let Some(h) = &e.hints {
                *m.entry(h.for_zones.as_ref().unwrap()[0].name.clone())
                    .or_insert(0) += 1;
            }
        }
        m
    }

    fn run(nodes: &[Node], eps: &mut [Endpoint]) -> Result<BTreeMap<String, usize>, Withheld> {
        let refs: Vec<&Node> = nodes.iter().collect();
        let cpu = zone_cpu(&refs);
        let mut m: Vec<&mut Endpoint> = eps.iter_mut().collect();
        assign_hints(&mut m, cpu.as_ref().map_err(|e| e.clone()))
    }

    fn three_zones() -> Vec<Node> {
        vec![
            node("a1", Some("a"), Some("2"), true),
            node("b1", Some("b"), Some("1000m"), true),
            node("c1", Some("c"), Some("1"), true),
            node("c2", Some("c"), Some("8"), false), // not ready: ignored
        ]
    }

    #[test]
    fn two_one_one_gives_four_two_two() {
        // Endpoints spread unevenly: 2 in a, 3 in b, 3 in c -> a receives from b and c.
        let mut eps: Vec<Endpoint> = ["a", "a", "b", "b", "b", "c", "c", "c"]
            .iter()
            .map(|z| ep(Some(z), true))
            .collect();
        let got = run(&three_zones(), &mut eps).unwrap();
        let want: BTreeMap<String, usize> =
            [("a".into(), 4), ("b".into(), 2), ("c".into(), 2)].into();
        assert_eq!(got, want);
        assert_eq!(hinted(&eps), want);
        // Own zone first.
        assert_eq!(
            eps[0].hints.as_ref().unwrap().for_zones.as_ref().unwrap()[0].name,
            "a"
        );
    }

    #[test]
    fn safeguards() {
        // 1. too few endpoints
        let mut eps = vec![ep(Some("a"), true), ep(Some("b"), true)];
        assert!(matches!(
            run(&three_zones(), &mut eps),
            Err(Withheld::NotEnoughEndpoints { .. })
        ));
        assert!(eps.iter().all(|e| e.hints.is_none()));
        // 2. overload: zones 2:1, two endpoints.
        let nodes = vec![
            node("a", Some("a"), Some("2"), true),
            node("b", Some("b"), Some("1"), true),
        ];
        let mut eps = vec![ep(Some("a"), true), ep(Some("b"), true)];
        assert_eq!(run(&nodes, &mut eps), Err(Withheld::OverloadThreshold));
        // 3. node without zone / without cpu
        for bad in [
            node("x", None, Some("1"), true),
            node("x", Some("a"), None, true),
        ] {
            let mut nodes = three_zones();
            nodes.push(bad);
            let mut eps: Vec<Endpoint> = (0..8).map(|_| ep(Some("a"), true)).collect();
            assert_eq!(run(&nodes, &mut eps), Err(Withheld::InsufficientNodeInfo));
        }
        // 4. endpoint without zone
        let mut eps: Vec<Endpoint> = (0..7).map(|_| ep(Some("a"), true)).collect();
        eps.push(ep(None, true));
        assert_eq!(
            run(&three_zones(), &mut eps),
            Err(Withheld::EndpointWithoutZone)
        );
        // 5. endpoint in a zone without ready nodes
        let mut eps: Vec<Endpoint> = (0..7).map(|_| ep(Some("a"), true)).collect();
        eps.push(ep(Some("z"), true));
        assert_eq!(
            run(&three_zones(), &mut eps),
            Err(Withheld::ZoneMissing("z".into()))
        );
    }

    #[test]
    fn unready_endpoints_get_no_hint() {
        let mut eps: Vec<Endpoint> = ["a", "a", "a", "a", "b", "b", "c", "c"]
            .iter()
            .map(|z| ep(Some(z), true))
            .collect();
        eps.push(ep(Some("a"), false));
        run(&three_zones(), &mut eps).unwrap();
        assert!(eps[8].hints.is_none());
    }

    #[test]
    fn allocation_table() {
        let cpu = |v: &[(&str, u64)]| {
            v.iter()
                .map(|(z, c)| (z.to_string(), *c))
                .collect::<BTreeMap<_, _>>()
        };
        type Case<'a> = (usize, &'a [(&'a str, u64)], Option<&'a [(&'a str, usize)]>);
        let cases: &[Case] = &[
            (
                8,
                &[("a", 2), ("b", 1), ("c", 1)],
                Some(&[("a", 4), ("b", 2), ("c", 2)]),
            ),
            (
                3,
                &[("a", 1), ("b", 1), ("c", 1)],
                Some(&[("a", 1), ("b", 1), ("c", 1)]),
            ),
            (10, &[("a", 1), ("b", 1)], Some(&[("a", 5), ("b", 5)])),
            (2, &[("a", 2), ("b", 1)], None),
            (1, &[("a", 1), ("b", 1)], None),
        ];
        for (n, c, want) in cases {
            let got = allocate(*n, &cpu(c)).ok();
            let want = want.map(|w| {
                w.iter()
                    .map(|(z, v)| (z.to_string(), *v))
                    .collect::<BTreeMap<_, _>>()
            });
            assert_eq!(got, want, "{n} {c:?}");
        }
        assert_eq!(parse_cpu_millis("1500m"), Some(1500));
        assert_eq!(parse_cpu_millis("0.5"), Some(500));
        assert_eq!(parse_cpu_millis("x"), None);
    }

    #[test]
    fn requested() {
        let svc = |k: &str, v: &str| -> Service {
            serde_json::from_value(json!({"metadata": {"name": "s", "annotations": {k: v}}}))
                .unwrap()
        };
        assert!(hints_requested(&svc(HINTS_ANNOTATION, "auto")));
        assert!(hints_requested(&svc(MODE_ANNOTATION, "Auto")));
        assert!(!hints_requested(&svc(HINTS_ANNOTATION, "disabled")));
    }
}
