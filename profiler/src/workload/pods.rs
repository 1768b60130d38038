//! The pods of this node as the Kubernetes API describes them: only what labels need, kept up
//! to date by the watcher (kube.rs) and read by the push path.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use serde::Deserialize;

/// What a pod's processes are labelled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    /// `app.kubernetes.io/name`, else `app`.
    pub app: Option<String>,
    /// Container ID (without the runtime's `containerd://` scheme) → container name.
    pub containers: HashMap<String, String>,
}

/// Pods by UID, shared between the watcher and the agent loop.
#[derive(Debug, Clone, Default)]
pub struct Pods(Arc<RwLock<HashMap<String, PodInfo>>>);

impl Pods {
    pub fn get(&self, uid: &str) -> Option<PodInfo> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).get(uid).cloned()
    }

    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn replace_all(&self, pods: Vec<Pod>) {
        let map = pods.into_iter().filter_map(|p| p.into_entry()).collect();
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = map;
    }

    pub(crate) fn upsert(&self, pod: Pod) {
        if let Some((uid, info)) = pod.into_entry() {
            self.0.write().unwrap_or_else(|p| p.into_inner()).insert(uid, info);
        }
    }

    pub(crate) fn remove(&self, pod: &Pod) {
        if let Some(uid) = &pod.metadata.uid {
            self.0.write().unwrap_or_else(|p| p.into_inner()).remove(uid);
        }
    }
}

// The few fields of the API's Pod, PodList and watch events that are read.

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: PodStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ObjectMeta {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodStatus {
    #[serde(default)]
    pub container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    pub init_container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    pub ephemeral_container_statuses: Vec<ContainerStatus>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ContainerStatus {
    pub name: String,
    #[serde(rename = "containerID")]
    pub container_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodList {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub items: Vec<Pod>,
}

/// One line of a watch stream.
#[derive(Debug, Deserialize)]
pub(crate) struct WatchEvent {
    #[serde(rename = "type")]
    pub kind: String,
    pub object: serde_json::Value,
}

impl Pod {
    fn into_entry(self) -> Option<(String, PodInfo)> {
        let m = self.metadata;
        let app = m.labels.get("app.kubernetes.io/name").or_else(|| m.labels.get("app")).cloned();
        let s = self.status;
        let containers = s
            .container_statuses
            .into_iter()
            .chain(s.init_container_statuses)
            .chain(s.ephemeral_container_statuses)
            .filter_map(|c| {
                let id = c.container_id?;
                // `containerd://<id>`, `cri-o://<id>`, `docker://<id>`.
                let id = id.rsplit_once("://").map_or(id.as_str(), |(_, id)| id).to_ascii_lowercase();
                Some((id, c.name))
            })
            .collect();
        Some((m.uid?, PodInfo { namespace: m.namespace?, name: m.name?, app, containers }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_from_api_json() {
        let list: PodList = serde_json::from_str(
            r#"{"kind":"PodList","metadata":{"resourceVersion":"42"},"items":[{"metadata":{"name":"trainer-0","namespace":"ml","uid":"u-1",
            "labels":{"app":"old","app.kubernetes.io/name":"trainer"}},"status":{"containerStatuses":[{"name":"main","containerID":"containerd://ABC"},
            {"name":"waiting"}]}},{"metadata":{"name":"no-uid"}}]}"#,
        )
        .unwrap();
        assert_eq!(list.metadata.resource_version.as_deref(), Some("42"));
        let pods = Pods::default();
        pods.replace_all(list.items);
        assert_eq!(pods.len(), 1);
        let p = pods.get("u-1").unwrap();
        assert_eq!((p.namespace.as_str(), p.name.as_str(), p.app.as_deref()), ("ml", "trainer-0", Some("trainer")));
        assert_eq!(p.containers.get("abc").map(String::as_str), Some("main"));
    }
}
