//! Hooks attached by file or by profile: PyTorch's USDT probes in a file, and a profile's own
//! tracepoint program (stack_hooks.h).

use std::cell::RefCell;
use std::path::Path;
use std::rc::{Rc, Weak};

use libbpf_rs::skel::Skel;

use super::{BpfPrograms, UsdtLinks};
use crate::error::{attach_error, BpfError};

/// PyTorch's USDT probes (pytorch:malloc, pytorch:free) in one file, in every process that maps
/// it, with their semaphores raised while attached. Dropping it detaches them, and the kernel
/// lowers the semaphores: the program pays nothing for them again.
///
/// The links live in the sampler: a USDT link refers to libbpf's USDT manager, which closing the
/// BPF object frees, so one destroyed after the object would write to freed memory (an agent
/// whose session dropped its sampler before its hooks aborted with `corrupted double-linked
/// list`). The sampler destroys the links it still holds before it closes the object; this
/// handle only asks for them to go sooner.
pub struct TorchProbes {
    id: u64,
    registry: Weak<RefCell<UsdtLinks>>,
}

impl Drop for TorchProbes {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            registry.borrow_mut().links.remove(&self.id);
        }
    }
}

impl BpfPrograms {
    /// Attaches to PyTorch's allocator probes in the file at `path` (libbpf reads its notes,
    /// their argument specs and semaphores); an error when it has no such probes.
    pub fn attach_torch_probes(&self, path: &Path) -> Result<TorchProbes, BpfError> {
        let progs = &self.skel.progs;
        let attach = |prog: &libbpf_rs::ProgramMut<'_>, name: &str| {
            prog.attach_usdt(-1, path, "pytorch", name).map_err(|source| attach_error(&format!("the probe pytorch:{name} of {}", path.display()), source))
        };
        let links = [attach(&progs.on_torch_malloc, "malloc")?, attach(&progs.on_torch_free, "free")?];
        let mut registry = self.usdt.borrow_mut();
        let id = registry.next;
        registry.next += 1;
        registry.links.insert(id, links);
        Ok(TorchProbes { id, registry: Rc::downgrade(&self.usdt) })
    }

    /// Attaches a profile's own hook: the program named `program`, on the tracepoint
    /// `category:name`, with `origin` as its cookie, which its records carry
    /// ([`crate::HookedStack::origin`]).
    pub fn attach_stack_hook(&mut self, program: &str, category: &str, name: &str, origin: u64) -> Result<(), BpfError> {
        // libbpf finds a tracepoint's id in tracefs, which not every machine mounts.
        let mounted = ["/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"].iter().any(|d| Path::new(d).is_dir());
        let hint = if mounted { "" } else { " (tracefs is not mounted: mount -t tracefs nodev /sys/kernel/tracing)" };
        let what = format!("the program {program} to the tracepoint {category}:{name}{hint}");
        let mut progs = self.skel.object_mut().progs_mut();
        let prog = progs.find(|p| p.name() == program).ok_or_else(|| BpfError::Attach { what: what.clone(), source: libbpf_rs::Error::from_raw_os_error(libc::ENOENT) })?;
        let opts = libbpf_rs::TracepointOpts { cookie: origin, ..Default::default() };
        let category = libbpf_rs::TracepointCategory::Custom(category.to_string());
        let link = prog.attach_tracepoint_with_opts(category, name, opts).map_err(|source| attach_error(&what, source))?;
        self._links.push(link);
        Ok(())
    }
}
