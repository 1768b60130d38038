/* Tells MKL that this CPU is Intel's, whatever CPUID says: MKL picks its sgemm kernels by CPU,
 * and only on Intel CPUs the `nocopy` kernels that have no CFI (issue #56). libtorch_cpu.so, in
 * which the PyPI wheel links MKL, exports mkl_serv_intel_cpu_true and calls it through its PLT,
 * so LD_PRELOAD of this library answers for it. For benches/mkl_nocopy.sh only: MKL's kernels for
 * Intel's AVX2 run on any CPU with AVX2. */
int mkl_serv_intel_cpu_true(void)
{
	return 1;
}
