//! The store conformance suite against a real etcd (one fresh single-member etcd per case, on
//! loopback, its data in a temporary directory).

use std::sync::Arc;

use ferry_store::Store;
use ferry_store::etcd_store::testing::EtcdCluster;

ferry_store::conformance_tests!(async || {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = EtcdCluster::start(dir.path(), 1)
        .await
        .expect("starting etcd (install Debian's etcd-server: scripts/test-deps.sh)");
    let store = cluster.store("/registry").expect("etcd store");
    // Drop order: the cluster (kills etcd) before the directory.
    (Arc::new(store) as Arc<dyn Store>, (cluster, dir))
});
