//! `/readyz` as kube-apiserver serves it: named checks, `?verbose` lists them, `?exclude=NAME`
//! skips one, `/readyz/NAME` runs one. Besides the API server's own checks, `ferry up`
//! registers one per component it runs in the same process (DNS, proxy, agent,
//! controllers), so readiness reflects a component that crashed or cannot serve.

use std::sync::{Arc, RwLock};

/// Why a check fails: the reason `?verbose` shows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

impl From<&str> for NotReady {
    fn from(s: &str) -> Self {
        NotReady(s.to_string())
    }
}

impl From<String> for NotReady {
    fn from(s: String) -> Self {
        NotReady(s)
    }
}

/// A check: `Ok` when ready, `Err(reason)` otherwise.
pub type CheckFn = Arc<dyn Fn() -> Result<(), NotReady> + Send + Sync>;

/// The registered checks, in registration order.
#[derive(Clone, Default)]
pub struct Checks(Arc<RwLock<Vec<(String, CheckFn)>>>);

impl Checks {
    /// Adds (or replaces) the check `name`.
    pub fn add(&self, name: &str, f: impl Fn() -> Result<(), NotReady> + Send + Sync + 'static) {
        let mut g = self.0.write().unwrap_or_else(|p| p.into_inner());
        let f: CheckFn = Arc::new(f);
        match g.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = f,
            None => g.push((name.to_string(), f)),
        }
    }

    /// Runs every check.
    pub fn run(&self) -> Vec<(String, Result<(), NotReady>)> {
        let list: Vec<(String, CheckFn)> = self
            .0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, f)| (n.clone(), f.clone()))
            .collect();
        list.into_iter().map(|(n, f)| (n, f())).collect()
    }
}

/// The name of the store's check: it fails while the store refuses writes (disk full, file
/// system read-only, data directory gone), as upstream's `etcd` check fails while etcd cannot
/// serve; the reason shows with `?verbose`.
pub const STORE_CHECK: &str = "store-writable";

/// The store's check (see [`STORE_CHECK`]).
pub fn store_check(
    store: Arc<dyn ferry_store::Store>,
) -> impl Fn() -> Result<(), NotReady> + Send + Sync + 'static {
    move || match store.write_fault() {
        None => Ok(()),
        Some(e) => Err(NotReady(e.to_string())),
    }
}

/// The answer to `GET /readyz[/name][?query]`: status code and text body (pure).
pub fn render(
    results: &[(String, Result<(), NotReady>)],
    only: Option<&str>,
    query: Option<&str>,
) -> (u16, String) {
    let mut verbose = false;
    let mut exclude: Vec<String> = Vec::new();
    for kv in query.unwrap_or_default().split('&') {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "verbose" => verbose = v != "false" && v != "0",
            "exclude" => exclude.push(v.to_string()),
            _ => {}
        }
    }
    if let Some(name) = only {
        return match results.iter().find(|(n, _)| n == name) {
            Some((_, Ok(()))) => (200, "ok".into()),
            Some((_, Err(e))) => (500, format!("internal server error: {e}\n")),
            None => (404, "404 page not found\n".into()),
        };
    }
    let mut body = String::new();
    let mut failed = false;
    for (name, r) in results {
        if exclude.iter().any(|e| e == name) {
            body.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        match r {
            Ok(()) => body.push_str(&format!("[+]{name} ok\n")),
            Err(e) => {
                failed = true;
                if verbose {
                    body.push_str(&format!("[-]{name} failed: {e}\n"));
                } else {
                    body.push_str(&format!("[-]{name} failed: reason withheld\n"));
                }
            }
        }
    }
    if failed {
        body.push_str("readyz check failed\n");
        (500, body)
    } else if verbose {
        body.push_str("readyz check passed\n");
        (200, body)
    } else {
        (200, "ok".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results(dns: Result<(), NotReady>) -> Vec<(String, Result<(), NotReady>)> {
        vec![
            ("ping".into(), Ok(())),
            ("ferry-dns".into(), dns),
            ("ferry-proxy".into(), Ok(())),
        ]
    }

    #[test]
    fn table() {
        let ok = results(Ok(()));
        let bad = results(Err("panicked: boom; restarting in 1s".into()));
        assert_eq!(render(&ok, None, None), (200, "ok".into()));
        assert_eq!(
            render(&ok, None, Some("verbose")),
            (
                200,
                "[+]ping ok\n[+]ferry-dns ok\n[+]ferry-proxy ok\nreadyz check passed\n".into()
            )
        );
        let (code, body) = render(&bad, None, None);
        assert_eq!(code, 500);
        assert!(
            body.contains("[-]ferry-dns failed: reason withheld\n"),
            "{body}"
        );
        assert!(body.ends_with("readyz check failed\n"));
        let (code, body) = render(&bad, None, Some("verbose"));
        assert_eq!(code, 500);
        assert!(
            body.contains("[-]ferry-dns failed: panicked: boom"),
            "{body}"
        );
        let (code, body) = render(&bad, None, Some("verbose&exclude=ferry-dns"));
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("[+]ferry-dns excluded: ok"));
        assert_eq!(render(&bad, Some("ferry-proxy"), None), (200, "ok".into()));
        assert_eq!(render(&bad, Some("ferry-dns"), None).0, 500);
        assert_eq!(render(&bad, Some("nope"), None).0, 404);
    }

    #[test]
    fn registry() {
        let c = Checks::default();
        c.add("a", || Ok(()));
        c.add("b", || Err("no".into()));
        c.add("a", || Err("replaced".into()));
        let r = c.run();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0], ("a".to_string(), Err(NotReady("replaced".into()))));
    }
}
