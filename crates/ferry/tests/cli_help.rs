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
