use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// An executable file (program or shared library) that code was sampled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    pub path: PathBuf,
    pub build_id: Option<Vec<u8>>,
    /// Other files with the same build-id (a stripped copy and the original, say): tried in turn
    /// for addresses that `path` cannot name.
    pub other_paths: Vec<PathBuf>,
}

impl Module {
    /// The build-id as lowercase hex, as pprof and debuginfod write it.
    pub fn build_id_hex(&self) -> Option<String> {
        self.build_id.as_ref().map(|id| id.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The file name alone, for `[unknown] (libfoo.so+0x1234)`.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.display().to_string())
    }
}

/// Index of a [`Module`] in its symbolizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(pub u32);

/// Modules by identity: the build-id when the file has one (the same library at two paths is one
/// module), else the path.
#[derive(Default)]
pub(crate) struct ModuleTable {
    modules: Vec<Module>,
    by_build_id: HashMap<Vec<u8>, ModuleId>,
    by_path: HashMap<PathBuf, ModuleId>,
}

impl ModuleTable {
    pub(crate) fn intern(&mut self, path: &Path, build_id: Option<&[u8]>) -> ModuleId {
        let existing = match build_id {
            Some(id) => self.by_build_id.get(id),
            None => self.by_path.get(path),
        };
        if let Some(&id) = existing {
            let m = &mut self.modules[id.0 as usize];
            if m.path != path && !m.other_paths.iter().any(|p| p == path) {
                m.other_paths.push(path.to_path_buf());
            }
            return id;
        }
        let id = ModuleId(self.modules.len() as u32);
        self.modules.push(Module { path: path.to_path_buf(), build_id: build_id.map(<[u8]>::to_vec), other_paths: Vec::new() });
        match build_id {
            Some(b) => self.by_build_id.insert(b.to_vec(), id),
            None => self.by_path.insert(path.to_path_buf(), id),
        };
        id
    }

    pub(crate) fn get(&self, id: ModuleId) -> &Module {
        &self.modules[id.0 as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_build_id_is_one_module() {
        let mut t = ModuleTable::default();
        let a = t.intern(Path::new("/a/libx.so"), Some(&[1, 2]));
        let b = t.intern(Path::new("/b/libx.so"), Some(&[1, 2]));
        let c = t.intern(Path::new("/a/libx.so"), None);
        let d = t.intern(Path::new("/a/libx.so"), None);
        assert_eq!(a, b);
        assert_eq!(t.get(a).other_paths, [PathBuf::from("/b/libx.so")]);
        assert_ne!(a, c);
        assert_eq!(c, d);
        assert_eq!(t.get(a).build_id_hex().as_deref(), Some("0102"));
        assert_eq!(t.get(a).file_name(), "libx.so");
    }
}
