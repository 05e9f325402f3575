/* Memory ops shared by the backends whose device memory is host memory (cpu, ref): alloc
 * through kiln_alloc (counted, zero-filled, 64-byte aligned), copies through memcpy, and a
 * synchronize that only reports the recorded error. */
#ifndef KILN_BACKEND_HOST_H
#define KILN_BACKEND_HOST_H

#include "kiln/backend.h"

kiln_op_alloc kiln__host_alloc;
kiln_op_free kiln__host_free;
kiln_op_copy kiln__host_copy;
kiln_op_synchronize kiln__host_synchronize;
kiln_op_convert kiln__host_convert;

#endif
