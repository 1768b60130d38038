/* The parts of CUPTI's types that gpuflame_cupti.c reads, declared here so that the library
 * builds without the CUDA toolkit. profiler/tests/cupti_layout.rs compiles these against the real
 * cupti_activity.h and cupti_callbacks.h of CUPTI 12 and 13 (offsetof, every CUpti_ActivityKernel
 * version the headers have), so a layout change cannot go unnoticed. */
#ifndef GPUFLAME_CUPTI_LAYOUT_H
#define GPUFLAME_CUPTI_LAYOUT_H

#include <stdint.h>

/* CUpti_CallbackData, as far as used. */
struct cupti_callback_data {
	uint32_t callback_site;
	const char *function_name;
	const void *function_params;
	void *function_return_value;
	const char *symbol_name;
	void *context;
	uint32_t context_uid;
	uint64_t *correlation_data;
	uint32_t correlation_id;
};

/* Offsets into CUpti_ActivityKernel4..10, which only ever grew at the end. */
#define K_KIND 0
#define K_START 16
#define K_END 24
#define K_DEVICE 40
#define K_STREAM 48
#define K_CORRELATION 92
#define K_NAME 104
#define K_GRAPH_NODE 144
#define K_GRAPH 156

#endif
