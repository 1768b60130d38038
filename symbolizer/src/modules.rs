//! Modules: the executable files code was sampled in, each with the open files it can be
//! symbolized from.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpuflame_elfread::FileId;

use crate::files::ModuleFile;

/// An executable file (program or shared library) that code was sampled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// The path as the process saw it (in its own mount namespace): a name, not where the file
    /// is read from.
    pub path: PathBuf,
    pub build_id: Option<Vec<u8>>,
    /// Other paths the same module was seen at.
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

/// What makes two mappings one module: the file when it is known (one path in two mount
/// namespaces is two files, and a build-id is only a claim: another user's file can copy a
/// victim's to lend it its names), the build-id or path only when no file could be opened.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ModuleKey {
    /// The same build, wherever it lies, when no file of it is open.
    BuildId(Vec<u8>),
    File(FileId),
    /// No file could be opened: the module can only be shown as unknown.
    Path(PathBuf),
}

/// Files kept per module (one file, seen through several processes' map_files).
const FILES_PER_MODULE: usize = 4;

pub(crate) struct ModuleTable {
    modules: Vec<Module>,
    files: Vec<Vec<Arc<ModuleFile>>>,
    last_used: Vec<u64>,
    by_key: HashMap<ModuleKey, ModuleId>,
    /// Modules of opened files by (device, inode, size), for code known only by its file's
    /// identity (the size, so that an inode number freed and reused is not taken for the file).
    by_inode: HashMap<(u64, u64, u64), ModuleId>,
    /// Modules that hold files now, and how many may: the least recently used lets its files go.
    holding: usize,
    limit: usize,
    clock: u64,
}

impl ModuleTable {
    pub(crate) fn new(limit: usize) -> Self {
        ModuleTable { modules: Vec::new(), files: Vec::new(), last_used: Vec::new(), by_key: HashMap::new(), by_inode: HashMap::new(), holding: 0, limit: limit.max(1), clock: 0 }
    }

    pub(crate) fn intern(&mut self, path: &Path, build_id: Option<&[u8]>, file: Option<&Arc<ModuleFile>>) -> ModuleId {
        let build_id = build_id.or_else(|| file.and_then(|f| f.build_id()));
        let key = match (build_id, file) {
            (_, Some(f)) => ModuleKey::File(f.id()),
            (Some(b), None) => ModuleKey::BuildId(b.to_vec()),
            (None, None) => ModuleKey::Path(path.to_path_buf()),
        };
        let id = match self.by_key.get(&key) {
            Some(&id) => {
                let m = &mut self.modules[id.0 as usize];
                if m.path != path && !m.other_paths.iter().any(|p| p == path) && m.other_paths.len() < 8 {
                    m.other_paths.push(path.to_path_buf());
                }
                id
            }
            None => {
                let id = ModuleId(self.modules.len() as u32);
                self.modules.push(Module { path: path.to_path_buf(), build_id: build_id.map(<[u8]>::to_vec), other_paths: Vec::new() });
                self.files.push(Vec::new());
                self.last_used.push(0);
                self.by_key.insert(key, id);
                id
            }
        };
        self.clock += 1;
        self.last_used[id.0 as usize] = self.clock;
        if let Some(file) = file {
            let f = file.id();
            self.by_inode.insert((f.dev, f.ino, f.size), id);
            let files = &mut self.files[id.0 as usize];
            if !files.iter().any(|f| f.id() == file.id()) && files.len() < FILES_PER_MODULE {
                if files.is_empty() {
                    self.holding += 1;
                }
                files.push(Arc::clone(file));
                self.release_over_limit(id);
            }
        }
        id
    }

    fn release_over_limit(&mut self, keep: ModuleId) {
        while self.holding > self.limit {
            let oldest = (0..self.modules.len())
                .filter(|&i| i != keep.0 as usize && !self.files[i].is_empty())
                .min_by_key(|&i| self.last_used[i]);
            let Some(i) = oldest else { return };
            tracing::debug!(module = %self.modules[i].path.display(), "closing the file of the least recently sampled module");
            self.files[i].clear();
            self.holding -= 1;
        }
    }

    /// The module of the file with this device, inode and size, if one was seen mapped.
    pub(crate) fn by_inode(&self, dev: u64, ino: u64, size: u64) -> Option<ModuleId> {
        self.by_inode.get(&(dev, ino, size)).copied()
    }

    pub(crate) fn get(&self, id: ModuleId) -> &Module {
        &self.modules[id.0 as usize]
    }

    /// The files the module can be read from; none when no file could be opened for it.
    pub(crate) fn files(&self, id: ModuleId) -> &[Arc<ModuleFile>] {
        &self.files[id.0 as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &str) -> Arc<ModuleFile> {
        ModuleFile::open(Path::new(path)).unwrap()
    }

    #[test]
    fn same_build_id_is_one_module() {
        let mut t = ModuleTable::new(100);
        let a = t.intern(Path::new("/a/libx.so"), Some(&[1, 2]), None);
        let b = t.intern(Path::new("/b/libx.so"), Some(&[1, 2]), None);
        let c = t.intern(Path::new("/a/libx.so"), None, None);
        let d = t.intern(Path::new("/a/libx.so"), None, None);
        assert_eq!(a, b);
        assert_eq!(t.get(a).other_paths, [PathBuf::from("/b/libx.so")]);
        assert_ne!(a, c);
        assert_eq!(c, d);
        assert_eq!(t.get(a).build_id_hex().as_deref(), Some("0102"));
        assert_eq!(t.get(a).file_name(), "libx.so");
    }

    #[test]
    fn one_path_two_files_is_two_modules() {
        let dir = std::env::temp_dir().join(format!("symbolizer-modules-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (x, y) = (dir.join("x"), dir.join("y"));
        std::fs::write(&x, b"not an ELF file, one").unwrap();
        std::fs::write(&y, b"not an ELF file, two").unwrap();
        let (fx, fy) = (open(x.to_str().unwrap()), open(y.to_str().unwrap()));
        let mut t = ModuleTable::new(100);
        // Both seen at the same path, as in two mount namespaces.
        let a = t.intern(Path::new("/app/prog"), None, Some(&fx));
        let b = t.intern(Path::new("/app/prog"), None, Some(&fy));
        let c = t.intern(Path::new("/elsewhere/prog"), None, Some(&fx));
        assert_ne!(a, b);
        assert_eq!(a, c);
        assert_eq!(t.files(a).len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn files_that_claim_one_build_id_are_two_modules() {
        let dir = std::env::temp_dir().join(format!("symbolizer-claim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (victim, impostor) = (dir.join("victim"), dir.join("impostor"));
        std::fs::write(&victim, b"the real library").unwrap();
        std::fs::write(&impostor, b"someone else's file").unwrap();
        let (fv, fi) = (open(victim.to_str().unwrap()), open(impostor.to_str().unwrap()));
        let mut t = ModuleTable::new(100);
        let a = t.intern(Path::new("/usr/lib/libv.so"), Some(&[7, 7]), Some(&fv));
        let b = t.intern(Path::new("/tmp/libv.so"), Some(&[7, 7]), Some(&fi));
        assert_ne!(a, b);
        assert_eq!(t.files(a).len(), 1);
        assert_eq!(t.files(b).len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn least_recently_used_module_lets_its_file_go() {
        let dir = std::env::temp_dir().join(format!("symbolizer-lru-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files: Vec<Arc<ModuleFile>> = (0..3)
            .map(|i| {
                let p = dir.join(format!("f{i}"));
                std::fs::write(&p, format!("file {i}")).unwrap();
                open(p.to_str().unwrap())
            })
            .collect();
        let mut t = ModuleTable::new(2);
        let m0 = t.intern(Path::new("/0"), None, Some(&files[0]));
        let m1 = t.intern(Path::new("/1"), None, Some(&files[1]));
        t.intern(Path::new("/0"), None, Some(&files[0]));
        let m2 = t.intern(Path::new("/2"), None, Some(&files[2]));
        assert_eq!((t.files(m0).len(), t.files(m1).len(), t.files(m2).len()), (1, 0, 1));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
