//! The one kube client builder of Ferry's components (controllers, node agent, proxy, DNS,
//! ingress, network policy agent, `ferry up`): a kubeconfig file when the component's
//! `--kubeconfig` flag names one, else kube's inference (`$KUBECONFIG`, `~/.kube/config`, then
//! the in-cluster service account), as client-go's `BuildConfigFromFlags` does.

pub mod events;
mod resource;
pub mod watch;

/// What the crate's macros name (not an API).
#[doc(hidden)]
pub mod __private {
    pub use k8s_openapi;
    pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    pub use kube;
}

use std::path::{Path, PathBuf};

use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The named kubeconfig cannot be read or does not describe a usable context.
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    /// No kubeconfig was named and none could be inferred.
    #[error("no kubeconfig given and none inferred: {0}")]
    Infer(#[from] InferConfigError),
    /// The configuration is complete but the client cannot be built from it (e.g. bad TLS data).
    #[error("building the kube client: {0}")]
    Client(#[from] kube::Error),
}

/// The client configuration from the kubeconfig flag (`None`: inferred).
pub async fn config(kubeconfig: Option<&Path>) -> Result<kube::Config, Error> {
    match kubeconfig {
        Some(path) => from_file(path, |kc| kc).await,
        None => Ok(kube::Config::infer().await?),
    }
}

/// A client from the kubeconfig flag (`None`: inferred).
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    Ok(kube::Client::try_from(config(kubeconfig).await?)?)
}

/// The configuration of a kubeconfig file with every cluster's `server` rewritten by `server`
/// (for a component that reaches the same API server at another address, e.g. from a network
/// namespace).
pub async fn config_with_server(
    kubeconfig: &Path,
    server: impl Fn(&str) -> String,
) -> Result<kube::Config, Error> {
    from_file(kubeconfig, |mut kc| {
        for c in &mut kc.clusters {
            if let Some(s) = c.cluster.as_mut().and_then(|cl| cl.server.as_mut()) {
                *s = server(s);
            }
        }
        kc
    })
    .await
}

/// A client from [`config_with_server`].
pub async fn client_with_server(
    kubeconfig: &Path,
    server: impl Fn(&str) -> String,
) -> Result<kube::Client, Error> {
    Ok(kube::Client::try_from(
        config_with_server(kubeconfig, server).await?,
    )?)
}

async fn from_file(
    path: &Path,
    edit: impl FnOnce(Kubeconfig) -> Kubeconfig,
) -> Result<kube::Config, Error> {
    let wrap = |source| Error::Kubeconfig {
        path: path.to_path_buf(),
        source,
    };
    let kc = Kubeconfig::read_from(path).map_err(wrap)?;
    kube::Config::from_custom_kubeconfig(edit(kc), &KubeConfigOptions::default())
        .await
        .map_err(wrap)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
contexts:
- name: x
  context: {cluster: c, user: u, namespace: team}
current-context: x
";

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[tokio::test]
    async fn reads_the_named_kubeconfig() {
        let f = file(KUBECONFIG);
        let c = config(Some(f.path())).await.unwrap();
        assert_eq!(c.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(c.default_namespace, "team");
        client(Some(f.path())).await.unwrap();
    }

    #[tokio::test]
    async fn a_missing_or_broken_kubeconfig_names_the_file() {
        let missing = Path::new("/nonexistent/ferry-kubeconfig");
        let e = config(Some(missing)).await.unwrap_err();
        assert!(matches!(e, Error::Kubeconfig { .. }), "{e:?}");
        assert!(
            e.to_string().contains("/nonexistent/ferry-kubeconfig"),
            "{e}"
        );
        let f = file("current-context: nowhere\n");
        let e = config(Some(f.path())).await.unwrap_err();
        assert!(matches!(e, Error::Kubeconfig { .. }), "{e:?}");
    }

    #[tokio::test]
    async fn servers_are_rewritten() {
        let f = file(KUBECONFIG);
        let seen = std::sync::Mutex::new(Vec::new());
        let c = config_with_server(f.path(), |s| {
            seen.lock().unwrap().push(s.to_string());
            "https://10.0.0.1:7443".into()
        })
        .await
        .unwrap();
        assert_eq!(*seen.lock().unwrap(), ["https://127.0.0.1:6443"]);
        assert_eq!(c.cluster_url.to_string(), "https://10.0.0.1:7443/");
        client_with_server(f.path(), |_| "http://10.0.0.1:8080".into())
            .await
            .unwrap();
    }
}
