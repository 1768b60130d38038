//! Which workload a process belongs to: its service name, its cgroup's pod and container, this
//! node's pods as the Kubernetes API has them, and its rank in a distributed job. A recording
//! titles its flame graph with the program's name and the agent labels its series with all of
//! it; neither owns it, so it is a module of its own rather than the agent's.

pub mod cgroup;
pub mod environ;
pub mod kube;
pub mod label_name;
pub mod pods;
pub mod rank;
pub mod rank_labels;
pub mod service;
