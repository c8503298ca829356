// The kiln graph: typed SSA values, ops from ops.def, attributes.
// Internal to libkiln; lowering/, lib/ref and lib/api read it, only
// lib/graph builds it.
#ifndef KILN_LIB_GRAPH_GRAPH_H_
#define KILN_LIB_GRAPH_GRAPH_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/base/base.h"

//===--- dtypes -----------------------------------------------------------===//

typedef enum kiln_dtype_e {
  KILN_F32 = 0,
  KILN_F16,
  KILN_BF16,
  KILN_F64,
  KILN_I32,
  KILN_I64,
  KILN_BOOL,
  KILN_DTYPE_COUNT,
} kiln_dtype_t;

const char *kiln_dtype_name(kiln_dtype_t t);       // "f32"
bool kiln_dtype_parse(const char *s, size_t n, kiln_dtype_t *out);
size_t kiln_dtype_size(kiln_dtype_t t);            // bytes per element
bool kiln_dtype_is_float(kiln_dtype_t t);
bool kiln_dtype_is_int(kiln_dtype_t t);            // i32, i64 (not bool)
// PyTorch's promote_types for two dtypes.
kiln_dtype_t kiln_dtype_promote(kiln_dtype_t a, kiln_dtype_t b);
// DLPack conversions; false when the DLPack type has no kiln dtype.
bool kiln_dtype_from_dl(DLDataType dl, kiln_dtype_t *out);
DLDataType kiln_dtype_to_dl(kiln_dtype_t t);

//===--- types ------------------------------------------------------------===//

// A size is >= 0, or a symbolic dim: KILN_SYM(id) with id indexing the
// graph's symbol names.
#define KILN_SYM(id) (-1 - (int64_t)(id))
#define KILN_IS_SYM(d) ((d) < 0)
#define KILN_SYM_ID(d) ((int32_t)(-1 - (d)))

// A symbol is a base size ("s0"), bound from an input's shape at call time,
// or a derived size: a positive constant times base symbols ("128*s0",
// "s0*s1"), as Dynamo's size expressions for flattened dims. A derived
// symbol is interned by its canonical text (the constant, then the factors
// in name order), so equal products are the same symbol; its factors are
// always interned before it (lower ids).
#define KILN_MAX_SYM_FACTORS 4
typedef struct kiln_symdef {
  int64_t coef;          // 1 for a base symbol
  int32_t factor_count;  // 0 for a base symbol
  int32_t factors[KILN_MAX_SYM_FACTORS];  // base symbol ids, ascending
} kiln_symdef_t;

// A size as a product: coef * the base symbols in `factors` (with
// repetition, sorted by id). Static sizes have no factors.
#define KILN_MAX_MONOMIAL_FACTORS 32
typedef struct kiln_monomial {
  int64_t coef;
  int32_t count;
  int32_t factors[KILN_MAX_MONOMIAL_FACTORS];
} kiln_monomial_t;

typedef struct kiln_type {
  kiln_dtype_t dtype;
  int32_t rank;
  int64_t dims[KILN_MAX_RANK];
} kiln_type_t;

bool kiln_type_equal(const kiln_type_t *a, const kiln_type_t *b);
bool kiln_type_is_static(const kiln_type_t *t);
int64_t kiln_type_numel(const kiln_type_t *t);  // static types only

//===--- ops --------------------------------------------------------------===//

typedef enum kiln_op_class_e {
  KILN_CLASS_UNARY,
  KILN_CLASS_UNARY_FLOAT,
  KILN_CLASS_UNARY_BOOL,
  KILN_CLASS_CONVERT,
  KILN_CLASS_BINARY,
  KILN_CLASS_BINARY_FLOAT,
  KILN_CLASS_COMPARE,
  KILN_CLASS_LOGICAL,
  KILN_CLASS_WHERE,
  KILN_CLASS_REDUCE,
  KILN_CLASS_MATMUL,
  KILN_CLASS_CONV,
  KILN_CLASS_SHAPE,
  KILN_CLASS_CREATE,
  KILN_CLASS_NN,
} kiln_op_class_t;

typedef enum kiln_op_id_e {
#define KILN_OP(id, name, cls) KILN_OP_##id,
#include "lib/graph/ops.def"
#undef KILN_OP
  KILN_OP_COUNT,
} kiln_op_id_t;

const char *kiln_op_name(kiln_op_id_t op);
kiln_op_class_t kiln_op_class(kiln_op_id_t op);
bool kiln_op_lookup(const char *name, size_t n, kiln_op_id_t *out);
// True for the elementwise families (one body per element, broadcasting).
bool kiln_op_is_elementwise(kiln_op_id_t op);

//===--- attributes -------------------------------------------------------===//

typedef enum kiln_attr_kind_e {
  KILN_ATTR_INT,
  KILN_ATTR_FLOAT,
  KILN_ATTR_BOOL,
  KILN_ATTR_STR,     // bare identifiers and "quoted" strings
  KILN_ATTR_DTYPE,
  KILN_ATTR_LIST,    // [numbers]; `is_int` when every element is an integer
} kiln_attr_kind_t;

typedef struct kiln_attr {
  const char *name;
  kiln_attr_kind_t kind;
  int64_t i;           // INT, BOOL, DTYPE
  double f;            // FLOAT (and INT as double)
  const char *s;       // STR
  int32_t count;       // LIST
  bool is_int;         // LIST: all elements integral
  const int64_t *ints;   // LIST (valid when is_int)
  // LIST: NULL, or per element whether it is a size expression ("s0",
  // "128*s0"; only in a 'shape' list), whose entry in `ints` is then a
  // KILN_SYM dim. INT: NULL, or {true} when `i` is a KILN_SYM dim (a
  // slice's symbolic `end`).
  const bool *sym;
  const double *floats;  // LIST
} kiln_attr_t;

//===--- operands, nodes, values ------------------------------------------===//

typedef enum kiln_operand_kind_e {
  KILN_OPERAND_VALUE,  // a tensor value
  KILN_OPERAND_INT,    // a Python-like scalar ("wrapped number")
  KILN_OPERAND_FLOAT,
  KILN_OPERAND_BOOL,
  KILN_OPERAND_NONE,   // an absent optional tensor
} kiln_operand_kind_t;

typedef struct kiln_operand {
  kiln_operand_kind_t kind;
  int32_t value;  // VALUE: index into graph->values
  int64_t i;      // INT, BOOL
  double f;       // FLOAT
} kiln_operand_t;

typedef struct kiln_value {
  const char *name;  // without the leading '%'
  kiln_type_t type;
  int32_t node;      // producing node, or -1 for a graph input
  int32_t index;     // result index in the node, or input index
} kiln_value_t;

#define KILN_MAX_RESULTS 4

typedef struct kiln_node {
  kiln_op_id_t op;
  int32_t operand_count;
  kiln_operand_t *operands;
  int32_t attr_count;
  kiln_attr_t *attrs;
  int32_t result_count;
  int32_t results[KILN_MAX_RESULTS];  // indices into graph->values
  int32_t line, col;                  // where it was parsed, for errors
} kiln_node_t;

// An input the graph writes: `return %v -> %x` stores value `value` into
// input `input` (an index into `inputs`) when the call ends. The graph reads
// every input as it was on entry; the store happens after all reads.
typedef struct kiln_mutation {
  int32_t value;
  int32_t input;
  int32_t line, col;  // where it was parsed, for errors
} kiln_mutation_t;

// A relation between sizes that every call must satisfy: `small` <=
// `large` (dims: static or KILN_SYM). The verifier records one where a
// slice's length is a symbolic size, or a static length is cut from a
// symbolic dim, so that a call whose sizes break it is refused
// (kiln_graph_resolve_binding) instead of reading out of bounds.
typedef struct kiln_size_bound {
  int64_t small, large;
  int32_t node;  // the op that needs it (an index into nodes)
} kiln_size_bound_t;

struct kiln_graph {
  kiln_arena_t arena;
  const char *name;
  int32_t value_count, value_capacity;
  kiln_value_t *values;
  int32_t node_count, node_capacity;
  kiln_node_t *nodes;
  int32_t input_count;
  int32_t *inputs;
  int32_t output_count;
  int32_t *outputs;
  int32_t mutation_count;
  kiln_mutation_t *mutations;
  bool *input_written;  // input_count flags: input i is a mutation's target
  int32_t symbol_count;
  const char **symbols;  // symbolic dim names, e.g. "s0", "128*s0"
  kiln_symdef_t *symdefs;  // symbol_count definitions
  int32_t bound_count, bound_capacity;
  kiln_size_bound_t *bounds;  // filled by kiln_graph_verify
};

// Attribute lookup helpers (NULL / default when absent).
const kiln_attr_t *kiln_node_attr(const kiln_node_t *n, const char *name);
int64_t kiln_node_attr_int(const kiln_node_t *n, const char *name,
                           int64_t dflt);
double kiln_node_attr_float(const kiln_node_t *n, const char *name,
                            double dflt);
const char *kiln_node_attr_str(const kiln_node_t *n, const char *name,
                               const char *dflt);

static inline const kiln_type_t *kiln_operand_type(const kiln_graph_t *g,
                                                   const kiln_operand_t *o) {
  return o->kind == KILN_OPERAND_VALUE ? &g->values[o->value].type : NULL;
}
static inline const kiln_type_t *kiln_node_result_type(const kiln_graph_t *g,
                                                       const kiln_node_t *n,
                                                       int i) {
  return &g->values[n->results[i]].type;
}

//===--- parse, verify, print ---------------------------------------------===//

// Parses and verifies. On failure returns a PARSE_ERROR or VERIFY_ERROR.
kiln_status_t kiln_graph_parse_text(const char *text, size_t length,
                                    const char *filename,
                                    kiln_graph_t **out_graph);
// Infers every result type, checking annotated ones. Called by the parser.
kiln_status_t kiln_graph_verify(kiln_graph_t *g, const char *filename);
kiln_status_t kiln_graph_print_text(const kiln_graph_t *g, char **out_text);
// The same text with the graph named @main and every value numbered in order
// of definition (%v0, %v1, ...): graphs that differ only in names print the
// same, which is what the compile cache keys on.
kiln_status_t kiln_graph_print_canonical(const kiln_graph_t *g, char **out_text);
void kiln_graph_free(kiln_graph_t *g);

// Formats a type as "f32[4,s0]" into `buf`.
const char *kiln_type_str(const kiln_graph_t *g, const kiln_type_t *t,
                          char *buf, size_t n);

//===--- symbols (lib/graph/symbols.c) ------------------------------------===//

// The id of base symbol `name` (n bytes), interned if new; -1 when out of
// memory.
int32_t kiln_graph_intern_symbol(kiln_graph_t *g, const char *name, size_t n);
// The dim for coef * factors (base symbol ids, any order): a static size when
// there are no factors, the base symbol itself for 1 * s, else a derived
// symbol, interned if new. INVALID_ARGUMENT when the product overflows or
// has more than KILN_MAX_SYM_FACTORS factors.
kiln_status_t kiln_graph_product_dim(kiln_graph_t *g, int64_t coef,
                                     const int32_t *factors, int32_t count,
                                     int64_t *out_dim);
// `dim` as a monomial.
void kiln_dim_monomial(const kiln_graph_t *g, int64_t dim, kiln_monomial_t *out);
// Multiplies `m` by `dim`; false on overflow or too many factors.
bool kiln_monomial_mul_dim(const kiln_graph_t *g, kiln_monomial_t *m,
                           int64_t dim);
bool kiln_monomial_equal(const kiln_monomial_t *a, const kiln_monomial_t *b);
// "12", "128*s0" into `buf`.
const char *kiln_monomial_str(const kiln_graph_t *g, const kiln_monomial_t *m,
                              char *buf, size_t n);
// num / den when it is a monomial (den's factors among num's, its constant
// dividing num's); false otherwise.
bool kiln_monomial_div(const kiln_monomial_t *num, const kiln_monomial_t *den,
                       kiln_monomial_t *out);
// The number of elements of `t` as a monomial; false on overflow.
bool kiln_type_monomial(const kiln_graph_t *g, const kiln_type_t *t,
                        kiln_monomial_t *out);

// One step of deriving sizes from known ones (`binding`: symbol id -> size,
// -1 unknown), as the call-time binding, the compile-time check and the
// lowering each take them: a product whose factors are all known while it
// is not (returned with *factor = -1), or a known product with exactly one
// unknown factor, not repeated (*factor = that factor, solved by division).
// -1 when no step is left.
int32_t kiln_graph_next_derived(const kiln_graph_t *g, const int64_t *binding,
                                int32_t *factor);
// UNSUPPORTED when a size the graph uses (in a value's type or a 'shape'
// list) is not determined by the input types: no input names it, nor a
// product it is the one unknown factor of.
kiln_status_t kiln_graph_check_symbols(const kiln_graph_t *g);
// Completes a call's binding (symbol id -> size, -1 unbound) once the
// inputs' sizes are in: derived symbols are computed from their factors, and
// a factor bound nowhere else is solved from a derived size. INVALID_ARGUMENT
// when the sizes disagree (an input's 500 rows where 128*s0 is 512) or break
// one of the graph's size bounds (a slice's end past its dim). For a
// graph kiln_graph_check_symbols accepts, every size it uses is bound after.
kiln_status_t kiln_graph_resolve_binding(const kiln_graph_t *g,
                                         int64_t *binding);
// For a binding that fixes some base symbols and leaves others -1: the
// derived symbols whose factors are all fixed get their values, the others -1.
void kiln_graph_derive_binding(const kiln_graph_t *g, int64_t *binding);

// A copy of `g` with every symbolic dim replaced by `binding[symbol]` (a
// negative entry keeps that symbol), re-verified. Used to specialize a
// variant to concrete sizes.
kiln_status_t kiln_graph_specialize(const kiln_graph_t *g,
                                    const int64_t *binding,
                                    kiln_graph_t **out_graph);

// PyTorch's result_type over tensor and scalar operands (NONE skipped):
// dimensioned tensors, then zero-dim tensors, then Python scalars, a later
// tier winning only with a higher category (bool < int < float).
kiln_dtype_t kiln_result_type(const kiln_graph_t *g, const kiln_operand_t *ops,
                              int n);

// The dtype an elementwise node computes in: the promoted operand type
// (float math on integers in f32; a convert in its input's dtype). Operands
// are rounded to it before the op, as PyTorch's TensorIterator does.
kiln_dtype_t kiln_node_compute_dtype(const kiln_graph_t *g,
                                     const kiln_node_t *n);

// Marks in `reduced` the dims of `x` a reduction node reduces (its `dims`
// attribute; absent or empty: all).
void kiln_node_reduced_dims(const kiln_node_t *n, const kiln_type_t *x,
                            bool reduced[KILN_MAX_RANK]);
// A verified 1-or-2-integer attribute (stride, padding, dilation) as a pair.
void kiln_node_attr_pair(const kiln_node_t *n, const char *name, int64_t dflt,
                         int64_t out[2]);
// A verified aten.max_pool2d's window: kernel, stride (the kernel where
// absent), padding and dilation, each as (h, w).
void kiln_node_pool_window(const kiln_node_t *n, int64_t k[2], int64_t st[2], int64_t pd[2],
                           int64_t dl[2]);

// The permutation of a verified permute/transpose node: result dim i is input
// dim perm[i].
void kiln_node_permutation(const kiln_node_t *n, int32_t rank,
                           int32_t perm[KILN_MAX_RANK]);
// The first index a verified slice node reads along its dim of size `size`
// (negative starts count from the end; clamped like Python).
int64_t kiln_node_slice_start(const kiln_node_t *n, int64_t size);

// Normalizes a dim index against `rank` (negative counts from the end).
bool kiln_normalize_dim(int64_t dim, int32_t rank, int32_t *out);

// The mutation that writes input `input`, or NULL (a scan of the
// mutations; `input_written[input]` answers whether in O(1)).
const kiln_mutation_t *kiln_graph_input_mutation(const kiln_graph_t *g,
                                                 int32_t input);

#endif  // KILN_LIB_GRAPH_GRAPH_H_
