/* Shared between the stand-in CUDA runtime and the stand-in NCCL. */
#pragma once
#include <stddef.h>

/* The writable view of stand-in device memory at p, or NULL when p is not
 * device memory. */
void* cclz_standin_view(const void* p);

/* Calls the stand-in NCCL has served (collectives, send/recv, split), for
 * the test to check that the device-buffer calls really reached it. */
long cclz_standin_nccl_calls(void);
