/* USDT arguments read as libbpf's bpf_usdt_arg (usdt.bpf.h) reads them, from the specs libbpf
 * wrote when it attached the probe, but a probe's first arguments at once: the spec looked up
 * once and the registers copied from ctx once by plain loads, where bpf_usdt_arg looks the spec
 * up and reads pt_regs through a helper for each argument. For pytorch:malloc's three, that was
 * ~0.37 us of a tensor by the kernel's count. A memory argument still takes a read of the
 * program's memory; a scale-index-base one goes to bpf_usdt_arg itself. */
#ifndef GPUFLAME_USDT_ARGS_H
#define GPUFLAME_USDT_ARGS_H

#include <bpf/usdt.bpf.h>

#define USDT_REGS (sizeof(struct pt_regs) / sizeof(__u64))

/* Argument `i` of the probe by its spec `a`, with the registers `regs` copied from `ctx`. */
static __always_inline int usdt_arg_from(struct pt_regs *ctx, const __u64 *regs, const struct __bpf_usdt_arg_spec *a, __u32 i, long *res)
{
	__u64 val, reg = (__u16)a->reg_off / sizeof(__u64);

	switch (a->arg_type) {
	case BPF_USDT_ARG_CONST:
		val = a->val_off;
		break;
	case BPF_USDT_ARG_REG:
	case BPF_USDT_ARG_REG_DEREF:
		if (reg >= USDT_REGS)
			return -EINVAL;
		val = regs[reg];
		if (a->arg_type == BPF_USDT_ARG_REG_DEREF && bpf_probe_read_user(&val, sizeof(val), (void *)(val + a->val_off)))
			return -EFAULT;
		break;
	default:
		return bpf_usdt_arg(ctx, i, res);
	}
	/* An argument of 1, 2 or 4 bytes to 8, sign-extended where it is signed. */
	val <<= a->arg_bitshift;
	*res = a->arg_signed ? (long)val >> a->arg_bitshift : (long)(val >> a->arg_bitshift);
	return 0;
}

/* The probe's first three arguments, and its fourth where it has one (else 0); an error when it
 * has fewer than three or one does not read. A call of
 * its own: the registers' copy (168 bytes) would otherwise sit in the probe's frame under the
 * whole walk of its stack, past the 512 bytes a chain of calls may take before Linux 6.14. */
static __noinline int usdt_args4(struct pt_regs *ctx, long *a0, long *a1, long *a2, long *a3)
{
	__u64 regs[USDT_REGS];
	struct __bpf_usdt_spec *spec;
	int spec_id = __bpf_usdt_spec_id(ctx);

	if (spec_id < 0)
		return -ESRCH;
	spec = bpf_map_lookup_elem(&__bpf_usdt_specs, &spec_id);
	if (!spec || spec->arg_cnt < 3)
		return -ENOENT;
	__builtin_memcpy(regs, ctx, sizeof(regs));
	if (usdt_arg_from(ctx, regs, &spec->args[0], 0, a0) || usdt_arg_from(ctx, regs, &spec->args[1], 1, a1) ||
	    usdt_arg_from(ctx, regs, &spec->args[2], 2, a2))
		return -EFAULT;
	*a3 = 0;
	if (spec->arg_cnt > 3 && usdt_arg_from(ctx, regs, &spec->args[3], 3, a3))
		*a3 = 0;
	return 0;
}

#endif
