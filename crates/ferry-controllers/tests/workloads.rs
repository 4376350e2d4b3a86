//! Deployment and ReplicaSet controllers (with the garbage collector) against the real API server.

mod lifecycle_common;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use lifecycle_common::*;
use serde_json::json;

fn deployment(name: &str, replicas: i32, strategy: serde_json::Value) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": strategy,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}
            }
        }
    }))
    .expect("deployment")
}

async fn pods_of(api: &Api<Pod>, app: &str) -> Vec<Pod> {
    api.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

async fn make_ready(api: &Api<Pod>, p: &Pod) {
    let now = jiff::Timestamp::now().to_string();
    let patch = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]}});
    let _ = api
        .patch_status(
            &p.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await;
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn wait_pods(api: &Api<Pod>, app: &str, n: usize) -> Vec<Pod> {
    eventually(20, || async {
        let p: Vec<Pod> = pods_of(api, app)
            .await
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        (p.len() == n).then_some(p)
    })
    .await
    .unwrap_or_else(|| panic!("{app}: never {n} pods"))
}

#[tokio::test]
async fn deployment_owns_replicaset_owns_pods_and_each_cascade() {
    let c = start().await;
    let deps: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let rss: Api<ReplicaSet> = Api::namespaced(c.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    for (name, dp) in [
        ("bg", DeleteParams::background()),
        ("fg", DeleteParams::foreground()),
        ("or", DeleteParams::orphan()),
    ] {
        let d = deps
            .create(&PostParams::default(), &deployment(name, 3, json!({})))
            .await
            .expect("create");
        let ps = wait_pods(&pods, name, 3).await;
        let rs_list: Vec<ReplicaSet> = rss
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await
            .expect("list")
            .items;
        assert_eq!(rs_list.len(), 1, "{name}: one ReplicaSet");
        let rs = &rs_list[0];
        let hash = rs
            .labels()
            .get("pod-template-hash")
            .cloned()
            .expect("hash label");
        assert_eq!(rs.name_any(), format!("{name}-{hash}"));
        let r = &rs.owner_references()[0];
        assert_eq!(
            (r.kind.as_str(), r.uid.as_str()),
            ("Deployment", d.uid().expect("uid").as_str())
        );
        assert_eq!(
            (r.controller, r.block_owner_deletion),
            (Some(true), Some(true))
        );
        for p in &ps {
            let r = &p.owner_references()[0];
            assert_eq!(r.kind, "ReplicaSet");
            assert_eq!(Some(r.uid.clone()), rs.uid());
            assert_eq!(p.labels().get("pod-template-hash"), Some(&hash));
        }
        // A pod of a foreground-deleted Deployment holds it: give one a finalizer.
        if name == "fg" {
            pods.patch(
                &ps[0].name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
            )
            .await
            .expect("patch");
        }
        deps.delete(name, &dp).await.expect("delete");
        match name {
            "bg" => {
                let gone = eventually(20, || async {
                    (pods_of(&pods, name).await.is_empty()
                        && rss.get_opt(&rs.name_any()).await.ok()?.is_none())
                    .then_some(())
                })
                .await;
                assert!(gone.is_some(), "background: dependents remain");
            }
            "fg" => {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                let d = deps
                    .get(name)
                    .await
                    .expect("deployment kept during foreground deletion");
                assert!(d.metadata.deletion_timestamp.is_some());
                assert!(d.finalizers().iter().any(|f| f == "foregroundDeletion"));
                pods.patch(
                    &ps[0].name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await
                .expect("patch");
                let gone = eventually(20, || async {
                    (deps.get_opt(name).await.ok()?.is_none()
                        && pods_of(&pods, name).await.is_empty())
                    .then_some(())
                })
                .await;
                assert!(
                    gone.is_some(),
                    "foreground: deployment not removed after its pods"
                );
            }
            _ => {
                let gone = eventually(20, || async {
                    deps.get_opt(name).await.ok()?.is_none().then_some(())
                })
                .await;
                assert!(gone.is_some());
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                let rs = rss
                    .get(&rs.name_any())
                    .await
                    .expect("orphaned ReplicaSet kept");
                assert!(rs.owner_references().is_empty());
                let ps = pods_of(&pods, name).await;
                assert_eq!(ps.len(), 3);
                for p in ps {
                    assert_eq!(p.owner_references()[0].kind, "ReplicaSet");
                }
            }
        }
    }
}

#[tokio::test]
async fn rolling_update_keeps_availability_and_scales() {
    let c = start().await;
    let deps: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}});
    deps.create(&PostParams::default(), &deployment("web", 4, strategy))
        .await
        .expect("create");
    for p in wait_pods(&pods, "web", 4).await {
        make_ready(&pods, &p).await;
    }
    let done = |generation: i64| {
        let deps = deps.clone();
        async move {
            let d = deps.get("web").await.ok()?;
            let s = d.status?;
            (s.observed_generation >= Some(generation)
                && s.updated_replicas == Some(4)
                && s.available_replicas == Some(4)
                && s.replicas == Some(4))
            .then_some(())
        }
    };
    assert!(
        eventually(20, || done(1)).await.is_some(),
        "initial rollout"
    );
    // Change the template; make new pods ready one at a time, slowly, and watch the floor.
    let d = deps
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}})))
        .await
        .expect("patch");
    let want_gen = d.metadata.generation.expect("generation");
    let mut min_ready = usize::MAX;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let ps = pods_of(&pods, "web").await;
        let live: Vec<&Pod> = ps
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let ready = live.iter().filter(|p| is_ready(p)).count();
        min_ready = min_ready.min(ready);
        assert!(
            live.len() <= 5,
            "more than replicas + maxSurge pods: {}",
            live.len()
        );
        if done(want_gen).await.is_some() {
            break;
        }
        if let Some(p) = live.iter().find(|p| !is_ready(p)) {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            make_ready(&pods, p).await;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rollout did not finish"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(min_ready >= 3, "ready pods dropped to {min_ready}");
    let live: Vec<Pod> = pods_of(&pods, "web").await;
    assert!(live.iter().all(|p| {
        p.spec.as_ref().expect("spec").containers[0]
            .image
            .as_deref()
            == Some("nginx:2")
    }));
    let d = deps.get("web").await.expect("get");
    assert_eq!(
        d.annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("2")
    );
    let conds = d.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(conds.iter().any(|c| c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True")));
    assert!(
        conds
            .iter()
            .any(|c| c.type_.as_deref() == Some("Progressing")
                && c.reason.as_deref() == Some("NewReplicaSetAvailable"))
    );
    // Scale through the scale subresource.
    deps.patch_scale(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 2}})),
    )
    .await
    .expect("scale");
    wait_pods(&pods, "web", 2).await;
}

#[tokio::test]
async fn recreate_removes_old_pods_first() {
    let c = start().await;
    let deps: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    deps.create(
        &PostParams::default(),
        &deployment("rec", 2, json!({"type": "Recreate"})),
    )
    .await
    .expect("create");
    wait_pods(&pods, "rec", 2).await;
    deps.patch("rec", &PatchParams::default(), &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}})))
        .await
        .expect("patch");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let ps: Vec<Pod> = pods_of(&pods, "rec").await;
        let images: Vec<String> = ps
            .iter()
            .filter_map(|p| p.spec.as_ref()?.containers[0].image.clone())
            .collect();
        assert!(
            !(images.iter().any(|i| i == "nginx:1") && images.iter().any(|i| i == "nginx:2")),
            "old and new pods together: {images:?}"
        );
        if images.len() == 2 && images.iter().all(|i| i == "nginx:2") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "recreate did not finish: {images:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn progress_deadline_exceeded_when_pods_never_become_ready() {
    let c = start().await;
    let deps: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let mut d = deployment("slow", 2, json!({}));
    d.spec.progress_deadline_seconds = Some(1);
    deps.create(&PostParams::default(), &d)
        .await
        .expect("create");
    let timed_out = eventually(20, || async {
        let d = deps.get("slow").await.ok()?;
        d.status?.conditions?.into_iter().find(|c| {
            c.type_.as_deref() == Some("Progressing")
                && c.status.as_deref() == Some("False")
                && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
        })
    })
    .await;
    assert!(timed_out.is_some(), "no ProgressDeadlineExceeded");
}
