//! Incremental rendering of Ferry's nftables table: only the Services whose kernel input
//! changed are rendered again, and the difference is computed over what they touch, so one
//! Service's endpoints changing costs a few map elements, whatever the number of Services.
//!
//! Each Service (all its ports, both families) renders on its own into a *fragment*: the
//! chains, sets and elements it adds to the table's skeleton ([`nft::skeleton`]). The table is
//! the union of the fragments, with a count per item (shared chains such as `cl4-3` and
//! hairpin pairs are contributed by many Services). That union is what [`nft::render`] gives
//! as long as no two Services claim the same map key with different values (say two Services
//! with the same externalIP and port, where the first claim wins); while such a conflict
//! exists, the whole table is rendered and diffed instead, so the result is always exactly
//! [`nft::render`]'s (property-tested below).

use std::collections::{BTreeMap, BTreeSet};

use super::input::SvcPort;
use super::nft::{self, Chain, Key, NftConfig, Op, Ruleset, Set, SetKind, Value};

/// A Service's key: (namespace, name).
pub type SvcKey = (String, String);

/// What one Service adds to the skeleton.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Fragment {
    chains: Vec<(String, Chain)>,
    /// Sets it creates (not in the skeleton).
    sets: Vec<(String, SetKind)>,
    elements: Vec<(String, Key, Value)>,
}

impl Fragment {
    fn of(rendered: Ruleset, skeleton: &Ruleset) -> Fragment {
        let mut f = Fragment {
            chains: rendered.chains.into_iter().collect(),
            ..Fragment::default()
        };
        for (name, set) in rendered.sets {
            let base = skeleton.sets.get(&name);
            if base.is_none()
                && let Some(k) = set.kind.clone()
            {
                f.sets.push((name.clone(), k));
            }
            for (k, v) in set.elements {
                if base.is_some_and(|b| b.elements.get(&k) == Some(&v)) {
                    continue;
                }
                f.elements.push((name.clone(), k, v));
            }
        }
        f
    }
}

/// Distinct contributions with their counts.
#[derive(Debug, Clone)]
struct Multi<T>(Vec<(T, usize)>);

impl<T: PartialEq> Multi<T> {
    fn add(&mut self, v: T) {
        match self.0.iter_mut().find(|(x, _)| *x == v) {
            Some((_, n)) => *n += 1,
            None => self.0.push((v, 1)),
        }
    }
    fn remove(&mut self, v: &T) {
        if let Some(i) = self.0.iter().position(|(x, _)| x == v) {
            self.0[i].1 -= 1;
            if self.0[i].1 == 0 {
                self.0.remove(i);
            }
        }
    }
    /// The value when exactly one distinct value is contributed.
    fn single(&self) -> Option<&T> {
        match self.0.as_slice() {
            [(v, _)] => Some(v),
            _ => None,
        }
    }
}

/// One item of the table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Item {
    Chain(String),
    Set(String),
    Element(String, Key),
}

/// The result of one [`Incremental::update`].
#[derive(Debug, Clone, Default)]
pub struct Update {
    /// The operations from the previous state to the new one (empty: nothing changed).
    pub ops: Vec<Op>,
    /// The first update: `ops` is empty and the whole table ([`Incremental::state`]) is to
    /// be written.
    pub full: bool,
    /// Services rendered again.
    pub rendered: usize,
    /// The whole table was rendered and diffed (a claim conflict between Services).
    pub whole: bool,
}

/// The desired table, kept up to date one Service at a time.
pub struct Incremental {
    cfg: NftConfig,
    skeleton: Ruleset,
    /// Per Service (namespace, name): its kernel input and its fragment.
    services: BTreeMap<(String, String), (Vec<SvcPort>, Fragment)>,
    chains: BTreeMap<String, Multi<Chain>>,
    sets: BTreeMap<String, Multi<SetKind>>,
    elements: BTreeMap<(String, Key), Multi<Value>>,
    /// Items with more than one distinct contribution.
    conflicts: BTreeSet<Item>,
    state: Ruleset,
    primed: bool,
}

/// Consecutive ports of one Service ([`super::input::build`] keeps them together).
fn groups(ports: &[SvcPort]) -> Vec<&[SvcPort]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=ports.len() {
        if i == ports.len()
            || ports[i].name.namespace != ports[start].name.namespace
            || ports[i].name.name != ports[start].name.name
        {
            if i > start {
                out.push(&ports[start..i]);
            }
            start = i;
        }
    }
    out
}

impl Incremental {
    pub fn new(cfg: &NftConfig) -> Incremental {
        let skeleton = nft::skeleton(cfg);
        Incremental {
            cfg: cfg.clone(),
            state: nft::render(&[], cfg),
            skeleton,
            services: BTreeMap::new(),
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
            elements: BTreeMap::new(),
            conflicts: BTreeSet::new(),
            primed: false,
        }
    }

    /// The desired state of the whole table.
    pub fn state(&self) -> &Ruleset {
        &self.state
    }

    /// Forgets what was sent: the next update is a full one.
    pub fn reset(&mut self) {
        self.primed = false;
    }

    /// Adds or removes a fragment's contributions; records the items in `touched` (none on
    /// the first update, whose state is the whole render).
    fn contribute(&mut self, f: &Fragment, add: bool, mut touched: Option<&mut BTreeSet<Item>>) {
        for (n, c) in &f.chains {
            let m = self.chains.entry(n.clone()).or_insert(Multi(Vec::new()));
            if add {
                m.add(c.clone());
            } else {
                m.remove(c);
            }
            if let Some(t) = touched.as_deref_mut() {
                t.insert(Item::Chain(n.clone()));
            }
        }
        for (n, k) in &f.sets {
            let m = self.sets.entry(n.clone()).or_insert(Multi(Vec::new()));
            if add {
                m.add(k.clone());
            } else {
                m.remove(k);
            }
            if let Some(t) = touched.as_deref_mut() {
                t.insert(Item::Set(n.clone()));
            }
        }
        for (s, k, v) in &f.elements {
            let m = self
                .elements
                .entry((s.clone(), k.clone()))
                .or_insert(Multi(Vec::new()));
            if add {
                m.add(v.clone());
            } else {
                m.remove(v);
            }
            if let Some(t) = touched.as_deref_mut() {
                t.insert(Item::Element(s.clone(), k.clone()));
            }
        }
    }

    /// What `item` is in the union of the fragments (and the skeleton); records conflicts.
    fn resolve(&mut self, item: &Item) -> Resolved {
        let (len, r) = match item {
            Item::Chain(n) => {
                let m = self.chains.get(n);
                let len = m.map_or(0, |m| m.0.len());
                let r = m
                    .and_then(Multi::single)
                    .map_or(Resolved::Absent, |c| Resolved::Chain(c.clone()));
                if len == 0 {
                    self.chains.remove(n);
                }
                (len, r)
            }
            Item::Set(n) => {
                let m = self.sets.get(n);
                let len = m.map_or(0, |m| m.0.len());
                let r = match (self.skeleton.sets.get(n), m.and_then(Multi::single)) {
                    (Some(s), _) => s.kind.clone().map_or(Resolved::Absent, Resolved::Set),
                    (None, Some(k)) => Resolved::Set(k.clone()),
                    (None, None) => Resolved::Absent,
                };
                if len == 0 {
                    self.sets.remove(n);
                }
                (len, r)
            }
            Item::Element(s, k) => {
                let key = (s.clone(), k.clone());
                let m = self.elements.get(&key);
                let len = m.map_or(0, |m| m.0.len());
                let r = match m.and_then(Multi::single) {
                    Some(v) => Resolved::Value(v.clone()),
                    None => self
                        .skeleton
                        .sets
                        .get(s)
                        .and_then(|set| set.elements.get(k))
                        .map_or(Resolved::Absent, |v| Resolved::Value(v.clone())),
                };
                if len == 0 {
                    self.elements.remove(&key);
                }
                (len, r)
            }
        };
        if len > 1 {
            self.conflicts.insert(item.clone());
        } else {
            self.conflicts.remove(item);
        }
        r
    }

    /// The part of `rs` that `touched` covers.
    fn sub(rs: &Ruleset, touched: &BTreeSet<Item>) -> Ruleset {
        let mut out = Ruleset::default();
        for item in touched {
            match item {
                Item::Chain(n) => {
                    if let Some(c) = rs.chains.get(n) {
                        out.chains.insert(n.clone(), c.clone());
                    }
                }
                Item::Set(n) => {
                    if let Some(s) = rs.sets.get(n) {
                        out.sets.entry(n.clone()).or_insert_with(|| Set {
                            kind: s.kind.clone(),
                            elements: BTreeMap::new(),
                        });
                    }
                }
                Item::Element(sn, k) => {
                    if let Some(s) = rs.sets.get(sn) {
                        let o = out.sets.entry(sn.clone()).or_insert_with(|| Set {
                            kind: s.kind.clone(),
                            elements: BTreeMap::new(),
                        });
                        if let Some(v) = s.elements.get(k) {
                            o.elements.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
        }
        out
    }

    /// Every item with more than one distinct contribution.
    fn recount_conflicts(&mut self) {
        self.conflicts.clear();
        for (n, m) in &self.chains {
            if m.0.len() > 1 {
                self.conflicts.insert(Item::Chain(n.clone()));
            }
        }
        for (n, m) in &self.sets {
            if m.0.len() > 1 {
                self.conflicts.insert(Item::Set(n.clone()));
            }
        }
        for ((s, k), m) in &self.elements {
            if m.0.len() > 1 {
                self.conflicts.insert(Item::Element(s.clone(), k.clone()));
            }
        }
    }

    /// The Services whose ports changed (or are new), and those gone. A merge of the sorted
    /// input with the stored Services: nothing is allocated for an unchanged one.
    #[allow(clippy::type_complexity)]
    fn changes<'p>(&self, ports: &'p [SvcPort]) -> (Vec<&'p [SvcPort]>, Vec<(String, String)>) {
        let gs = groups(ports);
        let sorted = gs.windows(2).all(|w| {
            (w[0][0].name.namespace.as_str(), w[0][0].name.name.as_str())
                < (w[1][0].name.namespace.as_str(), w[1][0].name.name.as_str())
        });
        let mut changed = Vec::new();
        let mut removed = Vec::new();
        if !sorted {
            // Not in input order (a caller of its own): look every Service up.
            let mut seen = BTreeSet::new();
            for g in gs {
                let key = (g[0].name.namespace.clone(), g[0].name.name.clone());
                if !self
                    .services
                    .get(&key)
                    .is_some_and(|(old, _)| old.as_slice() == g)
                {
                    changed.push(g);
                }
                seen.insert(key);
            }
            removed.extend(self.services.keys().filter(|k| !seen.contains(*k)).cloned());
            return (changed, removed);
        }
        let mut it = self.services.iter().peekable();
        for g in gs {
            let k = (g[0].name.namespace.as_str(), g[0].name.name.as_str());
            while let Some(((ns, n), _)) = it.peek() {
                if (ns.as_str(), n.as_str()) < k {
                    removed.push((ns.clone(), n.clone()));
                    it.next();
                } else {
                    break;
                }
            }
            match it.peek() {
                Some(((ns, n), (old, _))) if (ns.as_str(), n.as_str()) == k => {
                    if old.as_slice() != g {
                        changed.push(g);
                    }
                    it.next();
                }
                _ => changed.push(g),
            }
        }
        removed.extend(it.map(|(k, _)| k.clone()));
        (changed, removed)
    }

    /// The state before this update's changes to `touched` (from their old values).
    fn restore(&self, old_sub: &Ruleset, touched: &BTreeSet<Item>) -> Ruleset {
        let mut prev = self.state.clone();
        for item in touched {
            match item {
                Item::Chain(n) => match old_sub.chains.get(n) {
                    Some(c) => {
                        prev.chains.insert(n.clone(), c.clone());
                    }
                    None => {
                        prev.chains.remove(n);
                    }
                },
                Item::Set(n) => match old_sub.sets.get(n) {
                    Some(o) => {
                        let s = prev.sets.entry(n.clone()).or_default();
                        s.kind = o.kind.clone();
                    }
                    None => {
                        prev.sets.remove(n);
                    }
                },
                Item::Element(sn, k) => {
                    let old = old_sub.sets.get(sn).and_then(|s| s.elements.get(k));
                    match (old, prev.sets.get_mut(sn)) {
                        (Some(v), Some(s)) => {
                            s.elements.insert(k.clone(), v.clone());
                        }
                        (Some(v), None) => {
                            let mut s = Set::default();
                            s.kind = old_sub.sets.get(sn).and_then(|s| s.kind.clone());
                            s.elements.insert(k.clone(), v.clone());
                            prev.sets.insert(sn.clone(), s);
                        }
                        (None, Some(s)) => {
                            s.elements.remove(k);
                        }
                        (None, None) => {}
                    }
                }
            }
        }
        prev
    }

    /// Brings the desired state to `ports` (the whole kernel input, as
    /// [`super::input::build`] orders it) and returns the operations that get there.
    pub fn update(&mut self, ports: &[SvcPort]) -> Update {
        let (changed, removed) = self.changes(ports);
        let rendered = changed.len() + removed.len();
        if !self.primed {
            // The first update: every Service's contributions are counted, and the state is
            // the whole render (exact, conflicts or not).
            for g in changed {
                let key = (g[0].name.namespace.clone(), g[0].name.name.clone());
                let frag =
                    Fragment::of(nft::render_on(g, &self.cfg, &self.skeleton), &self.skeleton);
                if let Some((_, old)) = self.services.remove(&key) {
                    self.contribute(&old, false, None);
                }
                self.contribute(&frag, true, None);
                self.services.insert(key, (g.to_vec(), frag));
            }
            for k in removed {
                if let Some((_, old)) = self.services.remove(&k) {
                    self.contribute(&old, false, None);
                }
            }
            self.recount_conflicts();
            self.state = self
                .union_state()
                .unwrap_or_else(|| nft::render(ports, &self.cfg));
            self.primed = true;
            return Update {
                ops: Vec::new(),
                full: true,
                rendered,
                whole: false,
            };
        }
        let ch: Vec<(SvcKey, Vec<SvcPort>)> = changed
            .into_iter()
            .map(|g| {
                (
                    (g[0].name.namespace.clone(), g[0].name.name.clone()),
                    g.to_vec(),
                )
            })
            .chain(removed.into_iter().map(|k| (k, Vec::new())))
            .collect();
        self.apply_changes(ch, Some(ports))
    }

    /// Like [`Incremental::update`], given only the Services that may have changed: each with
    /// its whole kernel input (as [`super::input::build`] orders it; empty: the Service is
    /// gone). Costs what those Services touch, whatever the number of Services (except while
    /// two Services claim the same map key, when the whole table is rendered and diffed).
    pub fn update_services(&mut self, changes: Vec<(SvcKey, Vec<SvcPort>)>) -> Update {
        let changes: Vec<(SvcKey, Vec<SvcPort>)> = changes
            .into_iter()
            .filter(|(k, p)| match self.services.get(k) {
                Some((old, _)) => old != p,
                None => !p.is_empty(),
            })
            .collect();
        if !self.primed {
            let rendered = changes.len();
            for (key, g) in changes {
                if let Some((_, old)) = self.services.remove(&key) {
                    self.contribute(&old, false, None);
                }
                if !g.is_empty() {
                    let frag = Fragment::of(
                        nft::render_on(&g, &self.cfg, &self.skeleton),
                        &self.skeleton,
                    );
                    self.contribute(&frag, true, None);
                    self.services.insert(key, (g, frag));
                }
            }
            self.recount_conflicts();
            self.state = self
                .union_state()
                .unwrap_or_else(|| nft::render(&self.all_ports(), &self.cfg));
            self.primed = true;
            return Update {
                ops: Vec::new(),
                full: true,
                rendered,
                whole: false,
            };
        }
        self.apply_changes(changes, None)
    }

    /// The whole table from the counted contributions, when no item is claimed differently
    /// by two Services (what [`nft::render`] gives then); `None` while a conflict exists.
    fn union_state(&self) -> Option<Ruleset> {
        if !self.conflicts.is_empty() {
            return None;
        }
        let mut rs = nft::render(&[], &self.cfg);
        for (n, m) in &self.chains {
            if let Some(c) = m.single() {
                rs.chains.insert(n.clone(), c.clone());
            }
        }
        for (n, m) in &self.sets {
            if let Some(k) = m.single() {
                rs.sets.entry(n.clone()).or_default().kind = Some(k.clone());
            }
        }
        for ((s, k), m) in &self.elements {
            if let Some(v) = m.single() {
                rs.sets
                    .entry(s.clone())
                    .or_default()
                    .elements
                    .insert(k.clone(), v.clone());
            }
        }
        Some(rs)
    }

    /// The stored kernel input of one Service (empty when unknown).
    pub fn ports_of(&self, key: &SvcKey) -> &[SvcPort] {
        self.services.get(key).map_or(&[], |(p, _)| p.as_slice())
    }

    /// The whole stored kernel input, in [`super::input::build`]'s order.
    pub fn all_ports(&self) -> Vec<SvcPort> {
        self.services
            .values()
            .flat_map(|(p, _)| p.iter().cloned())
            .collect()
    }

    /// Replaces the Services `changes` name (primed state); `whole` is the whole input when
    /// the caller has it (else it is put together from the stored Services when needed).
    fn apply_changes(
        &mut self,
        changes: Vec<(SvcKey, Vec<SvcPort>)>,
        whole_input: Option<&[SvcPort]>,
    ) -> Update {
        let was_conflicted = !self.conflicts.is_empty();
        let rendered = changes.len();
        let mut touched = BTreeSet::new();
        for (key, g) in changes {
            if let Some((_, old)) = self.services.remove(&key) {
                self.contribute(&old, false, Some(&mut touched));
            }
            if !g.is_empty() {
                let frag = Fragment::of(
                    nft::render_on(&g, &self.cfg, &self.skeleton),
                    &self.skeleton,
                );
                self.contribute(&frag, true, Some(&mut touched));
                self.services.insert(key, (g, frag));
            }
        }
        let old_sub = if self.primed {
            Self::sub(&self.state, &touched)
        } else {
            Ruleset::default()
        };
        for item in &touched {
            match self.resolve(item) {
                Resolved::Absent => match item {
                    Item::Chain(n) => {
                        self.state.chains.remove(n);
                    }
                    Item::Set(n) => {
                        self.state.sets.remove(n);
                    }
                    Item::Element(s, k) => {
                        if let Some(set) = self.state.sets.get_mut(s) {
                            set.elements.remove(k);
                        }
                    }
                },
                Resolved::Chain(c) => {
                    if let Item::Chain(n) = item {
                        self.state.chains.insert(n.clone(), c);
                    }
                }
                Resolved::Set(k) => {
                    if let Item::Set(n) = item {
                        let s = self.state.sets.entry(n.clone()).or_default();
                        if s.kind.as_ref() != Some(&k) {
                            *s = Set {
                                kind: Some(k),
                                elements: std::mem::take(&mut s.elements),
                            };
                        }
                    }
                }
                Resolved::Value(v) => {
                    if let Item::Element(s, k) = item {
                        self.state
                            .sets
                            .entry(s.clone())
                            .or_default()
                            .elements
                            .insert(k.clone(), v);
                    }
                }
            }
        }
        let primed = std::mem::replace(&mut self.primed, true);
        if !self.conflicts.is_empty() || was_conflicted {
            // The first claim wins: only a whole render knows which (and, leaving a conflict,
            // the state had the whole render's, not the union's).
            let whole = match whole_input {
                Some(p) => nft::render(p, &self.cfg),
                None => nft::render(&self.all_ports(), &self.cfg),
            };
            let ops = if primed {
                nft::diff(&self.restore(&old_sub, &touched), &whole)
            } else {
                Vec::new()
            };
            self.state = whole;
            return Update {
                ops,
                full: !primed,
                rendered,
                whole: true,
            };
        }
        if !primed {
            return Update {
                ops: Vec::new(),
                full: true,
                rendered,
                whole: false,
            };
        }
        let new_sub = Self::sub(&self.state, &touched);
        Update {
            ops: nft::diff(&old_sub, &new_sub),
            full: false,
            rendered,
            whole: false,
        }
    }
}

/// An item as the union of the fragments has it.
enum Resolved {
    Absent,
    Chain(Chain),
    Set(SetKind),
    Value(Value),
}

#[cfg(test)]
mod tests;
