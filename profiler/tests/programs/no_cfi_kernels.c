/* Kernels without CFI, with the prologues of hand-written BLAS kernels, under a chain of C
 * functions with CFI (main -> outer -> kernel -> work), spinning for argv[2] seconds of CPU time:
 *   argv[1] = mkl:     MKL's sgemm prologue (libtorch_cpu.so, mkl_blas_avx512_sgemm_kernel_nocopy_*):
 *                      sub $0x40,%rsp, register saves, mov %rsp,%rbp, then a page-aligned frame of
 *                      k * 192 + 256 bytes rounded up to pages (8 to 64 KiB here), which no stack
 *                      scan crosses; then the frame's base kept in the new frame (mov
 *                      %rbp,0x78(%rsp)) and rbp taken for the body, as the real kernels do, and
 *                      rsp taken back from there (mov 0x78(%rsp),%rax; mov %rax,%rsp).
 *   argv[1] = realign: push %rbp; mov %rsp,%rbp; and $-64,%rsp; sub $0x2000,%rsp.
 * Each touches its frame and calls back `work` (C, with CFI) from its body, so that samples land
 * in the kernel itself and in a function with CFI that it called. The kernels are file-level
 * assembly: the compiler emits no CFI for them. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gate.h"

void mkl_like_kernel(long k, void (*work)(long));
void realigned_kernel(long rounds, void (*work)(long));

__asm__(
	"	.text\n"
	"	.globl mkl_like_kernel\n"
	"	.type mkl_like_kernel, @function\n"
	"mkl_like_kernel:\n"
	"	endbr64\n"
	"	sub $0x40, %rsp\n"
	"	mov %rbx, (%rsp)\n"
	"	mov %rbp, 0x8(%rsp)\n"
	"	mov %r12, 0x10(%rsp)\n"
	"	mov %r13, 0x18(%rsp)\n"
	"	mov %r14, 0x20(%rsp)\n"
	"	mov %r15, 0x28(%rsp)\n"
	"	mov 0x48(%rsp), %r11\n"
	"	mov %rsp, %rbp\n"
	"	imul $192, %rdi, %rax\n"
	"	add $(256 + 4095), %rax\n"
	"	and $-4096, %rax\n"
	"	sub %rax, %rsp\n"
	"	and $-4096, %rsp\n"
	"	mov %rbp, 0x78(%rsp)\n"
	"	mov %rsi, %rbp\n"
	"	mov %rax, %r12\n"
	"	mov $16, %r13\n"
	"1:	xor %rcx, %rcx\n"
	"2:	mov %rcx, (%rsp,%rcx,1)\n" /* every 64 bytes: never the base's slot */
	"	add $64, %rcx\n"
	"	cmp %r12, %rcx\n"
	"	jb 2b\n"
	"	mov %r13, %rdi\n"
	"	call *%rbp\n"
	"	dec %r13\n"
	"	jnz 1b\n"
	"	mov 0x78(%rsp), %rax\n"
	"	mov %rax, %rsp\n"
	"	mov (%rsp), %rbx\n"
	"	mov 0x8(%rsp), %rbp\n"
	"	mov 0x10(%rsp), %r12\n"
	"	mov 0x18(%rsp), %r13\n"
	"	mov 0x20(%rsp), %r14\n"
	"	mov 0x28(%rsp), %r15\n"
	"	add $0x40, %rsp\n"
	"	ret\n"
	"	.size mkl_like_kernel, .-mkl_like_kernel\n"
	"\n"
	"	.globl realigned_kernel\n"
	"	.type realigned_kernel, @function\n"
	"realigned_kernel:\n"
	"	push %rbp\n"
	"	mov %rsp, %rbp\n"
	"	and $-64, %rsp\n"
	"	sub $0x2000, %rsp\n"
	"	push %rbx\n"
	"	push %r12\n"
	"	mov %rsi, %rbx\n"
	"	mov %rdi, %r12\n"
	"3:	xor %rcx, %rcx\n"
	"4:	mov %rcx, 16(%rsp,%rcx,1)\n"
	"	add $64, %rcx\n"
	"	cmp $0x1f00, %rcx\n"
	"	jb 4b\n"
	"	mov %r12, %rdi\n"
	"	call *%rbx\n"
	"	dec %r12\n"
	"	jnz 3b\n"
	"	pop %r12\n"
	"	pop %rbx\n"
	"	mov %rbp, %rsp\n"
	"	pop %rbp\n"
	"	ret\n"
	"	.size realigned_kernel, .-realigned_kernel\n");

static volatile unsigned long sink;

/* CPU time, not wall time: the same samples on a loaded machine. */
static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void work(long r)
{
	for (int i = 0; i < 4000; i++)
		sink += i * r;
}

/* Many calls of the kernel between clock reads (a read of the thread's CPU clock is a system call):
 * samples outside the kernel are rare. */
__attribute__((noinline)) void outer(int mkl, double end)
{
	long k = 40;
	while (now() < end) {
		for (int i = 0; i < 256; i++) {
			if (mkl) {
				mkl_like_kernel(k, work);
				k = k >= 320 ? 40 : k + 40; /* frames of 8 to 64 KiB */
			} else {
				realigned_kernel(16, work);
			}
		}
	}
	sink++;
}

int main(int argc, char **argv)
{
	gate();
	outer(argc > 1 && strcmp(argv[1], "mkl") == 0, now() + (argc > 2 ? atof(argv[2]) : 2.0));
	return 0;
}
