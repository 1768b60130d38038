//! The per-process maps the unwinder reads beside the tables: each process's executable mappings,
//! the tables published by file identity, and where a Python process's interpreter is.

use gpuflame_pyframes::FrameEntry;
use gpuflame_unwind::LoadSegment;
use libbpf_rs::{MapCore, MapFlags, MapMut};

use crate::error::BpfError;
use crate::pod::as_bytes;
use crate::skel::types;
use crate::unwind_maps::{map_err, ExecMapping, MappingTable, PythonProcess, TableId, UnwindMaps, MAX_PROCESS_MAPPINGS};

impl UnwindMaps {
    pub(crate) fn set_process(map: &MapMut<'_>, pid: u32, mappings: &[ExecMapping], forked_from: Option<u32>) -> Result<usize, BpfError> {
        let mut sorted: Vec<ExecMapping> = mappings.to_vec();
        sorted.sort_by_key(|m| m.begin);
        let kept = sorted.len().min(MAX_PROCESS_MAPPINGS);
        let mut info: Box<types::process_info> = Box::default();
        info.mapping_count = kept as u32;
        info.forked_from = forked_from.unwrap_or(0);
        for (slot, m) in info.mappings.iter_mut().zip(&sorted[..kept]) {
            let (table_id, flags) = match m.table {
                MappingTable::Loaded(t) => (t.0, types::exec_mapping_flags::MAPPING_HAS_TABLE.0),
                MappingTable::Pending => (0, types::exec_mapping_flags::MAPPING_TABLE_PENDING.0),
                MappingTable::None => (0, 0),
            };
            *slot = types::exec_mapping { begin: m.begin, end: m.end, load_bias: m.load_bias, table_id, flags };
        }
        map.update(&pid.to_ne_bytes(), as_bytes(&*info), MapFlags::ANY).map_err(map_err("processes"))?;
        Ok(sorted.len() - kept)
    }

    fn file_table_key(dev: u64, ino: u64, size: u64) -> types::file_table_key {
        // The kernel's dev_t: a 12-bit major above a 20-bit minor.
        let dev = (libc::major(dev) << 20) | (libc::minor(dev) & 0xf_ffff);
        types::file_table_key { ino, size, dev, _pad: 0 }
    }

    pub(crate) fn publish_file_table(map: &MapMut<'_>, dev: u64, ino: u64, size: u64, id: TableId, segments: &[LoadSegment]) -> Result<(), BpfError> {
        let mut value = types::file_table { table_id: id.0, ..Default::default() };
        let mapped = segments.iter().filter(|s| s.file_size > 0);
        for (slot, seg) in value.segments.iter_mut().zip(mapped) {
            // ld.so maps each segment from its page-aligned offset (see gpuflame_unwind::load_bias).
            *slot = types::file_table_segment { file_offset: seg.file_offset & !4095, delta: seg.vaddr.wrapping_sub(seg.file_offset) };
            value.segment_count += 1;
        }
        let key = Self::file_table_key(dev, ino, size);
        map.update(as_bytes(&key), as_bytes(&value), MapFlags::ANY).map_err(map_err("file_tables"))
    }

    pub(crate) fn unpublish_file_table(map: &MapMut<'_>, dev: u64, ino: u64, size: u64) {
        let key = Self::file_table_key(dev, ino, size);
        let _ = map.delete(as_bytes(&key));
    }

    pub(crate) fn set_python(map: &MapMut<'_>, pid: u32, py: &PythonProcess) -> Result<(), BpfError> {
        let o = &py.offsets;
        let off = |v: usize| u16::try_from(v).unwrap_or(u16::MAX);
        let (frame_kind, frame_entry, owner_cstack) = match o.frame_entry {
            FrameEntry::FrameObject => (0u8, u16::MAX, 0u8),
            FrameEntry::IsEntry { offset } => (1, off(offset), 0),
            FrameEntry::Owner { offset, cstack } => (2, off(offset), cstack),
        };
        let mut value = types::py_process {
            runtime: py.runtime,
            none_object: if o.shim_holds_none() { py.none_addr } else { 0 },
            o: types::py_offsets {
                runtime_interpreters_head: off(o.runtime_interpreters_head),
                interp_threads_head: off(o.interp_threads_head),
                tstate_next: off(o.tstate_next),
                tstate_thread_id: off(o.tstate_thread_id),
                tstate_frame: off(o.tstate_frame),
                cframe_current_frame: o.cframe_current_frame.map_or(u16::MAX, off),
                frame_previous: off(o.frame_previous),
                frame_code: off(o.frame_code),
                frame_instr: off(o.frame_instr),
                frame_entry,
                code_adaptive: o.code_adaptive.map_or(u16::MAX, off),
                code_firstlineno: off(o.code_firstlineno),
                code_name: off(o.code_qualname.unwrap_or(o.code_name)),
                frame_kind,
                owner_cstack,
                code_tagged: u8::from(o.code_tagged()),
                eval_by_shim: u8::from(o.eval_by_shim()),
            },
            ..Default::default()
        };
        for (i, &(lo, hi)) in py.eval_ranges.iter().take(value.eval_lo.len()).enumerate() {
            value.eval_lo[i] = lo;
            value.eval_hi[i] = hi;
        }
        map.update(&pid.to_ne_bytes(), as_bytes(&value), MapFlags::ANY).map_err(map_err("python_processes"))
    }

    pub(crate) fn remove_process(map: &MapMut<'_>, pid: u32) {
        // Already gone when the exit handler in BPF removed it first.
        let _ = map.delete(&pid.to_ne_bytes());
    }

    /// Moves the unwinder's epoch on (maps.h `unwind_epoch`), after a write to the maps that the
    /// rules it keeps per address were checked against: those rules are checked again. Not one
    /// atomic step with BPF's own bumps, and need not be: a bump lost to a race still leaves the
    /// epoch past every value read before this write.
    pub(crate) fn bump_epoch(map: &MapMut<'_>) -> Result<(), BpfError> {
        let key = 0u32.to_ne_bytes();
        let now = map
            .lookup(&key, MapFlags::ANY)
            .map_err(map_err("unwind_epoch"))?
            .and_then(|v| v.try_into().ok())
            .map_or(0, u64::from_ne_bytes);
        map.update(&key, &now.wrapping_add(1).to_ne_bytes(), MapFlags::ANY).map_err(map_err("unwind_epoch"))
    }
}
