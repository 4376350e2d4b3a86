//! `kube::Resource` for slim projections of core/v1 kinds: a component that keeps a few fields
//! of Pods (or Nodes, Namespaces...) decodes them into its own struct with a `metadata:
//! ObjectMeta` field, and watches and lists it through kube-rs as it would the full kind.

/// Implements `kube::Resource` for `$t` as the core/v1 kind `$kind` (`group: ""`,
/// `version: v1`), its plural `$plural` and its scope (`NamespaceResourceScope` or
/// `ClusterResourceScope`). `$t` needs a `metadata: ObjectMeta` field.
///
/// ```
/// #[derive(Clone, Debug, serde::Deserialize)]
/// struct SlimNode {
///     metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
/// }
/// ferry_kubeclient::core_v1_resource!(SlimNode, "Node", "nodes", ClusterResourceScope);
/// assert_eq!(<SlimNode as kube::Resource>::plural(&()), "nodes");
/// ```
#[macro_export]
macro_rules! core_v1_resource {
    ($t:ty, $kind:literal, $plural:literal, $scope:ident) => {
        impl $crate::__private::kube::Resource for $t {
            type DynamicType = ();
            type Scope = $crate::__private::k8s_openapi::$scope;
            fn kind(_: &()) -> ::std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> ::std::borrow::Cow<'_, str> {
                "".into()
            }
            fn version(_: &()) -> ::std::borrow::Cow<'_, str> {
                "v1".into()
            }
            fn plural(_: &()) -> ::std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &$crate::__private::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut $crate::__private::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// Implements `kube::Resource` for `$t`, a slim projection of core/v1 Pods
/// ([`core_v1_resource!`] with `"Pod"`, `"pods"`, namespaced).
#[macro_export]
macro_rules! pod_resource {
    ($t:ty) => {
        $crate::core_v1_resource!($t, "Pod", "pods", NamespaceResourceScope);
    };
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::Resource;

    #[derive(Clone, Debug, Default, serde::Deserialize)]
    struct SlimPod {
        metadata: ObjectMeta,
        #[serde(default)]
        ip: Option<String>,
    }
    crate::pod_resource!(SlimPod);

    #[derive(Clone, Debug, Default, serde::Deserialize)]
    struct SlimNamespace {
        metadata: ObjectMeta,
    }
    crate::core_v1_resource!(
        SlimNamespace,
        "Namespace",
        "namespaces",
        ClusterResourceScope
    );

    /// The same type and URL facts as the full kinds of k8s-openapi.
    fn same_as<Slim, Full>()
    where
        Slim: Resource<DynamicType = ()>,
        Full: Resource<DynamicType = ()>,
    {
        assert_eq!(Slim::kind(&()), Full::kind(&()));
        assert_eq!(Slim::group(&()), Full::group(&()));
        assert_eq!(Slim::version(&()), Full::version(&()));
        assert_eq!(Slim::plural(&()), Full::plural(&()));
        assert_eq!(Slim::api_version(&()), Full::api_version(&()));
        assert_eq!(
            Slim::url_path(&(), Some("default")),
            Full::url_path(&(), Some("default"))
        );
        assert_eq!(Slim::url_path(&(), None), Full::url_path(&(), None));
    }

    #[test]
    fn slim_kinds_address_the_same_api_as_the_full_ones() {
        same_as::<SlimPod, k8s_openapi::api::core::v1::Pod>();
        same_as::<SlimNamespace, k8s_openapi::api::core::v1::Namespace>();
    }

    #[test]
    fn meta_is_the_metadata_field() {
        let mut p = SlimPod {
            ip: Some("10.0.0.1".into()),
            ..SlimPod::default()
        };
        p.meta_mut().name = Some("web-0".into());
        assert_eq!(p.meta().name.as_deref(), Some("web-0"));
        assert_eq!(p.metadata.name.as_deref(), Some("web-0"));
        assert_eq!(p.ip.as_deref(), Some("10.0.0.1"));
    }
}
