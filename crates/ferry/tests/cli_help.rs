//! Each subcommand's `--help` lists only its own flags (issue 17).

use std::process::Command;

fn ferry(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .expect("run ferry")
}

#[test]
fn apiserver_help_hides_and_refuses_up_only_flags() {
    let api = String::from_utf8_lossy(&ferry(&["apiserver", "--help"]).stdout).to_string();
    let up = String::from_utf8_lossy(&ferry(&["up", "--help"]).stdout).to_string();
    for own in [
        "--listen-api",
        "--store",
        "--etcd-endpoints",
        "--service-cluster-ip-range",
    ] {
        assert!(api.contains(own), "apiserver --help lacks {own}:\n{api}");
    }
    for up_only in [
        "--listen-dns",
        "--nodes",
        "--pod-network",
        "--proxy-mode",
        "--ingress-http-addr",
        "--controllers-arg",
        "--cluster-cidr",
    ] {
        assert!(up.contains(up_only), "up --help lacks {up_only}");
        assert!(!api.contains(up_only), "apiserver --help shows {up_only}");
    }
    let out = ferry(&["apiserver", "--nodes", "3"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--nodes") && err.contains("ferry up"), "{err}");
}

/// The long flags a `--help` text lists (without `--help`/`--version`).
fn flags(args: &[&str]) -> std::collections::BTreeSet<String> {
    let out = ferry(args);
    assert!(out.status.success(), "ferry {args:?} failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-")
                .filter(|r| !r.starts_with('-'))
                .map_or(l, |r| r.split_once(", ").map_or(l, |(_, rest)| rest));
            let name = l.strip_prefix("--")?;
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            Some(format!("--{name}"))
        })
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

/// No subcommand's `--help` shows another's flags: a flag listed by two subcommands must be one
/// both really read with the same meaning (`ferry up` runs the API server, so it lists every
/// `ferry apiserver` flag).
#[test]
fn every_subcommand_lists_only_its_own_flags() {
    const SUBCOMMANDS: [&str; 10] = [
        "up",
        "apiserver",
        "dns",
        "controllers",
        "agent",
        "proxy",
        "ingress",
        "netpol",
        "exec-net",
        "agent-certificate",
    ];
    // Flags several components take, with one meaning (the component's kubeconfig, the node it
    // serves, the cluster's networks, the data directory of a `ferry up`...).
    const SHARED: [&str; 13] = [
        "--kubeconfig",
        "--node-name",
        "--node-ip",
        "--cluster-cidr",
        "--cluster-domain",
        "--pod-cidr",
        "--pod-network",
        "--cni-bin-dir",
        "--cni-conf-dir",
        "--proxy-mode",
        "--data-dir",
        "--tcp-idle-timeout",
        "--max-connections",
    ];
    let sets: Vec<(&str, std::collections::BTreeSet<String>)> = SUBCOMMANDS
        .iter()
        .map(|s| (*s, flags(&[s, "--help"])))
        .collect();
    for (name, set) in &sets {
        assert!(
            !set.is_empty() || *name == "netpol",
            "{name} --help lists no flags"
        );
    }
    let (_, up) = &sets[0];
    let (_, api) = &sets[1];
    assert!(api.is_subset(up), "ferry up lacks {:?}", api.difference(up));
    for (i, (a, fa)) in sets.iter().enumerate() {
        for (b, fb) in &sets[i + 1..] {
            if (*a, *b) == ("up", "apiserver") {
                continue;
            }
            for f in fa.intersection(fb) {
                assert!(
                    SHARED.contains(&f.as_str()),
                    "{f} is listed by both `ferry {a} --help` and `ferry {b} --help`"
                );
            }
        }
    }
    // The top level lists subcommands, not their flags.
    assert!(flags(&["--help"]).is_empty());
    // Spot checks that each lists its own.
    for (sub, own) in [
        ("dns", "--upstream"),
        ("controllers", "--leader-elect"),
        ("agent", "--state-dir"),
        ("proxy", "--masquerade-all"),
        ("ingress", "--controller-class"),
        ("agent-certificate", "--node-name"),
    ] {
        let set = &sets[SUBCOMMANDS.iter().position(|s| *s == sub).expect("known")].1;
        assert!(set.contains(own), "{sub} --help lacks {own}: {set:?}");
    }
}
