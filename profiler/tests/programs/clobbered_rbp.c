/* Code without CFI that pushes rbp and then uses it as a general register, called from a function
 * whose CFA is rbp-based: MKL's kernels in libtorch_cpu.so (mkl_vml_kernel_sTanh_EXHAynn: push
 * %rbp ... mov %edi,%ebp) under mkl_vml_serv_threader_s_1i_1o. The stack scan finds the kernel's
 * caller; the caller's rule then needs the rbp that the kernel saved, not the counter it left. */
#include <alloca.h>
#include "gate.h"

long clobbering_kernel(long n);

/* No .cfi directives: the kernel has no FDE. Its locals are zeroed so that the scan meets no
 * stale return address before the real one (which a real kernel does not promise; the test
 * asks for the caller's rbp, not for the scan's luck). */
__asm__(".text\n"
	".globl clobbering_kernel\n"
	".type clobbering_kernel, @function\n"
	"clobbering_kernel:\n"
	"	push %rbp\n"
	"	push %rbx\n"
	"	sub $0x58, %rsp\n"
	"	xor %eax, %eax\n"
	"	mov %rax, 0x00(%rsp)\n"
	"	mov %rax, 0x08(%rsp)\n"
	"	mov %rax, 0x10(%rsp)\n"
	"	mov %rax, 0x18(%rsp)\n"
	"	mov %rax, 0x20(%rsp)\n"
	"	mov %rax, 0x28(%rsp)\n"
	"	mov %rax, 0x30(%rsp)\n"
	"	mov %rax, 0x38(%rsp)\n"
	"	mov %rax, 0x40(%rsp)\n"
	"	mov %rax, 0x48(%rsp)\n"
	"	mov %rax, 0x50(%rsp)\n"
	"	mov %rdi, %rbp\n"
	"	xor %ebx, %ebx\n"
	"1:	add %rbp, %rbx\n"
	"	sub $1, %rbp\n"
	"	jnz 1b\n"
	"	mov %rbx, %rax\n"
	"	add $0x58, %rsp\n"
	"	pop %rbx\n"
	"	pop %rbp\n"
	"	ret\n"
	".size clobbering_kernel, .-clobbering_kernel\n");

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* A frame-pointer frame (alloca forces one whatever the flags): its CFA is rbp + 16. */
__attribute__((noinline)) long rbp_framed_caller(long n)
{
	volatile char *room = alloca(16 + (n & 15));
	room[0] = 1;
	long r = clobbering_kernel(n);
	return r + room[0];
}

int main(int argc, char **argv)
{
	gate();
	double end = now() + (argc > 1 ? atof(argv[1]) : 3);
	long sum = 0;
	while (now() < end)
		sum += rbp_framed_caller(2000000);
	return sum == 42;
}
