//! Which pod and container a process runs in, from its cgroup path: what kubelet and the
//! container runtimes name their cgroups after. Read from /proc/PID/cgroup, which the process
//! cannot write but can choose (a process may move itself into a cgroup it owns): the result is a
//! hint that the Kubernetes API confirms, never trusted alone for anything but labels.

use std::io::Read;

/// What a process's cgroup says of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupWorkload {
    /// The pod's UID, with dashes (`0f2b…-…`).
    pub pod_uid: Option<String>,
    /// The container's ID as the runtime names it: 64 hex digits.
    pub container_id: Option<String>,
}

/// /proc/PID/cgroup is one line per hierarchy: a few hundred bytes in practice.
const MAX_CGROUP_FILE: u64 = 64 << 10;

impl CgroupWorkload {
    pub fn of_pid(pid: u32) -> CgroupWorkload {
        let mut text = String::new();
        let read = std::fs::File::open(format!("/proc/{pid}/cgroup")).and_then(|f| f.take(MAX_CGROUP_FILE).read_to_string(&mut text));
        match read {
            Ok(_) => CgroupWorkload::parse(&text),
            Err(_) => CgroupWorkload::default(),
        }
    }

    /// From the text of /proc/PID/cgroup: the unified hierarchy's path (cgroup v2) first, else
    /// the first v1 hierarchy whose path names a pod or a container.
    pub fn parse(text: &str) -> CgroupWorkload {
        let paths: Vec<&str> = text.lines().filter_map(|l| l.splitn(3, ':').nth(2)).collect();
        let unified = text.lines().find(|l| l.starts_with("0::")).map(|l| &l[3..]);
        unified
            .into_iter()
            .chain(paths)
            .map(CgroupWorkload::of_path)
            .find(|w| w.pod_uid.is_some() || w.container_id.is_some())
            .unwrap_or_default()
    }

    /// From one cgroup path, e.g. (systemd driver, containerd)
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f2b_….slice/cri-containerd-<id>.scope`,
    /// (cgroupfs driver) `/kubepods/burstable/pod0f2b-…/<id>`, (CRI-O) `…/crio-<id>.scope`,
    /// (Docker) `/system.slice/docker-<id>.scope` or `/docker/<id>`.
    pub fn of_path(path: &str) -> CgroupWorkload {
        let mut w = CgroupWorkload::default();
        for segment in path.split('/') {
            let name = segment.strip_suffix(".slice").or_else(|| segment.strip_suffix(".scope")).unwrap_or(segment);
            if let Some(uid) = pod_uid(name) {
                w.pod_uid = Some(uid);
            } else if let Some(id) = container_id(name) {
                w.container_id = Some(id);
            }
        }
        w
    }
}

/// `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>` (systemd).
fn pod_uid(name: &str) -> Option<String> {
    let at = if name.starts_with("pod") { 0 } else { name.rfind("-pod")? + 1 };
    if !name.starts_with("kubepods") && at != 0 {
        return None;
    }
    let uid = name[at + 3..].replace('_', "-");
    let well_formed = uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') && uid.matches('-').count() == 4;
    well_formed.then(|| uid.to_ascii_lowercase())
}

/// A container's scope or directory: `cri-containerd-<id>`, `crio-<id>`, `docker-<id>`,
/// `containerd-<id>`, or the bare 64-hex-digit id. CRI-O's `crio-conmon-<id>` is the monitor,
/// not the container.
fn container_id(name: &str) -> Option<String> {
    let id = ["cri-containerd-", "crio-", "docker-", "containerd-", "libpod-"]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f2b9c3e-1d4a-4b6f-9e8d-7c6b5a493827";
    const ID: &str = "4a1c3e5f7b9d2a4c6e8f0b1d3f5a7c9e2b4d6f8a0c1e3a5c7e9b1d3f5a7c9e2b";

    fn both(w: CgroupWorkload) -> (Option<String>, Option<String>) {
        (w.pod_uid, w.container_id)
    }

    #[test]
    fn kubelet_systemd_driver() {
        let uid_ = UID.replace('-', "_");
        let containerd = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope\n");
        assert_eq!(both(CgroupWorkload::parse(&containerd)), (Some(UID.into()), Some(ID.into())));
        let crio = format!("0::/kubepods.slice/kubepods-pod{uid_}.slice/crio-{ID}.scope\n");
        assert_eq!(both(CgroupWorkload::parse(&crio)), (Some(UID.into()), Some(ID.into())));
        let conmon = format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-conmon-{ID}.scope\n");
        assert_eq!(both(CgroupWorkload::parse(&conmon)), (Some(UID.into()), None));
    }

    #[test]
    fn kubelet_cgroupfs_driver_and_cgroup_v1() {
        let v2 = format!("0::/kubepods/burstable/pod{UID}/{ID}\n");
        assert_eq!(both(CgroupWorkload::parse(&v2)), (Some(UID.into()), Some(ID.into())));
        let v1 = format!("12:pids:/kubepods/besteffort/pod{UID}/crio-{ID}\n11:cpu,cpuacct:/kubepods/besteffort/pod{UID}/crio-{ID}\n1:name=systemd:/\n");
        assert_eq!(both(CgroupWorkload::parse(&v1)), (Some(UID.into()), Some(ID.into())));
    }

    #[test]
    fn docker_without_a_pod_and_plain_processes() {
        assert_eq!(both(CgroupWorkload::parse(&format!("0::/system.slice/docker-{ID}.scope\n"))), (None, Some(ID.into())));
        assert_eq!(both(CgroupWorkload::parse(&format!("4:memory:/docker/{ID}\n"))), (None, Some(ID.into())));
        assert_eq!(both(CgroupWorkload::parse("0::/user.slice/user-0.slice/session-1.scope\n")), (None, None));
        assert_eq!(both(CgroupWorkload::parse("0::/podcast/pod-not-a-uid\n")), (None, None));
        assert_eq!(both(CgroupWorkload::parse("garbage")), (None, None));
        assert_eq!(CgroupWorkload::of_pid(std::process::id()).pod_uid, None);
    }
}
