/* libbpf's usdt.bpf.h includes <linux/errno.h>, which includes <asm/errno.h>: under -target bpf
 * no multiarch include directory supplies it. On x86-64 and arm64 it is the generic one. */
#include <asm-generic/errno.h>
