/* Prints the CPython struct offsets gpuflame's Python walker needs, as a Rust table entry.
 * Built against an interpreter's own (internal) headers by gen-offsets.sh:
 *   cc -DPy_BUILD_CORE -I$PREFIX/include/python3.X -I$PREFIX/include/python3.X/internal offsets.c */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#else
#include <frameobject.h>
#endif
#if __has_include("internal/pycore_runtime.h")
#include "internal/pycore_runtime.h"
#endif
#if __has_include("internal/pycore_interp.h")
#include "internal/pycore_interp.h"
#endif
#include "internal/pycore_pystate.h"

int main(void)
{
	printf("    PyOffsets {\n");
	printf("        version: (%d, %d),\n", PY_MAJOR_VERSION, PY_MINOR_VERSION);
	printf("        runtime_interpreters_head: %zu,\n", offsetof(_PyRuntimeState, interpreters.head));
#if PY_VERSION_HEX >= 0x030B0000
	printf("        interp_threads_head: %zu,\n", offsetof(PyInterpreterState, threads.head));
#else
	printf("        interp_threads_head: %zu,\n", offsetof(PyInterpreterState, tstate_head));
#endif
	printf("        tstate_next: %zu,\n", offsetof(PyThreadState, next));
	printf("        tstate_thread_id: %zu,\n", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030D0000
	printf("        tstate_frame: %zu,\n", offsetof(PyThreadState, current_frame));
	printf("        cframe_current_frame: None,\n");
#elif PY_VERSION_HEX >= 0x030B0000
	printf("        tstate_frame: %zu,\n", offsetof(PyThreadState, cframe));
	printf("        cframe_current_frame: Some(%zu),\n", offsetof(_PyCFrame, current_frame));
#else
	printf("        tstate_frame: %zu,\n", offsetof(PyThreadState, frame));
	printf("        cframe_current_frame: None,\n");
#endif
#if PY_VERSION_HEX >= 0x030B0000
	printf("        frame_previous: %zu,\n", offsetof(_PyInterpreterFrame, previous));
#if PY_VERSION_HEX >= 0x030D0000
	printf("        frame_code: %zu,\n", offsetof(_PyInterpreterFrame, f_executable));
	printf("        frame_instr: %zu,\n", offsetof(_PyInterpreterFrame, instr_ptr));
#else
	printf("        frame_code: %zu,\n", offsetof(_PyInterpreterFrame, f_code));
	printf("        frame_instr: %zu,\n", offsetof(_PyInterpreterFrame, prev_instr));
#endif
#if PY_VERSION_HEX >= 0x030C0000
	printf("        frame_entry: FrameEntry::Owner { offset: %zu, cstack: %d },\n", offsetof(_PyInterpreterFrame, owner), FRAME_OWNED_BY_CSTACK);
#else
	printf("        frame_entry: FrameEntry::IsEntry { offset: %zu },\n", offsetof(_PyInterpreterFrame, is_entry));
#endif
	printf("        code_adaptive: Some(%zu),\n", offsetof(PyCodeObject, co_code_adaptive));
	printf("        code_qualname: Some(%zu),\n", offsetof(PyCodeObject, co_qualname));
	printf("        code_linetable: %zu,\n", offsetof(PyCodeObject, co_linetable));
#else
	printf("        frame_previous: %zu,\n", offsetof(PyFrameObject, f_back));
	printf("        frame_code: %zu,\n", offsetof(PyFrameObject, f_code));
	printf("        frame_instr: %zu,\n", offsetof(PyFrameObject, f_lasti));
	printf("        frame_entry: FrameEntry::FrameObject,\n");
	printf("        code_adaptive: None,\n");
	printf("        code_qualname: None,\n");
#if PY_VERSION_HEX >= 0x030A0000
	printf("        code_linetable: %zu,\n", offsetof(PyCodeObject, co_linetable));
#else
	printf("        code_linetable: %zu,\n", offsetof(PyCodeObject, co_lnotab));
#endif
#endif
	printf("        code_filename: %zu,\n", offsetof(PyCodeObject, co_filename));
	printf("        code_name: %zu,\n", offsetof(PyCodeObject, co_name));
	printf("        code_firstlineno: %zu,\n", offsetof(PyCodeObject, co_firstlineno));
	printf("        ascii_object_size: %zu,\n", sizeof(PyASCIIObject));
	printf("        compact_object_size: %zu,\n", sizeof(PyCompactUnicodeObject));
	printf("    },\n");
	return 0;
}
