// The reference interpreter: runs a verified, static-shaped graph with plain
// loops over double-precision copies of every tensor. Each result is rounded
// to its dtype after the op, as storing it would. It is the oracle for tests.
#ifndef KILN_LIB_REF_REF_H_
#define KILN_LIB_REF_REF_H_

#include "lib/graph/graph.h"

// Runs `g` (all sizes static). `inputs` may be strided CPU tensors; `outputs`
// must be contiguous CPU tensors of the output types (checked by the caller).
// The graph's mutations (`return %v -> %x`) are stored into their inputs
// after every op has run.
kiln_status_t kiln_ref_run(const kiln_graph_t *g, const DLTensor *inputs,
                           DLTensor *outputs);

// Element conversions shared with tests: the value of element `i` of a
// contiguous buffer of dtype `t`, and rounding a double to `t`.
double kiln_ref_load(kiln_dtype_t t, const void *base, int64_t i);
void kiln_ref_store(kiln_dtype_t t, void *base, int64_t i, double v);
double kiln_ref_round(kiln_dtype_t t, double v);

#endif  // KILN_LIB_REF_REF_H_
