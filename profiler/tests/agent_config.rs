//! The agent's configuration: flags over the file, secrets hidden, bad settings refused with a
//! clear error, and the defaults. Needs no BPF.

use std::time::Duration;

use gpuflame::agent::config::{AgentArgs, AgentConfig, DEFAULT_TENSOR_SAMPLE_BYTES};
use gpuflame::profile_kind::ProfileKind;
use gpuflame::workload::rank::RankLabels;
use gpuflame_server_upload::Auth;

#[test]
fn flags_override_the_file_and_secrets_stay_hidden() {
    let dir = std::env::temp_dir().join(format!("gpuflame-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("agent.toml");
    let pw = dir.join("pw");
    std::fs::write(&pw, "s3cret\n").unwrap();
    std::fs::write(
        &cfg,
        format!(
            "server = \"http://file:4040\"\nwindow = 30\nbasic_auth_user = \"bob\"\nbasic_auth_password_file = {:?}\n[labels]\nenv = \"prod\"\n[[service_names]]\npattern = \"train\"\nname = \"trainer\"\n",
            pw.display().to_string()
        ),
    )
    .unwrap();
    let args = AgentArgs { config: Some(cfg), server: Some("http://flag:4040".into()), labels: vec!["zone=a".into()], ..Default::default() };
    let c = AgentConfig::resolve(&args).unwrap();
    assert_eq!(c.server, "http://flag:4040");
    assert_eq!(c.window, Duration::from_secs(30));
    assert_eq!(c.frequency_hz, 19);
    assert_eq!(c.labels.len(), 2);
    assert!(matches!(&c.auth, Auth::Basic { user, password } if user == "bob" && password.expose() == "s3cret"));
    let toml = c.to_toml();
    assert!(!toml.contains("s3cret") && toml.contains("<redacted>") && toml.contains("trainer"), "{toml}");
    assert!(!format!("{c:?}").contains("s3cret"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rank_labels_from_flags_or_the_file_round_trip_through_print_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    let resolve = |toml: &str, flags: &[&str]| {
        std::fs::write(&cfg, toml).unwrap();
        let args = AgentArgs { config: Some(cfg.clone()), rank_labels: flags.iter().map(|s| s.to_string()).collect(), ..Default::default() };
        AgentConfig::resolve(&args)
    };
    assert_eq!(resolve("", &[]).unwrap().rank_labels, RankLabels::default());
    let c = resolve("rank_labels = [\"rank=MY_RANK\", \"node_rank=NODE\"]\n", &[]).unwrap();
    assert_eq!(c.rank_labels.specs(), ["rank=MY_RANK", "node_rank=NODE"]);
    // Printed as the file takes it.
    assert_eq!(resolve(&c.to_toml(), &[]).unwrap().rank_labels, c.rank_labels);
    assert!(resolve("rank_labels = []\n", &[]).unwrap().rank_labels.is_empty());
    let off = resolve("", &["none"]).unwrap();
    assert!(off.rank_labels.is_empty() && resolve(&off.to_toml(), &[]).unwrap().rank_labels.is_empty());
    // Flags replace the file's list.
    assert_eq!(resolve("rank_labels = [\"rank=MY_RANK\"]\n", &["rank=RANK"]).unwrap().rank_labels.specs(), ["rank=RANK"]);
    let e = |toml: &str, flags: &[&str]| resolve(toml, flags).unwrap_err().0;
    assert!(e("", &["bad-name=X"]).contains("not a label name"), "{}", e("", &["bad-name=X"]));
    assert!(e("", &["hostname=X"]).contains("clash"));
    assert!(e("rank_labels = [\"pod=X\"]\n", &[]).contains("clash"));
    assert!(e("[labels]\nnode_rank = \"x\"\n", &["node_rank=NODE"]).contains("--rank-label"));
}

#[test]
fn bad_settings_are_clear_errors() {
    let bad = AgentArgs { labels: vec!["novalue".into()], ..Default::default() };
    assert!(AgentConfig::resolve(&bad).unwrap_err().0.contains("KEY=VALUE"));
    let bad = AgentArgs { labels: vec!["service_name=x".into()], ..Default::default() };
    assert!(AgentConfig::resolve(&bad).is_err());
    let bad = AgentArgs { labels: vec!["hostname=x".into()], ..Default::default() };
    assert!(AgentConfig::resolve(&bad).unwrap_err().0.contains("hostname is set by the agent"));
    let bad = AgentArgs { hostname: Some(String::new()), ..Default::default() };
    assert!(AgentConfig::resolve(&bad).unwrap_err().0.contains("--hostname"));
    let bad = AgentArgs { service_names: vec!["train=".into()], ..Default::default() };
    assert!(AgentConfig::resolve(&bad).unwrap_err().0.contains("empty name"));
    let bad = AgentArgs { window: Some(-1.0), ..Default::default() };
    assert!(AgentConfig::resolve(&bad).is_err());
    for (args, needle) in [
        (AgentArgs { window: Some(1e300), ..Default::default() }, "window 1e300 is out of range"),
        (AgentArgs { shutdown_timeout: Some(f64::INFINITY), ..Default::default() }, "shutdown timeout inf"),
        (AgentArgs { max_backoff: Some(1e20), ..Default::default() }, "max backoff"),
        (AgentArgs { queue_bytes: Some(u64::MAX), ..Default::default() }, "queue_bytes"),
    ] {
        let e = AgentConfig::resolve(&args).unwrap_err().0;
        assert!(e.contains(needle), "{e}");
    }
}

#[test]
fn the_defaults_follow_device_memory_with_tensors_sampled_by_bytes() {
    let c = AgentConfig::resolve(&AgentArgs::default()).unwrap();
    assert_eq!(c.profiles, [ProfileKind::Cpu, ProfileKind::HbmInUse, ProfileKind::TensorAlloc, ProfileKind::TensorInUse]);
    assert_eq!((c.tensor_sample_bytes, c.profiles_asked), (DEFAULT_TENSOR_SAMPLE_BYTES, false));
    let asked = AgentConfig::resolve(&AgentArgs { profiles: Some("cpu".into()), tensor_sample_bytes: Some(0), ..Default::default() }).unwrap();
    assert_eq!((asked.profiles.as_slice(), asked.tensor_sample_bytes, asked.profiles_asked), ([ProfileKind::Cpu].as_slice(), 0, true));
    let e = AgentConfig::resolve(&AgentArgs { tensor_sample_bytes: Some(u64::MAX), ..Default::default() }).unwrap_err().0;
    assert!(e.contains("tensor_sample_bytes"), "{e}");
}
