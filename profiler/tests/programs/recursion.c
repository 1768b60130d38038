/* main -> r0 -> r1 -> ... -> r59 -> spin: a 60-deep chain of distinct functions. */
#include <stdlib.h>
#include <time.h>

#include "gate.h"

static volatile unsigned long sink;
static double end;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void spin(void)
{
	while (now() < end)
		for (int i = 0; i < 200000; i++)
			sink += i;
}

#define LEVEL(n, next) __attribute__((noinline)) void r##n(void) { next(); sink++; }
LEVEL(59, spin) LEVEL(58, r59) LEVEL(57, r58) LEVEL(56, r57) LEVEL(55, r56) LEVEL(54, r55)
LEVEL(53, r54) LEVEL(52, r53) LEVEL(51, r52) LEVEL(50, r51) LEVEL(49, r50) LEVEL(48, r49)
LEVEL(47, r48) LEVEL(46, r47) LEVEL(45, r46) LEVEL(44, r45) LEVEL(43, r44) LEVEL(42, r43)
LEVEL(41, r42) LEVEL(40, r41) LEVEL(39, r40) LEVEL(38, r39) LEVEL(37, r38) LEVEL(36, r37)
LEVEL(35, r36) LEVEL(34, r35) LEVEL(33, r34) LEVEL(32, r33) LEVEL(31, r32) LEVEL(30, r31)
LEVEL(29, r30) LEVEL(28, r29) LEVEL(27, r28) LEVEL(26, r27) LEVEL(25, r26) LEVEL(24, r25)
LEVEL(23, r24) LEVEL(22, r23) LEVEL(21, r22) LEVEL(20, r21) LEVEL(19, r20) LEVEL(18, r19)
LEVEL(17, r18) LEVEL(16, r17) LEVEL(15, r16) LEVEL(14, r15) LEVEL(13, r14) LEVEL(12, r13)
LEVEL(11, r12) LEVEL(10, r11) LEVEL(9, r10) LEVEL(8, r9) LEVEL(7, r8) LEVEL(6, r7)
LEVEL(5, r6) LEVEL(4, r5) LEVEL(3, r4) LEVEL(2, r3) LEVEL(1, r2) LEVEL(0, r1)

int main(int argc, char **argv)
{
	gate();
	end = now() + (argc > 1 ? atof(argv[1]) : 2.0);
	r0();
	return 0;
}
