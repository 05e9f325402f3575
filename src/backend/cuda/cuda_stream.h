/* What code outside the CUDA backend may know of its instance, from C or C++: the GPU it runs
 * on and its one stream, so that another library's work (NCCL's collectives,
 * src/dist/comm_nccl.c) queues behind the backend's kernels and before the ones called after
 * it. `be` is kiln_backend_cuda()'s instance. Defined in cuda_backend.cu. */
#ifndef KILN_BACKEND_CUDA_STREAM_H
#define KILN_BACKEND_CUDA_STREAM_H

#include <cuda_runtime_api.h>

#include "kiln/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The stream every op of the backend is queued on. */
cudaStream_t kiln__cuda_stream(kiln_backend *be);
/* The CUDA device the backend started on (its stream's). */
int kiln__cuda_device(kiln_backend *be);

#ifdef __cplusplus
}
#endif
#endif
