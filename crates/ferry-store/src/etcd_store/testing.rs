//! Starting real etcd processes on loopback for tests (Debian's `etcd-server`; the binary is
//! `$FERRY_ETCD_BIN`, else `/usr/bin/etcd`, else `etcd` on `PATH`).

use super::*;
use std::process::{Child, Command, Stdio};

/// The etcd binary to run, if there is one.
pub fn etcd_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("FERRY_ETCD_BIN") {
        return Some(PathBuf::from(p));
    }
    let debian = PathBuf::from("/usr/bin/etcd");
    if debian.exists() {
        return Some(debian);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("etcd"))
            .find(|p| p.exists())
    })
}

fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

struct Member {
    name: String,
    client_url: String,
    peer_url: String,
    data_dir: PathBuf,
    child: Option<Child>,
}

/// An etcd cluster of one or more members on loopback; every process is killed on drop.
pub struct EtcdCluster {
    members: Vec<Member>,
    binary: PathBuf,
    initial_cluster: String,
    log_dir: PathBuf,
}

impl EtcdCluster {
    /// Starts `n` members with their data under `dir` and waits until the cluster answers.
    pub async fn start(dir: &Path, n: usize) -> std::io::Result<EtcdCluster> {
        std::fs::create_dir_all(dir)?;
        let binary = etcd_binary().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "etcd not found (install Debian's etcd-server: scripts/test-deps.sh)",
            )
        })?;
        let mut members = Vec::new();
        for i in 0..n {
            members.push(Member {
                name: format!("m{i}"),
                client_url: format!("http://127.0.0.1:{}", free_port()?),
                peer_url: format!("http://127.0.0.1:{}", free_port()?),
                data_dir: dir.join(format!("m{i}")),
                child: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            binary,
            initial_cluster,
            log_dir: dir.to_path_buf(),
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        cluster.wait_ready(Duration::from_secs(20)).await?;
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> std::io::Result<()> {
        let m = &mut self.members[i];
        let log = std::fs::File::create(self.log_dir.join(format!("{}.log", m.name)))?;
        let child = Command::new(&self.binary)
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .arg("--listen-client-urls")
            .arg(&m.client_url)
            .arg("--advertise-client-urls")
            .arg(&m.client_url)
            .arg("--listen-peer-urls")
            .arg(&m.peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&m.peer_url)
            .arg("--initial-cluster")
            .arg(&self.initial_cluster)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg("ferry-test")
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        m.child = Some(child);
        Ok(())
    }

    /// Waits until a write-capable read (linearizable) succeeds on every running member.
    pub async fn wait_ready(&self, within: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + within;
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            let store = EtcdStore::new(EtcdOptions {
                endpoints: vec![m.client_url.clone()],
                request_timeout: Duration::from_secs(1),
                ..Default::default()
            })
            .map_err(std::io::Error::other)?;
            loop {
                match store.current_revision().await {
                    Ok(_) => break,
                    Err(e) if Instant::now() > deadline => {
                        return Err(std::io::Error::other(format!(
                            "etcd {} not ready: {e}",
                            m.client_url
                        )));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        Ok(())
    }

    /// Client URLs of all members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// The index of the current leader, asking the running members.
    pub async fn leader(&self) -> Option<usize> {
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            if let Ok(st) = member_status(&m.client_url, Duration::from_secs(1)).await {
                if st.leader == 0 {
                    continue;
                }
                for (j, other) in self.members.iter().enumerate() {
                    if other.child.is_none() {
                        continue;
                    }
                    if let Ok(o) = member_status(&other.client_url, Duration::from_secs(1)).await
                        && o.member_id == st.leader
                    {
                        return Some(j);
                    }
                }
            }
        }
        None
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its old data.
    pub fn restart(&mut self, i: usize) -> std::io::Result<()> {
        self.kill(i);
        self.spawn(i)
    }

    /// A store on this cluster.
    pub fn store(&self, prefix: &str) -> Result<EtcdStore> {
        EtcdStore::new(EtcdOptions {
            endpoints: self.endpoints(),
            prefix: prefix.to_string(),
            ..Default::default()
        })
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
