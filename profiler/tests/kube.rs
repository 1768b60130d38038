//! `gpuflame agent` on a fake Kubernetes node: processes in cgroups named as kubelet names them
//! (systemd driver with containerd, cgroupfs driver with CRI-O), a fake API server over TLS
//! (tests/programs/fake_kube_api.py) with a token and a CA made here, and the suite's
//! Pyroscope receiver. Run as root; the first pod's cgroup is in the v2 hierarchy, the second's in
//! v1 where the machine has one.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::receiver::{Received, Receiver};
use common::*;

/// The agents profile the whole machine: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());


/// A cgroup made for the test, removed (with its parents up to `top`) at the end.
struct FakeCgroup {
    root: PathBuf,
    leaf: PathBuf,
    top: PathBuf,
}

impl FakeCgroup {
    /// `relative` under the cgroup v2 hierarchy (`v1: false`) or the v1 `pids` hierarchy, where
    /// the machine has them: a pure v2 machine has no v1 hierarchy, a hybrid one (systemd's
    /// legacy layout, as here) both.
    fn new(relative: &str, v1: bool) -> FakeCgroup {
        let sys = Path::new("/sys/fs/cgroup");
        let pure_v2 = sys.join("cgroup.controllers").exists();
        let root = match (pure_v2, v1) {
            (true, _) => sys.to_path_buf(),
            (false, false) => sys.join("unified"),
            (false, true) => sys.join("pids"),
        };
        assert!(root.join("cgroup.procs").exists(), "this test needs a cgroup hierarchy at {}", root.display());
        let leaf = root.join(relative);
        std::fs::create_dir_all(&leaf).unwrap_or_else(|e| panic!("creating {}: {e}", leaf.display()));
        let top = root.join(relative.split('/').next().unwrap());
        FakeCgroup { root, leaf, top }
    }

    fn enter(&self, pid: u32) {
        std::fs::write(self.leaf.join("cgroup.procs"), pid.to_string()).unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", self.leaf.display()));
    }
}

impl Drop for FakeCgroup {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.leaf.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
            }
        }
        let mut dir = self.leaf.clone();
        loop {
            let _ = std::fs::remove_dir(&dir);
            if dir == self.top || !dir.pop() {
                break;
            }
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("openssl is needed (apt-get install openssl)");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA, and a certificate for 127.0.0.1 signed by it, in `dir`.
fn make_certificates(dir: &Path) {
    let p = |n: &str| dir.join(n);
    run(Command::new("openssl").args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=gpuflame test CA"]).arg("-keyout").arg(p("ca.key")).arg("-out").arg(p("ca.crt")));
    run(Command::new("openssl").args(["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"]).arg("-keyout").arg(p("server.key")).arg("-out").arg(p("server.csr")));
    std::fs::write(p("san.ext"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n").unwrap();
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
        .arg("-in")
        .arg(p("server.csr"))
        .arg("-CA")
        .arg(p("ca.crt"))
        .arg("-CAkey")
        .arg(p("ca.key"))
        .arg("-extfile")
        .arg(p("san.ext"))
        .arg("-out")
        .arg(p("server.crt")));
}

const TOKEN: &str = "test-token-5f3a";
const NODE: &str = "node-test-1";

struct Node {
    dir: tempfile::TempDir,
    uid_a: String,
    uid_b: String,
    id_a: String,
    id_b: String,
    trainer: Killed,
    server: Killed,
    _cgroups: Vec<FakeCgroup>,
}

/// Two busy processes in two pods' cgroups, and the pods the API describes.
fn fake_node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let n = std::process::id();
    let uid_a = format!("0f2b9c3e-1d4a-4b6f-9e8d-{n:012x}");
    let uid_b = format!("7a6b5c4d-3e2f-4a1b-8c9d-{n:012x}");
    let id_a = format!("{:064x}", 0xa11ce_u64 + u64::from(n));
    let id_b = format!("{:064x}", 0xb0b_u64 + u64::from(n));
    let exe = build_c(dir.path(), "chain", FP_FLAGS);
    let spin = |name: &str| {
        let named = dir.path().join(name);
        std::fs::copy(&exe, &named).unwrap();
        Killed(Command::new(&named).arg("60").spawn().unwrap())
    };
    let (trainer, server) = (spin("trainer"), spin("apiserver"));
    // kubelet with the systemd driver and containerd; kubelet with the cgroupfs driver and CRI-O.
    let a = FakeCgroup::new(&format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id_a}.scope",
        uid_a.replace('-', "_")
    ), false);
    let b = FakeCgroup::new(&format!("kubepods/besteffort/pod{uid_b}/crio-{id_b}"), true);
    a.enter(trainer.0.id());
    b.enter(server.0.id());
    let pods = serde_json(&uid_a, &id_a, &uid_b, &id_b);
    std::fs::write(dir.path().join("pods.json"), pods).unwrap();
    Node { dir, uid_a, uid_b, id_a, id_b, trainer, server, _cgroups: vec![a, b] }
}

fn serde_json(uid_a: &str, id_a: &str, uid_b: &str, id_b: &str) -> String {
    format!(
        r#"[{{"metadata":{{"name":"trainer-0","namespace":"ml","uid":"{uid_a}","labels":{{"app.kubernetes.io/name":"trainer","app":"x"}}}},
        "spec":{{"nodeName":"{NODE}"}},"status":{{"containerStatuses":[{{"name":"main","containerID":"containerd://{id_a}"}}]}}}},
        {{"metadata":{{"name":"api-7f9c","namespace":"web","uid":"{uid_b}","labels":{{"app":"api"}}}},
        "spec":{{"nodeName":"{NODE}"}},"status":{{"containerStatuses":[{{"name":"server","containerID":"cri-o://{id_b}"}}]}}}}]"#
    )
}

/// The fake API server; its port.
fn start_api(node: &Node) -> (Killed, u16) {
    let d = node.dir.path();
    make_certificates(d);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/fake_kube_api.py");
    let port_file = d.join("port");
    let child = Command::new("python3")
        .arg(script)
        .arg(&port_file)
        .arg(d.join("server.crt"))
        .arg(d.join("server.key"))
        .arg(TOKEN)
        .arg(NODE)
        .arg(d.join("pods.json"))
        .arg(d)
        .spawn()
        .expect("python3 is needed");
    let started = Instant::now();
    while !port_file.exists() {
        assert!(started.elapsed() < HANG, "the fake API server did not start");
        sleep(Duration::from_millis(50));
    }
    let port = std::fs::read_to_string(&port_file).unwrap().trim().parse().unwrap();
    (Killed(child), port)
}

/// The service account directory a pod would have.
fn service_account(node: &Node) -> PathBuf {
    let sa = node.dir.path().join("serviceaccount");
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::write(sa.join("token"), format!("{TOKEN}\n")).unwrap();
    std::fs::copy(node.dir.path().join("ca.crt"), sa.join("ca.crt")).unwrap();
    sa
}

fn agent_command(receiver: &Receiver, port: u16, sa: &Path) -> Command {
    let mut command = Command::new(GPUFLAME);
    command
        .args(["agent", "--server", &receiver.url(), "--window", "1", "-F", "49"])
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", port.to_string())
        .env("GPUFLAME_KUBE_SERVICE_ACCOUNT_DIR", sa)
        .env("NODE_NAME", NODE);
    command
}

/// Waits until `service` has `windows` pushes: an agent on a loaded CI machine takes seconds to
/// load its programs and build the machine's tables before its first window. Only a hang runs
/// out the wait; the test's assertions say what was missing.
fn wait_for_windows(receiver: &Receiver, service: &str, windows: usize) {
    let deadline = Instant::now() + HANG;
    while of_service(&receiver.received(), service).len() < windows && Instant::now() < deadline {
        sleep(Duration::from_millis(200));
    }
}

fn labels(r: &Received, names: &[&str]) -> Vec<Option<String>> {
    names.iter().map(|n| r.labels.get(*n).cloned()).collect()
}

fn of_service<'a>(got: &'a [Received], service: &str) -> Vec<&'a Received> {
    got.iter().filter(|r| r.labels.get("service_name").map(String::as_str) == Some(service)).collect()
}

#[test]
fn pods_of_a_fake_node_are_named_and_labelled_and_a_deleted_pod_is_forgotten() {
    require_bpf();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let node = fake_node();
    let (_api, port) = start_api(&node);
    let sa = service_account(&node);
    let receiver = Receiver::start(Box::new(|_| 200));
    let agent = common::agent::Agent::start(agent_command(&receiver, port, &sa).arg("-v"));
    wait_for_windows(&receiver, "ml/main", 2);
    std::fs::write(node.dir.path().join("delete"), format!("{}\n", node.uid_b)).unwrap();
    // Once the agent says it saw the deletion, no window that starts after may name the pod;
    // windows after it name the process from its cgroup.
    let said = format!("Kubernetes pod deleted: its processes are labelled from their cgroups uid={}", node.uid_b);
    let deadline = Instant::now() + HANG;
    while !agent.lines.lock().unwrap().iter().any(|l| l.ends_with(&said)) {
        assert!(Instant::now() < deadline, "the agent never saw the deletion:\n{}", agent.lines.lock().unwrap().join("\n"));
        sleep(Duration::from_millis(20));
    }
    let seen_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    let after_deletion = |got: &[Received]| -> Vec<Received> { of_service(got, "apiserver").into_iter().filter(|r| r.profile.time_nanos > seen_ns).cloned().collect() };
    while after_deletion(&receiver.received()).len() < 2 {
        assert!(Instant::now() < deadline, "no windows of the deleted pod's process after the deletion");
        sleep(Duration::from_millis(100));
    }
    let stderr = agent.stop();
    let got = receiver.received();
    let names = ["namespace", "pod", "container", "node", "app"];

    let trainer = of_service(&got, "ml/main");
    assert!(trainer.len() >= 3, "the trainer's series, named NAMESPACE/CONTAINER, in most windows: {:#?}\n{stderr}", got.iter().map(|r| &r.labels).collect::<Vec<_>>());
    for r in &trainer {
        assert_eq!(labels(r, &names), [Some("ml"), Some("trainer-0"), Some("main"), Some(NODE), Some("trainer")].map(|s| s.map(String::from)));
    }
    let server = of_service(&got, "web/server");
    assert!(!server.is_empty(), "the CRI-O pod's series: {:#?}", got.iter().map(|r| &r.labels).collect::<Vec<_>>());
    for r in &server {
        assert_eq!(labels(r, &names), [Some("web"), Some("api-7f9c"), Some("server"), Some(NODE), Some("api")].map(|s| s.map(String::from)));
        assert!(r.profile.time_nanos < seen_ns, "the deleted pod still named a window that began {} ms after the agent saw the deletion", (r.profile.time_nanos - seen_ns) / 1_000_000);
    }
    // After the deletion: the process is named by its comm and labelled from its cgroup.
    for r in &after_deletion(&got) {
        assert_eq!(labels(r, &["pod_uid", "container_id", "namespace", "pod"]), [Some(node.uid_b.clone()), Some(node.id_b.clone()), None, None]);
    }
    // One list and one watch (a watch that ends is followed by a new list): never a request
    // per process or per window.
    let requests = std::fs::read_to_string(node.dir.path().join("requests.log")).unwrap();
    assert!(requests.lines().count() <= 4, "requests to the API server:\n{requests}");
    assert!(requests.lines().any(|l| l.contains("watch=1")), "no watch:\n{requests}");
    assert!(!stderr.contains("unavailable"), "{stderr}");
    let _ = (&node.uid_a, &node.id_a, &node.trainer, &node.server);
}

#[test]
fn with_the_api_server_down_profiles_still_flow_with_cgroup_labels() {
    require_bpf();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let node = fake_node();
    make_certificates(node.dir.path());
    let sa = service_account(&node);
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let receiver = Receiver::start(Box::new(|_| 200));
    let agent = common::agent::Agent::start(&mut agent_command(&receiver, closed, &sa));
    wait_for_windows(&receiver, "trainer", 3);
    let stderr = agent.stop();
    let got = receiver.received();
    let trainer = of_service(&got, "trainer");
    assert!(trainer.len() >= 3, "{:#?}\n{stderr}", got.iter().map(|r| &r.labels).collect::<Vec<_>>());
    for r in &trainer {
        assert_eq!(labels(r, &["pod_uid", "container_id", "namespace"]), [Some(node.uid_a.clone()), Some(node.id_a.clone()), None]);
    }
    let warnings = stderr.lines().filter(|l| l.contains("Kubernetes API unavailable")).count();
    assert_eq!(warnings, 1, "one warning for an API server that stays down:\n{stderr}");
}

/// The DaemonSet as written in deploy/: what the agent needs to find its node's pods.
#[test]
fn the_daemonset_can_watch_its_nodes_pods() {
    let yaml = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset.yaml")).unwrap();
    let docs: Vec<&str> = yaml.split("\n---").collect();
    let doc = |kind: &str| docs.iter().find(|d| d.contains(&format!("kind: {kind}\n"))).unwrap_or_else(|| panic!("no {kind} in deploy/daemonset.yaml"));
    let role = doc("ClusterRole");
    assert!(role.contains("resources: [pods]") && role.contains("verbs: [get, list, watch]"), "{role}");
    let binding = doc("ClusterRoleBinding");
    assert!(binding.contains("name: gpuflame-agent") && binding.contains("kind: ServiceAccount"), "{binding}");
    assert!(doc("ServiceAccount").contains("name: gpuflame-agent"));
    let ds = doc("DaemonSet");
    assert!(ds.contains("serviceAccountName: gpuflame-agent"), "{ds}");
    let node_name = ds.find("- name: NODE_NAME").expect("NODE_NAME from the downward API");
    assert!(ds[node_name..].lines().nth(1).is_some_and(|l| l.contains("fieldPath: spec.nodeName")), "{ds}");
    assert!(ds.contains("hostPID: true"));
}
