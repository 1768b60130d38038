//! Which service a process belongs to: the `service_name` label of its profiles.

use std::collections::HashMap;
use std::fs;

use regex::Regex;

/// The environment variable a process can set to name its own service.
pub const SERVICE_NAME_ENV: &str = "GPUFLAME_SERVICE_NAME";

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NameFrom {
    /// The command name (comm), as `ps` and `top` show it.
    Comm,
    /// The program in the command line (argv[0], its file name), or the script for interpreters.
    Cmdline,
}

/// A regex on the command line and the service name it gives (`$1` etc. may refer to groups).
#[derive(Debug, Clone)]
pub struct NameRule {
    pub pattern: Regex,
    pub name: String,
}

pub struct ServiceNamer {
    from: NameFrom,
    rules: Vec<NameRule>,
    /// pid → (comm it had, service).
    cache: HashMap<u32, (String, String)>,
}

impl ServiceNamer {
    pub fn new(from: NameFrom, rules: Vec<NameRule>) -> Self {
        ServiceNamer { from, rules, cache: HashMap::new() }
    }

    /// The service of process `pid`, whose command name is `comm`. In order: the process's
    /// GPUFLAME_SERVICE_NAME, the first matching rule, then comm or the command line.
    pub fn service(&mut self, pid: u32, comm: &str) -> String {
        if let Some((c, s)) = self.cache.get(&pid) {
            if c == comm {
                return s.clone();
            }
        }
        // The service_name label comes from the process's environment or command line, not
        // only from the already sanitized comm.
        let service = crate::names::sanitize(&self.resolve(pid, comm)).into_owned();
        self.cache.insert(pid, (comm.to_string(), service.clone()));
        service
    }

    fn resolve(&self, pid: u32, comm: &str) -> String {
        if let Ok(env) = fs::read(format!("/proc/{pid}/environ")) {
            for var in env.split(|&b| b == 0) {
                if let Some(v) = var.strip_prefix(format!("{SERVICE_NAME_ENV}=").as_bytes()) {
                    if !v.is_empty() {
                        return String::from_utf8_lossy(v).into_owned();
                    }
                }
            }
        }
        let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| c.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect::<Vec<_>>())
            .unwrap_or_default();
        let joined = cmdline.join(" ");
        for rule in &self.rules {
            if let Some(caps) = rule.pattern.captures(&joined) {
                let mut name = String::new();
                caps.expand(&rule.name, &mut name);
                return name;
            }
        }
        match self.from {
            NameFrom::Comm => comm.to_string(),
            NameFrom::Cmdline => program_name(&cmdline).unwrap_or_else(|| comm.to_string()),
        }
    }

    /// Forgets processes that exited.
    pub fn retain(&mut self, alive: impl Fn(u32) -> bool) {
        self.cache.retain(|&pid, _| alive(pid));
    }
}

/// argv[0]'s file name; for an interpreter (python, node, java…), the script or module it runs.
fn program_name(argv: &[String]) -> Option<String> {
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
    let first = base(argv.first()?);
    let interpreter = ["python", "node", "ruby", "perl", "java"].iter().any(|i| first.starts_with(i));
    if interpreter {
        let mut args = argv[1..].iter();
        while let Some(a) = args.next() {
            if a == "-m" {
                return args.next().cloned();
            }
            if !a.starts_with('-') {
                return Some(base(a));
            }
        }
    }
    Some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(program_name(&v(&["/usr/bin/python3", "-u", "/srv/train.py", "--lr", "1"])).as_deref(), Some("train.py"));
        assert_eq!(program_name(&v(&["python3", "-m", "vllm.entrypoints.api_server"])).as_deref(), Some("vllm.entrypoints.api_server"));
        assert_eq!(program_name(&v(&["/opt/app/server", "--port", "80"])).as_deref(), Some("server"));
        assert_eq!(program_name(&[]), None);
    }

    #[test]
    fn rules_and_env_win_over_comm() {
        let me = std::process::id();
        let mut n = ServiceNamer::new(NameFrom::Comm, vec![]);
        assert_eq!(n.service(me, "somecomm"), "somecomm");
        let rule = NameRule { pattern: Regex::new(r"(gpuflame)").unwrap(), name: "svc-$1".into() };
        let mut n = ServiceNamer::new(NameFrom::Comm, vec![rule]);
        // The test binary's command line contains "gpuflame" (its file name).
        assert_eq!(n.service(me, "x"), "svc-gpuflame");
    }

    #[test]
    fn service_names_from_the_environment_are_sanitized() {
        let mut child = std::process::Command::new("sleep").arg("5").env(SERVICE_NAME_ENV, "svc\x1b;\n").spawn().expect("sleep");
        // spawn returns once the exec began; its environment shows a moment later.
        let service = (0..200)
            .map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                ServiceNamer::new(NameFrom::Comm, vec![]).service(child.id(), "sleep")
            })
            .find(|s| s != "sleep");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(service.as_deref(), Some(r"svc\x1b;\n"));
    }
}
