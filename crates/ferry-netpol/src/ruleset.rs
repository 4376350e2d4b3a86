//! Ferry's NetworkPolicy table as data: sets, maps and chains, their nftables text, the
//! difference between two of them as one `nft -f` batch, and a small interpreter that runs a
//! packet through the rules (what the kernel would do), so that tests can check the rendered
//! rules against the verdict function.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use crate::model::Proto;

/// Address family of a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fam {
    V4,
    V6,
}

impl Fam {
    pub fn of(ip: &IpAddr) -> Fam {
        if ip.is_ipv4() { Fam::V4 } else { Fam::V6 }
    }
    fn kw(self) -> &'static str {
        match self {
            Fam::V4 => "ip",
            Fam::V6 => "ip6",
        }
    }
    fn addr_type(self) -> &'static str {
        match self {
            Fam::V4 => "ipv4_addr",
            Fam::V6 => "ipv6_addr",
        }
    }
}

/// Which address of the packet a match looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    Saddr,
    Daddr,
}

impl Field {
    fn kw(self) -> &'static str {
        match self {
            Field::Saddr => "saddr",
            Field::Daddr => "daddr",
        }
    }
}

/// The kinds of sets and maps the table uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    /// Plain addresses (the node's own).
    Addr(Fam),
    /// Address ranges (peers: pod addresses, ipBlocks minus excepts).
    AddrInterval(Fam),
    /// `inet_proto . inet_service` ranges (numeric ports, endPort ranges).
    ProtoPorts,
    /// `addr . inet_proto . inet_service` (named ports resolved per pod).
    AddrProtoPort(Fam),
    /// `addr : verdict` (pod address → its policy chain).
    Vmap(Fam),
}

impl SetKind {
    fn is_interval(self) -> bool {
        matches!(self, SetKind::AddrInterval(_) | SetKind::ProtoPorts)
    }
}

/// One set element.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Elem {
    Addr(IpAddr),
    /// Inclusive address range.
    Range(IpAddr, IpAddr),
    /// Protocol and inclusive port range.
    Ports(Proto, u16, u16),
    AddrPort(IpAddr, Proto, u16),
    /// Address → `jump chain`.
    Jump(IpAddr, String),
}

impl Elem {
    fn text(&self) -> String {
        match self {
            Elem::Addr(a) => a.to_string(),
            Elem::Range(a, b) if a == b => a.to_string(),
            Elem::Range(a, b) => format!("{a}-{b}"),
            Elem::Ports(p, a, b) if a == b => format!("{} . {a}", p.nft()),
            Elem::Ports(p, a, b) => format!("{} . {a}-{b}", p.nft()),
            Elem::AddrPort(a, p, port) => format!("{a} . {} . {port}", p.nft()),
            Elem::Jump(a, c) => format!("{a} : jump {c}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub kind: SetKind,
    pub elements: BTreeSet<Elem>,
}

/// A match of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `ct state established,related`
    Established,
    /// `ip saddr @set`
    Addr(Fam, Field, String),
    /// `meta l4proto . th dport @set`
    ProtoPort(String),
    /// `ip daddr . meta l4proto . th dport @set`
    AddrProtoPort(Fam, String),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// No verdict (counter or log only).
    Continue,
    Accept,
    Drop,
    /// `reject with icmpx admin-prohibited` (TCP gets an ICMP error too, so clients fail fast).
    Reject,
    Jump(String),
    /// `ip daddr vmap @map`
    Vmap(Fam, Field, String),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub counter: bool,
    /// `limit rate N/second` then `log prefix ... group G` (no verdict).
    pub log: Option<LogSpec>,
    pub action: Action,
    pub comment: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogSpec {
    pub prefix: String,
    pub group: u16,
    pub per_second: u32,
}

impl Rule {
    pub fn new(matches: Vec<Match>, action: Action) -> Rule {
        Rule {
            matches,
            counter: false,
            log: None,
            action,
            comment: None,
        }
    }
    pub fn text(&self) -> String {
        let mut s = String::new();
        for m in &self.matches {
            let part = match m {
                Match::Established => "ct state established,related".to_string(),
                Match::Addr(f, fld, set) => format!("{} {} @{set}", f.kw(), fld.kw()),
                Match::ProtoPort(set) => format!("meta l4proto . th dport @{set}"),
                Match::AddrProtoPort(f, set) => {
                    format!("{} daddr . meta l4proto . th dport @{set}", f.kw())
                }
            };
            push(&mut s, &part);
        }
        if let Some(l) = &self.log {
            push(
                &mut s,
                &format!(
                    "limit rate {}/second log prefix \"{}\" group {}",
                    l.per_second,
                    sanitize_text(&l.prefix),
                    l.group
                ),
            );
        }
        if self.counter {
            push(&mut s, "counter");
        }
        let act = match &self.action {
            Action::Continue => String::new(),
            Action::Accept => "accept".into(),
            Action::Drop => "drop".into(),
            Action::Reject => "reject with icmpx admin-prohibited".into(),
            Action::Jump(c) => format!("jump {c}"),
            Action::Vmap(f, fld, m) => format!("{} {} vmap @{m}", f.kw(), fld.kw()),
        };
        if !act.is_empty() {
            push(&mut s, &act);
        }
        if let Some(c) = &self.comment {
            push(&mut s, &format!("comment \"{}\"", sanitize_text(c)));
        }
        s
    }
}

fn push(s: &mut String, part: &str) {
    if !s.is_empty() {
        s.push(' ');
    }
    s.push_str(part);
}

/// Quoted strings must not carry quotes; comments are at most 128 bytes.
fn sanitize_text(s: &str) -> String {
    let mut out: String = s
        .chars()
        .filter(|c| *c != '"' && *c != '\\' && !c.is_control())
        .collect();
    while out.len() > 120 {
        out.pop();
    }
    out
}

/// A base chain's hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    pub hook: &'static str,
    pub priority: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub hook: Option<Hook>,
    pub rules: Vec<Rule>,
}

/// A whole table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ruleset {
    pub table: String,
    pub sets: BTreeMap<String, Set>,
    pub chains: BTreeMap<String, Chain>,
}

fn set_decl(table: &str, name: &str, kind: SetKind) -> String {
    match kind {
        SetKind::Addr(f) => format!("add set inet {table} {name} {{ type {}; }}", f.addr_type()),
        SetKind::AddrInterval(f) => format!(
            "add set inet {table} {name} {{ type {}; flags interval; }}",
            f.addr_type()
        ),
        SetKind::ProtoPorts => format!(
            "add set inet {table} {name} {{ type inet_proto . inet_service; flags interval; }}"
        ),
        SetKind::AddrProtoPort(f) => format!(
            "add set inet {table} {name} {{ type {} . inet_proto . inet_service; }}",
            f.addr_type()
        ),
        SetKind::Vmap(f) => format!(
            "add map inet {table} {name} {{ type {} : verdict; }}",
            f.addr_type()
        ),
    }
}

fn chain_decl(table: &str, name: &str, c: &Chain) -> String {
    match &c.hook {
        Some(h) => format!(
            "add chain inet {table} {name} {{ type filter hook {} priority {}; policy accept; }}",
            h.hook, h.priority
        ),
        None => format!("add chain inet {table} {name}"),
    }
}

/// Elements in batches (one `add element` line per 1,000 keeps lines reasonable).
fn element_lines(out: &mut String, verb: &str, table: &str, name: &str, elems: &[&Elem]) {
    for chunk in elems.chunks(1000) {
        let list: Vec<String> = chunk.iter().map(|e| e.text()).collect();
        let _ = writeln!(
            out,
            "{verb} element inet {table} {name} {{ {} }}",
            list.join(", ")
        );
    }
}

/// What a [`diff`] changes, for logs and benchmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffStats {
    pub sets_added: usize,
    pub sets_removed: usize,
    pub elements_added: usize,
    pub elements_removed: usize,
    pub chains_added: usize,
    pub chains_removed: usize,
    pub chains_rewritten: usize,
    pub rules_written: usize,
}

impl DiffStats {
    pub fn is_empty(&self) -> bool {
        *self == DiffStats::default()
    }
    /// Number of objects touched.
    pub fn size(&self) -> usize {
        self.sets_added
            + self.sets_removed
            + self.elements_added
            + self.elements_removed
            + self.chains_added
            + self.chains_removed
            + self.rules_written
    }
}

/// The `nft -f` batch that turns `old` into `new` (`old` = None: replace the whole table,
/// atomically, keeping established flows since conntrack is not touched).
pub fn diff(old: Option<&Ruleset>, new: &Ruleset) -> (String, DiffStats) {
    let t = &new.table;
    let mut out = String::new();
    let mut st = DiffStats::default();
    let empty = Ruleset::default();
    // A set whose type changed, or a base chain whose hook changed, cannot be altered in
    // place: replace the whole table then.
    let compatible = |o: &Ruleset| {
        o.table == new.table
            && new
                .sets
                .iter()
                .all(|(k, s)| o.sets.get(k).is_none_or(|x| x.kind == s.kind))
            && new
                .chains
                .iter()
                .all(|(k, c)| o.chains.get(k).is_none_or(|x| x.hook == c.hook))
    };
    let old = match old {
        Some(o) if compatible(o) => o,
        _ => {
            let _ = writeln!(out, "add table inet {t}");
            let _ = writeln!(out, "delete table inet {t}");
            &empty
        }
    };
    let _ = writeln!(out, "add table inet {t}");
    // 1. New sets and chains.
    for (name, s) in &new.sets {
        if !old.sets.contains_key(name) {
            let _ = writeln!(out, "{}", set_decl(t, name, s.kind));
            st.sets_added += 1;
        }
    }
    for (name, c) in &new.chains {
        if !old.chains.contains_key(name) {
            let _ = writeln!(out, "{}", chain_decl(t, name, c));
            st.chains_added += 1;
        }
    }
    // 2. Elements of sets that exist on both sides with the same type.
    for (name, s) in &new.sets {
        let old_elems = match old.sets.get(name) {
            Some(o) => &o.elements,
            None => {
                let all: Vec<&Elem> = s.elements.iter().collect();
                element_lines(&mut out, "add", t, name, &all);
                st.elements_added += all.len();
                continue;
            }
        };
        if *old_elems == s.elements {
            continue;
        }
        let removed: Vec<&Elem> = old_elems.difference(&s.elements).collect();
        let added: Vec<&Elem> = s.elements.difference(old_elems).collect();
        if s.kind.is_interval() {
            // Ranges may have merged or split: replace the set's content (still atomic).
            let _ = writeln!(out, "flush set inet {t} {name}");
            let all: Vec<&Elem> = s.elements.iter().collect();
            element_lines(&mut out, "add", t, name, &all);
            st.elements_removed += removed.len();
            st.elements_added += added.len();
        } else {
            element_lines(&mut out, "delete", t, name, &removed);
            element_lines(&mut out, "add", t, name, &added);
            st.elements_removed += removed.len();
            st.elements_added += added.len();
        }
    }
    // 3. Rules of new chains and of chains whose rules changed.
    for (name, c) in &new.chains {
        match old.chains.get(name) {
            Some(o) if o.rules == c.rules => continue,
            Some(_) => {
                let _ = writeln!(out, "flush chain inet {t} {name}");
                st.chains_rewritten += 1;
            }
            None => {}
        }
        for r in &c.rules {
            let _ = writeln!(out, "add rule inet {t} {name} {}", r.text());
            st.rules_written += 1;
        }
    }
    // 4. Chains that went away: empty them all first (they may jump to each other), then delete.
    let gone: Vec<&String> = old
        .chains
        .keys()
        .filter(|k| !new.chains.contains_key(*k))
        .collect();
    for name in &gone {
        let _ = writeln!(out, "flush chain inet {t} {name}");
    }
    for name in &gone {
        let _ = writeln!(out, "delete chain inet {t} {name}");
        st.chains_removed += 1;
    }
    // 5. Sets that went away (no rule refers to them any more).
    for name in old.sets.keys() {
        if !new.sets.contains_key(name) {
            let _ = writeln!(out, "delete set inet {t} {name}");
            st.sets_removed += 1;
        }
    }
    if old.table.is_empty() || !st.is_empty() {
        (out, st)
    } else {
        (String::new(), st)
    }
}

/// The whole table as one batch (what a resync loads).
pub fn full_script(rs: &Ruleset) -> String {
    diff(None, rs).0
}

/// A packet for the interpreter (the first packet of a connection: conntrack state new).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: Proto,
    pub port: u16,
}

enum Flow {
    Continue,
    Accept,
    Deny,
}

fn set_has(rs: &Ruleset, set: &str, f: impl Fn(&Elem) -> bool) -> bool {
    rs.sets.get(set).is_some_and(|s| s.elements.iter().any(f))
}

fn in_range(ip: IpAddr, a: IpAddr, b: IpAddr) -> bool {
    match (ip, a, b) {
        (IpAddr::V4(x), IpAddr::V4(a), IpAddr::V4(b)) => a <= x && x <= b,
        (IpAddr::V6(x), IpAddr::V6(a), IpAddr::V6(b)) => a <= x && x <= b,
        _ => false,
    }
}

fn field_ip(p: &Packet, f: Field) -> IpAddr {
    match f {
        Field::Saddr => p.src,
        Field::Daddr => p.dst,
    }
}

fn rule_matches(rs: &Ruleset, r: &Rule, p: &Packet) -> bool {
    r.matches.iter().all(|m| match m {
        // A first packet is never established.
        Match::Established => false,
        Match::Addr(fam, fld, set) => {
            let ip = field_ip(p, *fld);
            Fam::of(&ip) == *fam
                && set_has(rs, set, |e| match e {
                    Elem::Addr(a) => *a == ip,
                    Elem::Range(a, b) => in_range(ip, *a, *b),
                    _ => false,
                })
        }
        Match::ProtoPort(set) => set_has(rs, set, |e| {
            matches!(e, Elem::Ports(pr, a, b) if *pr == p.proto && *a <= p.port && p.port <= *b)
        }),
        Match::AddrProtoPort(fam, set) => {
            Fam::of(&p.dst) == *fam
                && set_has(rs, set, |e| {
                    matches!(e, Elem::AddrPort(a, pr, port) if *a == p.dst && *pr == p.proto && *port == p.port)
                })
        }
    })
}

fn run_chain(rs: &Ruleset, name: &str, p: &Packet, depth: usize) -> Flow {
    let Some(chain) = rs.chains.get(name) else {
        return Flow::Continue;
    };
    if depth > 16 {
        return Flow::Deny;
    }
    for r in &chain.rules {
        if !rule_matches(rs, r, p) {
            continue;
        }
        let next = match &r.action {
            Action::Continue => Flow::Continue,
            Action::Accept => Flow::Accept,
            Action::Drop | Action::Reject => Flow::Deny,
            Action::Jump(c) => run_chain(rs, c, p, depth + 1),
            Action::Vmap(fam, fld, map) => {
                let ip = field_ip(p, *fld);
                if Fam::of(&ip) != *fam {
                    Flow::Continue
                } else {
                    let target = rs.sets.get(map).and_then(|s| {
                        s.elements.iter().find_map(|e| match e {
                            Elem::Jump(a, c) if *a == ip => Some(c.clone()),
                            _ => None,
                        })
                    });
                    match target {
                        Some(c) => run_chain(rs, &c, p, depth + 1),
                        None => Flow::Continue,
                    }
                }
            }
        };
        match next {
            Flow::Continue => {}
            done => return done,
        }
    }
    Flow::Continue
}

/// Runs `p` through every base chain of the table in priority order (policy accept); true
/// when the table lets it through.
pub fn accepts(rs: &Ruleset, p: &Packet) -> bool {
    let mut bases: Vec<(&String, &Chain)> =
        rs.chains.iter().filter(|(_, c)| c.hook.is_some()).collect();
    bases.sort_by_key(|(n, c)| (c.hook.as_ref().map(|h| h.priority), n.to_string()));
    for (name, _) in bases {
        if let Flow::Deny = run_chain(rs, name, p, 0) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rs_with(elems: &[Elem]) -> Ruleset {
        let mut rs = Ruleset {
            table: "t".into(),
            ..Default::default()
        };
        rs.sets.insert(
            "s".into(),
            Set {
                kind: SetKind::AddrInterval(Fam::V4),
                elements: elems.iter().cloned().collect(),
            },
        );
        rs.chains.insert(
            "base".into(),
            Chain {
                hook: Some(Hook {
                    hook: "forward",
                    priority: 0,
                }),
                rules: vec![Rule::new(
                    vec![Match::Addr(Fam::V4, Field::Saddr, "s".into())],
                    Action::Drop,
                )],
            },
        );
        rs
    }

    #[test]
    fn text_of_rules_and_elements() {
        let mut r = Rule::new(
            vec![
                Match::Addr(Fam::V6, Field::Daddr, "p6".into()),
                Match::ProtoPort("n".into()),
            ],
            Action::Accept,
        );
        r.counter = true;
        r.comment = Some("allow \"x\"".into());
        assert_eq!(
            r.text(),
            "ip6 daddr @p6 meta l4proto . th dport @n counter accept comment \"allow x\""
        );
        assert_eq!(Elem::Ports(Proto::Sctp, 1, 2).text(), "sctp . 1-2");
        assert_eq!(
            Elem::AddrPort("10.0.0.1".parse().unwrap(), Proto::Udp, 53).text(),
            "10.0.0.1 . udp . 53"
        );
        assert_eq!(
            Elem::Jump("fd00::1".parse().unwrap(), "i_x_a".into()).text(),
            "fd00::1 : jump i_x_a"
        );
    }

    #[test]
    fn diff_is_incremental_and_empty_when_equal() {
        let a = rs_with(&[Elem::Range(
            "10.0.0.1".parse().unwrap(),
            "10.0.0.1".parse().unwrap(),
        )]);
        let (full, st) = diff(None, &a);
        assert!(full.starts_with("add table inet t\ndelete table inet t\nadd table inet t\n"));
        assert_eq!(st.sets_added, 1);
        assert_eq!(st.chains_added, 1);
        let (same, st) = diff(Some(&a), &a);
        assert!(same.is_empty() && st.is_empty());
        let b = rs_with(&[Elem::Range(
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
        )]);
        let (d, st) = diff(Some(&a), &b);
        assert_eq!(
            d,
            "add table inet t\nflush set inet t s\nadd element inet t s { 10.0.0.1-10.0.0.2 }\n"
        );
        assert_eq!((st.elements_added, st.elements_removed), (1, 1));
        let mut c = b.clone();
        c.chains.remove("base");
        c.sets.remove("s");
        let (d, st) = diff(Some(&b), &c);
        assert!(
            d.contains("flush chain inet t base\ndelete chain inet t base\ndelete set inet t s")
        );
        assert_eq!((st.chains_removed, st.sets_removed), (1, 1));
    }

    #[test]
    fn interpreter_follows_sets_and_verdicts() {
        let rs = rs_with(&[Elem::Range(
            "10.0.0.0".parse().unwrap(),
            "10.0.0.9".parse().unwrap(),
        )]);
        let p = |s: &str| Packet {
            src: s.parse().unwrap(),
            dst: "10.1.0.1".parse().unwrap(),
            proto: Proto::Tcp,
            port: 80,
        };
        assert!(!accepts(&rs, &p("10.0.0.5")));
        assert!(accepts(&rs, &p("10.0.0.10")));
        assert!(accepts(&rs, &p("fd00::5")));
    }
}
