//! Root-only: CRI PullImage from Debian's docker-registry inside a test network namespace —
//! plain HTTP through a generated hosts.toml, then a registry with htpasswd auth (denied
//! without credentials, pulled with an AuthConfig). Skips (passing, with the reason printed)
//! without root, containerd, docker-registry, skopeo or htpasswd.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;
use ferry_cri::containerd::{self, RegistryHosts, Supervisor, SupervisorConfig};
use ferry_cri::{ErrorKind, client};

/// A docker-registry process in the test netns; killed (by pid) on drop.
struct Registry {
    child: Child,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_registry(netns: &str, dir: &Path, port: u16, htpasswd: Option<&Path>) -> Registry {
    let store = dir.join(format!("registry-{port}"));
    std::fs::create_dir_all(&store).expect("mkdir registry");
    let mut cfg = format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
        store.display()
    );
    if let Some(h) = htpasswd {
        cfg.push_str(&format!(
            "auth:\n  htpasswd:\n    realm: ferry-test\n    path: {}\n",
            h.display()
        ));
    }
    let cfg_path = dir.join(format!("registry-{port}.yml"));
    std::fs::write(&cfg_path, cfg).expect("write registry config");
    let log = std::fs::File::create(dir.join(format!("registry-{port}.log"))).expect("log");
    let child = Command::new("ip")
        .args(["netns", "exec", netns, "docker-registry", "serve"])
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start docker-registry");
    Registry { child }
}

fn in_netns(netns: &str, args: &[&str], env_tmp: &Path) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", netns])
        .args(args)
        .env("TMPDIR", env_tmp)
        .output()
        .expect("ip netns exec")
}

async fn wait_port(netns: &str, port: u16, tmp: &Path) {
    let probe = format!(": >/dev/tcp/127.0.0.1/{port}");
    poll(60, "registry listening", || {
        let ok = in_netns(netns, &["bash", "-c", &probe], tmp)
            .status
            .success();
        async move { ok.then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_from_plain_http_and_authenticated_registries() {
    let mut why = skip_reason();
    for tool in ["docker-registry", "skopeo", "htpasswd", "bash"] {
        if why.is_none()
            && !Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        {
            why = Some(format!(
                "{tool} not found (scripts/test-deps.sh installs it)"
            ));
        }
    }
    if let Some(why) = why {
        eprintln!("SKIP pull_from_plain_http_and_authenticated_registries: {why}");
        return;
    }
    let before = default_paths();
    let etc_before = etc_containerd();
    let tmp = tempfile::Builder::new()
        .prefix("ferry-cri-reg-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let netns = Netns::new("reg");
    let data = tmp.path().join("containerd");
    let result = tokio::spawn(registry_body(tmp.path().to_path_buf(), netns.name.clone())).await;
    let found = containerd::cleanup_leftovers(&data).await.expect("cleanup");
    if let Err(e) = result {
        tidy_default_paths(&before);
        drop(netns);
        std::panic::resume_unwind(e.into_panic());
    }
    assert!(
        found.shims.is_empty() && found.containerd.is_empty(),
        "{found:?}"
    );
    assert_nothing_left(&data, tmp.path());
    drop(netns);
    check_default_paths(&before);
    assert_eq!(etc_containerd(), etc_before, "/etc/containerd changed");
}

async fn registry_body(tmp: PathBuf, netns: String) {
    let (_pause, busybox_tar) = write_images(&tmp, ferry_cri::images::BUSYBOX_IMAGE);
    let htpasswd = tmp.join("htpasswd");
    let out = Command::new("htpasswd")
        .args(["-Bbn", "ferry", "s3cret"])
        .output()
        .expect("htpasswd");
    assert!(out.status.success());
    std::fs::write(&htpasswd, &out.stdout).expect("write htpasswd");
    let _open = start_registry(&netns, &tmp, 5000, None);
    let _auth = start_registry(&netns, &tmp, 5001, Some(&htpasswd));
    wait_port(&netns, 5000, &tmp).await;
    wait_port(&netns, 5001, &tmp).await;

    let src = format!("oci-archive:{}", busybox_tar.display());
    for (port, creds) in [(5000, None), (5001, Some("ferry:s3cret"))] {
        let dest = format!("docker://127.0.0.1:{port}/test/busybox:1");
        let mut args = vec![
            "skopeo",
            "--insecure-policy",
            "copy",
            "--dest-tls-verify=false",
        ];
        if let Some(c) = creds {
            args.extend(["--dest-creds", c]);
        }
        args.extend([src.as_str(), dest.as_str()]);
        let out = in_netns(&netns, &args, &tmp);
        assert!(
            out.status.success(),
            "skopeo copy to {port}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let data = tmp.join("containerd");
    std::fs::create_dir_all(&data).expect("mkdir");
    let mut cfg = SupervisorConfig::new(&data);
    cfg.options.snapshotter = containerd::choose_snapshotter(&data).into();
    cfg.netns = Some(PathBuf::from(format!("/run/netns/{netns}")));
    cfg.registries = vec![
        RegistryHosts::plain_http("127.0.0.1:5000"),
        RegistryHosts::plain_http("127.0.0.1:5001"),
        // docker.io through a mirror; the upstream is a closed loopback port, so the pull
        // can only succeed through the mirror (and nothing leaves the test netns).
        RegistryHosts {
            name: "docker.io".into(),
            server: "http://127.0.0.1:9".into(),
            mirrors: vec!["http://127.0.0.1:5000".into()],
            skip_verify: false,
        },
    ];
    let sup = Supervisor::start(cfg).await.expect("containerd starts");
    let c = sup.client();

    // Plain HTTP, no auth.
    let image = "127.0.0.1:5000/test/busybox:1";
    let r = c
        .pull_image(image, None, None)
        .await
        .expect("pull plain http");
    assert!(r.starts_with("sha256:"), "{r}");
    let st = c
        .image_status(image)
        .await
        .expect("status")
        .expect("pulled");
    assert!(st.repo_tags.iter().any(|t| t == image), "{st:?}");
    assert!(
        st.repo_digests
            .iter()
            .any(|d| d.starts_with("127.0.0.1:5000/test/busybox@sha256:")),
        "{st:?}"
    );
    c.remove_image(image).await.expect("remove image");
    assert!(c.image_status(image).await.expect("status").is_none());

    // Through the mirror.
    let mirrored = "docker.io/test/busybox:1";
    c.pull_image(mirrored, None, None)
        .await
        .expect("pull through the mirror");
    let st = c
        .image_status(mirrored)
        .await
        .expect("status")
        .expect("mirrored");
    assert!(st.repo_tags.iter().any(|t| t == mirrored), "{st:?}");

    // A tag that is not there.
    let e = c
        .pull_image("127.0.0.1:5000/test/busybox:absent", None, None)
        .await
        .expect_err("absent tag");
    assert_eq!(e.reason(), "ErrImagePull", "{e:?}");
    assert_eq!(e.kind, ErrorKind::NotFound, "{e:?}");

    // A malformed reference.
    let e = c
        .pull_image("127.0.0.1:5000/Test/BusyBox:1", None, None)
        .await
        .expect_err("upper-case repository");
    assert_eq!(e.reason(), "InvalidImageName", "{e:?}");

    // htpasswd: denied without credentials, pulled with them.
    let image = "127.0.0.1:5001/test/busybox:1";
    let e = c
        .pull_image(image, None, None)
        .await
        .expect_err("needs auth");
    assert_eq!(e.kind, ErrorKind::Unauthorized, "{e:?}");
    assert_eq!(e.reason(), "ErrImagePull");
    let wrong = client::basic_auth("127.0.0.1:5001", "ferry", "wrong");
    let e = c
        .pull_image(image, Some(wrong), None)
        .await
        .expect_err("wrong password");
    assert_eq!(e.kind, ErrorKind::Unauthorized, "{e:?}");
    let auth = client::basic_auth("127.0.0.1:5001", "ferry", "s3cret");
    c.pull_image(image, Some(auth), None)
        .await
        .expect("pull with auth");
    assert!(c.image_status(image).await.expect("status").is_some());

    // A crashed containerd is restarted (after the back-off) and keeps its images.
    let pid = sup.pid().expect("running");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill containerd");
    poll(60, "containerd restarted", || {
        let restarted = sup.restarts() >= 1 && sup.pid().is_some_and(|p| p != pid);
        async move { restarted.then_some(()) }
    })
    .await;
    c.wait_ready(std::time::Duration::from_secs(60))
        .await
        .expect("CRI answers after the restart");
    assert!(c.image_status(image).await.expect("status").is_some());
    sup.stop().await;
}
