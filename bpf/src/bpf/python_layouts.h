/* CPython's layouts, written by user space for each Python process and read by the walker
 * (python_walk.h): part of events.h, whose Rust mirror is generated the same way. */
#ifndef GPUFLAME_PYTHON_LAYOUTS_H
#define GPUFLAME_PYTHON_LAYOUTS_H

/* How a slot of user_stack says what it holds, as an enum so that user space reads the values
 * from this object's BTF (events/sample.rs, through the skeleton's types) and never copies them.
 *
 * A Python frame takes two slots: the code object's address with bit FRAME_TAG_PYTHON_BIT set (no
 * user-space address has it), then (co_firstlineno << 32) | lasti (in the version's unit: bytes
 * up to 3.9, code units from 3.10). Bits FRAME_TAG_NAME_SHIFT to 62 of the first slot: a 16-bit
 * tag of the code object's name (its length xor its hash) as the walker read it, so that user
 * space can tell whether the object it reads later is still the same. With the Python bit and
 * no address, FRAME_TAG_GAP is a one-slot marker between the native frames recovered and Python
 * frames emitted after the native walk stopped early; FRAME_TAG_PY_CALL, after the gap of a
 * STACK_COPIED sample, ends one eval-loop call's Python frames, and the slot after it holds the
 * address of the shim frame that ended them (3.12+), or 0. */
enum frame_tag {
	FRAME_TAG_GAP = 1,
	FRAME_TAG_PY_CALL = 2,
	FRAME_TAG_NAME_SHIFT = 47,
	FRAME_TAG_PYTHON_BIT = 63,
};

#define PY_FRAME_TAG (1ULL << FRAME_TAG_PYTHON_BIT)
#define PY_NAME_TAG_SHIFT FRAME_TAG_NAME_SHIFT
#define PY_ADDR_MASK ((1ULL << PY_NAME_TAG_SHIFT) - 1)
#define USER_GAP_MARK (PY_FRAME_TAG | FRAME_TAG_GAP)
#define PY_CALL_MARK (PY_FRAME_TAG | FRAME_TAG_PY_CALL)

enum py_frame_kind {
	PY_FRAME_OBJECT = 0,   /* 3.8-3.10: one PyFrameObject per evaluation-loop call */
	PY_FRAME_IS_ENTRY = 1, /* 3.11: _PyInterpreterFrame.is_entry ends a call's frames */
	PY_FRAME_OWNER = 2,    /* 3.12+: a frame owned by the C stack ends a call's frames */
};

#define PY_NO_OFFSET 0xffff

struct py_offsets {
	__u16 runtime_interpreters_head;
	__u16 interp_threads_head;
	__u16 tstate_next;
	__u16 tstate_thread_id;
	__u16 tstate_frame;
	__u16 cframe_current_frame; /* PY_NO_OFFSET unless 3.11/3.12 */
	__u16 frame_previous;
	__u16 frame_code;
	__u16 frame_instr;
	__u16 frame_entry;      /* is_entry (3.11) or owner (3.12+) */
	__u16 code_adaptive;    /* PY_NO_OFFSET before 3.11 */
	__u16 code_firstlineno;
	__u16 code_name;        /* the name user space shows: co_qualname (3.11+) or co_name */
	__u8 frame_kind;        /* enum py_frame_kind */
	__u8 owner_cstack;
	__u8 code_tagged;       /* 3.14: f_executable is a tagged stack reference */
	/* 3.12+: an eval-loop call is the native frame whose stack holds the C-stack shim frame that
	 * ends its Python frames. This needs no symbol, and finds the loop in stripped builds and in
	 * the clones that LTO makes of it (Debian's 3.13 runs a copy, not the exported symbol). */
	__u8 eval_by_shim;
};

#define PY_MAX_EVAL_RANGES 4

struct py_process {
	__u64 runtime;
	__u64 eval_lo[PY_MAX_EVAL_RANGES];
	__u64 eval_hi[PY_MAX_EVAL_RANGES];
	struct py_offsets o;
	/* 3.12+, learned by the walk (user space writes 0): where a found shim sat below its
	 * eval-loop frame's CFA, and its instruction pointer (the interpreter's trampoline). With
	 * them an eval-loop frame is known by its own shim when the chain to it is too long to
	 * follow (python_walk.h, PY_SHIM_BEYOND). */
	__u64 shim_instr;
	__u32 shim_below_cfa;
	__u32 shim_pad;
	/* 3.13+: None, which the shim's code slot holds; before any shim was found, an eval-loop
	 * frame is known by a shim with None found in it (0: not known). */
	__u64 none_object;
};

#endif
