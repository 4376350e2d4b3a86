//! Defaulting of `ipFamilyPolicy`, `ipFamilies` and `clusterIPs` (seed 004 §11, upstream's
//! `initIPFamilyFields`), done with allocation in the create/update path. No IO.

use std::net::IpAddr;

use ferry_api::errors::{FieldError, Path};

use super::cidr::Family;

pub const SINGLE: &str = "SingleStack";
pub const PREFER: &str = "PreferDualStack";
pub const REQUIRE: &str = "RequireDualStack";

/// The IP-related fields of a Service spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpFields {
    pub type_: String,
    pub has_selector: bool,
    pub policy: Option<String>,
    pub families: Vec<String>,
    pub cluster_ips: Vec<String>,
}

impl IpFields {
    pub fn headless(&self) -> bool {
        self.cluster_ips.first().is_some_and(|ip| ip == "None")
    }
    /// Whether the type gets cluster IPs at all.
    pub fn wants_ips(&self) -> bool {
        self.type_ != "ExternalName"
    }
}

fn family_of(ip: &str) -> Option<Family> {
    ip.parse::<IpAddr>().ok().map(|ip| Family::of(&ip))
}

fn configured(cluster: &[Family], f: &str) -> bool {
    Family::parse(f).is_some_and(|f| cluster.contains(&f))
}

/// Fills `policy` and `families` of `svc` for a cluster whose service ranges have the families
/// `cluster` (primary first). `old` is the stored Service on update.
pub fn init_ip_families(
    svc: &mut IpFields,
    old: Option<&IpFields>,
    cluster: &[Family],
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if !svc.wants_ips() {
        return errs;
    }
    let Some(primary) = cluster.first().copied() else {
        return errs;
    };
    let spec = Path::new("spec");
    // An unchanged PreferDualStack service is not upgraded or downgraded when the cluster changes.
    if let Some(old) = old
        && old.wants_ips()
        && svc.policy.as_deref() == Some(PREFER)
        && old.policy.as_deref() == Some(PREFER)
        && svc.cluster_ips == old.cluster_ips
        && svc.families == old.families
    {
        return errs;
    }
    if svc.policy.is_none()
        && let Some(old) = old
        && old.policy.is_some()
        && old.wants_ips()
    {
        svc.policy = old.policy.clone();
    }
    // Headless services without a selector: dual-stack unless told otherwise, on any cluster.
    if svc.headless() && !svc.has_selector {
        let policy = svc
            .policy
            .get_or_insert_with(|| REQUIRE.to_string())
            .clone();
        if svc.families.is_empty() {
            svc.families.push(primary.as_str().to_string());
        }
        if policy != SINGLE
            && svc.families.len() == 1
            && let Some(f) = Family::parse(&svc.families[0])
        {
            svc.families.push(f.other().as_str().to_string());
        }
        return errs;
    }
    if let Some(old) = old {
        if svc.policy.as_deref() == Some(SINGLE) {
            if svc.cluster_ips == old.cluster_ips && svc.cluster_ips.len() > 1 {
                svc.cluster_ips.truncate(1);
            }
            if svc.families == old.families && svc.families.len() > 1 {
                svc.families.truncate(1);
            }
        } else {
            if svc.cluster_ips.len() < old.cluster_ips.len() && !svc.cluster_ips.is_empty() {
                errs.push(FieldError::invalid(
                    spec.child("clusterIPs"),
                    format!("{:?}", svc.cluster_ips),
                    "may not be reduced when ipFamilyPolicy is not SingleStack",
                ));
            }
            if svc.families.len() < old.families.len() && !svc.families.is_empty() {
                errs.push(FieldError::invalid(
                    spec.child("ipFamilies"),
                    format!("{:?}", svc.families),
                    "may not be reduced when ipFamilyPolicy is not SingleStack",
                ));
            }
        }
    }
    if svc.policy.as_deref() == Some(SINGLE) {
        if svc.families.len() > 1 {
            errs.push(FieldError::invalid(
                spec.child("ipFamilies"),
                format!("{:?}", svc.families),
                "when spec.ipFamilyPolicy is SingleStack, spec.ipFamilies must contain one family",
            ));
        }
        if svc.cluster_ips.len() > 1 {
            errs.push(FieldError::invalid(
                spec.child("clusterIPs"),
                format!("{:?}", svc.cluster_ips),
                "when spec.ipFamilyPolicy is SingleStack, spec.clusterIPs must contain one IP",
            ));
        }
    }
    // Families follow user-chosen IPs.
    for (i, ip) in svc.cluster_ips.clone().iter().enumerate() {
        if ip == "None" {
            break;
        }
        let Some(fam) = family_of(ip) else { continue };
        if i >= svc.families.len() {
            if cluster.contains(&fam) {
                svc.families.push(fam.as_str().to_string());
            } else {
                errs.push(FieldError::invalid_str(
                    spec.child("clusterIPs").index(i),
                    ip,
                    format!("{} is not configured on this cluster", fam.as_str()),
                ));
            }
        }
    }
    if !errs.is_empty() {
        return errs;
    }
    if svc.policy.is_none() {
        svc.policy = Some(
            if svc.families.len() > 1 || svc.cluster_ips.len() > 1 {
                REQUIRE
            } else {
                SINGLE
            }
            .to_string(),
        );
    }
    if svc.policy.as_deref() == Some(REQUIRE) && cluster.len() < 2 {
        errs.push(FieldError::invalid(
            spec.child("ipFamilyPolicy"),
            format!("{:?}", REQUIRE),
            "this cluster is not configured for dual-stack services",
        ));
    }
    for (i, f) in svc.families.iter().enumerate() {
        if !configured(cluster, f) {
            errs.push(FieldError::invalid_str(
                spec.child("ipFamilies").index(i),
                f,
                format!("{f} is not configured on this cluster"),
            ));
        }
    }
    if !errs.is_empty() {
        return errs;
    }
    if svc.families.is_empty() {
        svc.families.push(primary.as_str().to_string());
    }
    if svc.policy.as_deref() != Some(SINGLE)
        && svc.families.len() == 1
        && cluster.len() == 2
        && let Some(f) = Family::parse(&svc.families[0])
    {
        svc.families.push(f.other().as_str().to_string());
    }
    errs
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn f(policy: Option<&str>, fams: &[&str], ips: &[&str]) -> IpFields {
        IpFields {
            type_: "ClusterIP".into(),
            has_selector: true,
            policy: policy.map(String::from),
            families: fams.iter().map(|s| s.to_string()).collect(),
            cluster_ips: ips.iter().map(|s| s.to_string()).collect(),
        }
    }

    const V4: &[Family] = &[Family::V4];
    const V6: &[Family] = &[Family::V6];
    const V4V6: &[Family] = &[Family::V4, Family::V6];
    const V6V4: &[Family] = &[Family::V6, Family::V4];

    #[test]
    fn create_table() {
        // (cluster, policy, families, ips) -> Ok(policy, families) | Err(field)
        type Case<'a> = (
            &'a [Family],
            Option<&'a str>,
            &'a [&'a str],
            &'a [&'a str],
            Result<(&'a str, &'a [&'a str]), &'a str>,
        );
        let cases: &[Case] = &[
            (V4, None, &[], &[], Ok((SINGLE, &["IPv4"]))),
            (V6, None, &[], &[], Ok((SINGLE, &["IPv6"]))),
            (V4V6, None, &[], &[], Ok((SINGLE, &["IPv4"]))),
            (V6V4, None, &[], &[], Ok((SINGLE, &["IPv6"]))),
            (V4V6, Some(SINGLE), &["IPv6"], &[], Ok((SINGLE, &["IPv6"]))),
            (
                V4V6,
                Some(PREFER),
                &[],
                &[],
                Ok((PREFER, &["IPv4", "IPv6"])),
            ),
            (
                V4V6,
                Some(REQUIRE),
                &[],
                &[],
                Ok((REQUIRE, &["IPv4", "IPv6"])),
            ),
            (
                V6V4,
                Some(PREFER),
                &[],
                &[],
                Ok((PREFER, &["IPv6", "IPv4"])),
            ),
            (
                V4V6,
                Some(PREFER),
                &["IPv6", "IPv4"],
                &[],
                Ok((PREFER, &["IPv6", "IPv4"])),
            ),
            (
                V4V6,
                Some(PREFER),
                &["IPv6"],
                &[],
                Ok((PREFER, &["IPv6", "IPv4"])),
            ),
            (V4, Some(PREFER), &[], &[], Ok((PREFER, &["IPv4"]))),
            (V4, Some(REQUIRE), &[], &[], Err("spec.ipFamilyPolicy")),
            (V4, None, &["IPv6"], &[], Err("spec.ipFamilies[0]")),
            (
                V4,
                Some(PREFER),
                &["IPv4", "IPv6"],
                &[],
                Err("spec.ipFamilies[1]"),
            ),
            (V4, None, &[], &["fd00::1"], Err("spec.clusterIPs[0]")),
            (
                V4V6,
                None,
                &[],
                &["10.0.0.1", "fd00::1"],
                Ok((REQUIRE, &["IPv4", "IPv6"])),
            ),
            (V4V6, None, &[], &["fd00::1"], Ok((SINGLE, &["IPv6"]))),
            (
                V4V6,
                Some(SINGLE),
                &["IPv4", "IPv6"],
                &[],
                Err("spec.ipFamilies"),
            ),
            // Headless with a selector: like any other service.
            (V4V6, None, &[], &["None"], Ok((SINGLE, &["IPv4"]))),
        ];
        for (i, (cluster, policy, fams, ips, want)) in cases.iter().enumerate() {
            let mut s = f(*policy, fams, ips);
            let errs = init_ip_families(&mut s, None, cluster);
            match want {
                Ok((p, fs)) => {
                    assert!(errs.is_empty(), "case {i}: {errs:?}");
                    assert_eq!(s.policy.as_deref(), Some(*p), "case {i}");
                    assert_eq!(s.families, *fs, "case {i}");
                }
                Err(field) => {
                    assert!(
                        errs.iter().any(|e| e.field == *field),
                        "case {i}: want {field}, got {errs:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn headless_selectorless_is_dual_stack_anywhere() {
        for cluster in [V4, V4V6] {
            let mut s = f(None, &[], &["None"]);
            s.has_selector = false;
            assert!(init_ip_families(&mut s, None, cluster).is_empty());
            assert_eq!(s.policy.as_deref(), Some(REQUIRE));
            assert_eq!(s.families, ["IPv4", "IPv6"]);
        }
        let mut s = f(Some(SINGLE), &[], &["None"]);
        s.has_selector = false;
        assert!(init_ip_families(&mut s, None, V4V6).is_empty());
        assert_eq!(s.families, ["IPv4"]);
    }

    #[test]
    fn external_name_untouched() {
        let mut s = f(None, &[], &[]);
        s.type_ = "ExternalName".into();
        let before = s.clone();
        assert!(init_ip_families(&mut s, None, V4V6).is_empty());
        assert_eq!(s, before);
    }

    #[test]
    fn update_downgrade_and_upgrade() {
        let old = f(Some(PREFER), &["IPv4", "IPv6"], &["10.0.0.5", "fd00::5"]);
        // Downgrade: policy SingleStack with unchanged IPs keeps only the first.
        let mut s = old.clone();
        s.policy = Some(SINGLE.into());
        assert!(init_ip_families(&mut s, Some(&old), V4V6).is_empty());
        assert_eq!(s.cluster_ips, ["10.0.0.5"]);
        assert_eq!(s.families, ["IPv4"]);
        // Upgrade: SingleStack -> PreferDualStack adds the missing family.
        let old = f(Some(SINGLE), &["IPv4"], &["10.0.0.5"]);
        let mut s = old.clone();
        s.policy = Some(PREFER.into());
        assert!(init_ip_families(&mut s, Some(&old), V4V6).is_empty());
        assert_eq!(s.families, ["IPv4", "IPv6"]);
        // Policy omitted on update: the old one is kept.
        let mut s = f(None, &[], &["10.0.0.5"]);
        assert!(init_ip_families(&mut s, Some(&old), V4V6).is_empty());
        assert_eq!(s.policy.as_deref(), Some(SINGLE));
        assert_eq!(s.families, ["IPv4"]);
    }
}
