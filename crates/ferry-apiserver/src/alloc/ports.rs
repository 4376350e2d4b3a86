//! Node port decisions (no IO): the port range, and which node ports a Service's ports need.

use std::fmt;
use std::str::FromStr;

/// `--service-node-port-range`: `base-last` inclusive (also `base+size`, as upstream accepts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub base: u16,
    pub size: u16,
}

impl Default for PortRange {
    fn default() -> Self {
        PortRange {
            base: 30000,
            size: 2768,
        }
    }
}

/// A `--service-node-port-range` that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid port range {0:?} (want e.g. 30000-32767)")]
pub struct PortRangeError(pub String);

impl FromStr for PortRange {
    type Err = PortRangeError;
    fn from_str(s: &str) -> Result<PortRange, PortRangeError> {
        let err = || PortRangeError(s.to_string());
        if let Some((a, b)) = s.split_once('-') {
            let a: u16 = a.trim().parse().map_err(|_| err())?;
            let b: u16 = b.trim().parse().map_err(|_| err())?;
            if b < a || a == 0 {
                return Err(err());
            }
            Ok(PortRange {
                base: a,
                size: b - a + 1,
            })
        } else if let Some((a, n)) = s.split_once('+') {
            let a: u16 = a.trim().parse().map_err(|_| err())?;
            let n: u16 = n.trim().parse().map_err(|_| err())?;
            if a == 0 || u32::from(a) + u32::from(n) > 65536 {
                return Err(err());
            }
            Ok(PortRange { base: a, size: n })
        } else {
            let a: u16 = s.trim().parse().map_err(|_| err())?;
            Ok(PortRange { base: a, size: 1 })
        }
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.base, self.last())
    }
}

impl PortRange {
    pub fn last(&self) -> u16 {
        self.base.saturating_add(self.size.saturating_sub(1))
    }
    pub fn contains(&self, port: i32) -> bool {
        port >= i32::from(self.base) && port <= i32::from(self.last())
    }
    /// Static band for node ports: `min(max(16, size/32), 128)`.
    pub fn static_band(&self) -> u128 {
        super::cidr::static_band(u128::from(self.size), 16, 32, 128)
    }
}

/// One node port to hold: the user's choice (if any) and the service port indices using it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub requested: Option<i32>,
    pub members: Vec<usize>,
}

/// Groups service ports (`(port, nodePort)` pairs; 0 = unset) into node port slots as upstream
/// does: ports with the same port number (e.g. 53/TCP and 53/UDP) share one node port, a
/// user-chosen node port later in the list is used for the whole group. With `allocate_new` false
/// (`allocateLoadBalancerNodePorts: false`) only user-chosen ports are held.
pub fn node_port_slots(ports: &[(i32, i32)], allocate_new: bool) -> Vec<Slot> {
    let mut slots: Vec<Slot> = Vec::new();
    let mut by_port: Vec<(i32, usize)> = Vec::new();
    for (i, &(port, node_port)) in ports.iter().enumerate() {
        if node_port == 0 && !allocate_new {
            continue;
        }
        if let Some(&(_, s)) = by_port.iter().find(|(p, _)| *p == port) {
            let slot = &mut slots[s];
            if node_port == 0 || slot.requested == Some(node_port) {
                slot.members.push(i);
                continue;
            }
            // A different explicit node port on the same port number: its own slot.
            push_slot(&mut slots, Some(node_port), i);
            continue;
        }
        let requested = if node_port != 0 {
            Some(node_port)
        } else {
            ports[i..]
                .iter()
                .find(|(p, np)| *p == port && *np != 0)
                .map(|(_, np)| *np)
        };
        let s = push_slot(&mut slots, requested, i);
        by_port.push((port, s));
    }
    slots
}

fn push_slot(slots: &mut Vec<Slot>, requested: Option<i32>, member: usize) -> usize {
    // The same explicit node port twice (different port numbers and protocols) is one slot.
    if let Some(r) = requested
        && let Some(s) = slots.iter().position(|s| s.requested == Some(r))
    {
        slots[s].members.push(member);
        return s;
    }
    slots.push(Slot {
        requested,
        members: vec![member],
    });
    slots.len() - 1
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn range_parse() {
        let cases: &[(&str, Option<(u16, u16)>)] = &[
            ("30000-32767", Some((30000, 2768))),
            ("30000+100", Some((30000, 100))),
            ("8080", Some((8080, 1))),
            ("32767-30000", None),
            ("x-1", None),
            ("0-10", None),
        ];
        for (s, want) in cases {
            let got = s.parse::<PortRange>().ok().map(|r| (r.base, r.size));
            assert_eq!(got, *want, "{s}");
        }
        let r = PortRange::default();
        assert_eq!(r.to_string(), "30000-32767");
        assert!(r.contains(30000) && r.contains(32767));
        assert!(!r.contains(29999) && !r.contains(32768));
        assert_eq!(r.static_band(), 86);
    }

    #[test]
    fn slots_table() {
        type Case<'a> = (&'a [(i32, i32)], bool, &'a [(Option<i32>, &'a [usize])]);
        let cases: &[Case] = &[
            (&[(80, 0)], true, &[(None, &[0])]),
            (&[(80, 0)], false, &[]),
            (&[(80, 30080)], false, &[(Some(30080), &[0])]),
            // 53/TCP + 53/UDP share one node port.
            (&[(53, 0), (53, 0)], true, &[(None, &[0, 1])]),
            // A later explicit choice applies to the group.
            (&[(53, 0), (53, 30053)], true, &[(Some(30053), &[0, 1])]),
            (&[(80, 0), (443, 0)], true, &[(None, &[0]), (None, &[1])]),
            // Conflicting explicit choices on one port number: two slots.
            (
                &[(53, 30053), (53, 30054)],
                true,
                &[(Some(30053), &[0]), (Some(30054), &[1])],
            ),
            // One explicit node port for different port numbers (TCP and UDP): one slot.
            (&[(80, 30080), (81, 30080)], true, &[(Some(30080), &[0, 1])]),
        ];
        for (ports, alloc, want) in cases {
            let got = node_port_slots(ports, *alloc);
            let want: Vec<Slot> = want
                .iter()
                .map(|(r, m)| Slot {
                    requested: *r,
                    members: m.to_vec(),
                })
                .collect();
            assert_eq!(got, want, "{ports:?}");
        }
    }
}
