//! The generated mirrors of the C structs as bytes, and back: what goes into the maps and what
//! comes out of the rings. Reading is safe only for types marked [`Pod`], so that no other type is
//! ever made out of arbitrary bytes.

use std::mem::size_of;

use crate::skel::types;

/// Plain old data: any bytes of its size are a value of it.
///
/// # Safety
/// Only for `repr(C)` types of integer fields and arrays of them, such as the generated mirrors
/// of the C structs.
pub(crate) unsafe trait Pod: Copy {}

macro_rules! pod {
    ($($t:ty),* $(,)?) => { $(
        // SAFETY: generated from BTF as repr(C) structs of integers and integer arrays.
        unsafe impl Pod for $t {}
    )* };
}

pod!(
    types::event_header,
    types::event_stack,
    types::cuda_call_payload,
    types::kernel_name_payload,
    types::cupti_kernels_payload,
    types::cupti_name_payload,
    types::cupti_launch_payload,
    types::cupti_status_payload,
    types::offcpu_stack_payload,
    types::offcpu_end_payload,
    types::hooked_stack_payload,
    types::stack_copy_payload,
    types::cupti_kernel,
    types::process_event,
    types::table_info,
    types::process_info,
    types::exec_mapping,
    types::py_process,
    types::py_offsets,
    types::unwind_block,
    types::unwind_rule,
    types::thread_report,
    types::live_key,
    types::live_allocation,
    types::memory_event,
);

/// The `T` at the start of `data`, if it is long enough.
pub(crate) fn read_pod<T: Pod>(data: &[u8]) -> Option<T> {
    if data.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the length was checked, T is plain old data, and read_unaligned makes no alignment
    // assumption.
    Some(unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) })
}

pub(crate) fn as_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: viewing a Copy value as its bytes; the generated types have no padding holes that
    // the kernel would read as meaningful (they are zero-initialised by Default).
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}
