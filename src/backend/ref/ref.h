/* The reference kernels, exported inside the library so that other backends can fall
 * back to them for ops they do not specialise. Semantics: include/kiln/backend.h. */
#ifndef KILN_BACKEND_REF_H
#define KILN_BACKEND_REF_H

#include "kiln/backend.h"

KILN_BACKEND_DECLARE(kiln__ref_)
kiln_op_attention_decode kiln__ref_attention_decode; /* optional op (ref_model.c) */

#endif
