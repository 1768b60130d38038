//! `agent --print-config`: the resolved configuration written back as the TOML file the agent
//! reads, secrets redacted.

use gpuflame_server_upload::Auth;

use super::config::AgentConfig;
use super::series::{DeviceLabel, ThreadNames};
use crate::workload::service::NameFrom;

impl AgentConfig {
    /// The configuration as TOML, secrets redacted.
    pub fn to_toml(&self) -> String {
        let q = |s: &str| format!("{s:?}");
        let mut out = String::new();
        out += &format!("server = {}\n", q(&self.server));
        out += &format!("window = {}\n", self.window.as_secs_f64());
        out += &format!("frequency = {}\n", self.frequency_hz);
        let names: Vec<&str> = self.profiles.iter().map(|k| k.name()).collect();
        out += &format!("profiles = {}\n", q(&names.join(",")));
        out += &format!("tensor_sample_bytes = {}\n", self.tensor_sample_bytes);
        out += &format!("max_live_allocations = {}\n", self.max_live_allocations);
        out += &format!("service_name_from = {}\n", q(match self.service_name_from {
            NameFrom::Comm => "comm",
            NameFrom::Cmdline => "cmdline",
        }));
        if let Some(t) = &self.tenant_id {
            out += &format!("tenant_id = {}\n", q(t));
        }
        match &self.auth {
            Auth::None => {}
            Auth::Basic { user, .. } => out += &format!("basic_auth_user = {}\nbasic_auth_password = \"<redacted>\"\n", q(user)),
            Auth::Bearer(_) => out += "bearer_token = \"<redacted>\"\n",
        }
        if let Some(c) = &self.ca_cert {
            out += &format!("ca_cert = {}\n", q(&c.display().to_string()));
        }
        out += &format!("queue_bytes = {}\n", self.queue_bytes);
        if let Some(d) = &self.output_dir {
            out += &format!("output_dir = {}\n", q(&d.display().to_string()));
            out += &format!("output_dir_bytes = {}\n", self.output_dir_bytes);
        }
        if let Some(d) = &self.spool_dir {
            out += &format!("spool_dir = {}\n", q(&d.display().to_string()));
        }
        out += &format!("shutdown_timeout = {}\n", self.shutdown_timeout.as_secs_f64());
        out += &format!("max_backoff = {}\n", self.max_backoff.as_secs_f64());
        if let Some(m) = &self.metrics_addr {
            out += &format!("metrics_addr = {}\n", q(m));
        }
        out += &format!("unwind_memory = {}\n", self.unwind_memory);
        out += &format!("hostname = {}\n", q(&self.hostname));
        out += &format!("kernel_threads = {}\n", self.kernel_threads);
        out += &format!("thread_names = {}\n", q(match self.thread_names {
            ThreadNames::Frame => "frame",
            ThreadNames::Label => "label",
            ThreadNames::None => "none",
        }));
        out += &format!("device_label = {}\n", q(match self.device_label {
            DeviceLabel::Series => "series",
            DeviceLabel::Sample => "sample",
        }));
        out += &format!("pid_labels = {}\n", self.pid_labels);
        out += &format!("max_retries = {}\n", self.max_retries);
        out += &format!("max_age = {}\n", self.max_age.as_secs_f64());
        let ranks: Vec<String> = self.rank_labels.specs().iter().map(|s| q(s)).collect();
        out += &format!("rank_labels = [{}]\n", ranks.join(", "));
        out += "\n[labels]\n";
        for (k, v) in &self.labels {
            out += &format!("{} = {}\n", q(k), q(v));
        }
        for r in &self.service_names {
            out += &format!("\n[[service_names]]\npattern = {}\nname = {}\n", q(r.pattern.as_str()), q(&r.name));
        }
        out
    }
}
