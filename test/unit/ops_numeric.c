// Differential test of every op and dtype: kiln's compiled code against the
// reference interpreter on fresh random inputs (a new seed every run, printed
// for reproduction), contiguous and strided, with outputs poisoned first.
//   ops_numeric [FAMILY] [--seed=S]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"
#include "tools/tensor_util.h"

typedef struct {
  const char *family;
  const char *dtypes;  // space-separated dtypes substituted for $T
  const char *text;    // graph text
  // The magnitude absolute errors are judged against, when larger than the
  // outputs' own (0: the outputs'). A sum of N inputs in [-1, 1] rounds on
  // partial sums of about sqrt(N) whatever its result, which may cancel to
  // near zero: f32 sums of 131072 elements came within 1.7e-5 of a result
  // of -0.046, beyond an atol of 1e-5 scaled by that result.
  double error_scale;
} op_case_t;

#define FLOATS "f32 f16 bf16 f64"
#define NUMERIC "f32 f16 bf16 f64 i32 i64"
#define ALL "f32 f16 bf16 f64 i32 i64 bool"

static const op_case_t kCases[] = {
    // Elementwise unary.
    {"unary", NUMERIC, "graph @t(%x: $T[3,17]) {\n %y = aten.neg(%x)\n return %y\n}"},
    {"unary", NUMERIC, "graph @t(%x: $T[3,17]) {\n %y = aten.abs(%x)\n return %y\n}"},
    {"unary", NUMERIC, "graph @t(%x: $T[3,17]) {\n %y = aten.relu(%x)\n return %y\n}"},
    {"unary", ALL, "graph @t(%x: $T[3,17]) {\n %y = aten.clone(%x)\n return %y\n}"},
    {"unary", FLOATS " i32", "graph @t(%x: $T[3,17]) {\n %y = aten.exp(%x)\n return %y\n}"},
    {"unary", FLOATS, "graph @t(%x: $T[3,17]) {\n %y = aten.log(%x)\n return %y\n}"},
    {"unary", FLOATS, "graph @t(%x: $T[3,17]) {\n %y = aten.sqrt(%x)\n return %y\n}"},
    {"unary", FLOATS, "graph @t(%x: $T[3,17]) {\n %y = aten.rsqrt(%x)\n return %y\n}"},
    {"unary", FLOATS " i64", "graph @t(%x: $T[3,17]) {\n %y = aten.tanh(%x)\n return %y\n}"},
    {"unary", FLOATS, "graph @t(%x: $T[3,17]) {\n %y = aten.sigmoid(%x)\n return %y\n}"},
    {"unary", FLOATS, "graph @t(%x: $T[3,17]) {\n %y = aten.gelu(%x)\n return %y\n}"},
    {"unary", FLOATS, "graph @t(%x: $T[3,17]) {\n %y = aten.gelu(%x) {approximate = \"tanh\"}\n return %y\n}"},
    {"unary", FLOATS, "graph @t(%x: $T[3,17]) {\n %y = aten.erf(%x)\n return %y\n}"},
    {"unary", FLOATS, "graph @t(%x: $T[3,17]) {\n %y = aten.sin(%x)\n return %y\n}"},
    {"unary", FLOATS, "graph @t(%x: $T[3,17]) {\n %y = aten.cos(%x)\n return %y\n}"},
    {"unary", ALL, "graph @t(%x: $T[3,17]) {\n %y = aten.logical_not(%x)\n return %y\n}"},
    {"convert", ALL, "graph @t(%x: $T[3,17]) {\n %a = prims.convert_element_type(%x) {dtype = f32}\n"
                     " %b = prims.convert_element_type(%x) {dtype = i64}\n"
                     " %c = prims.convert_element_type(%x) {dtype = bool}\n"
                     " %d = prims.convert_element_type(%x) {dtype = bf16}\n"
                     " %e = prims.convert_element_type(%x) {dtype = f16}\n"
                     " %f = prims.convert_element_type(%x) {dtype = i32}\n return %a, %b, %c, %d, %e, %f\n}"},
    // Elementwise binary, broadcasting both ways and against scalars.
    {"binary", NUMERIC, "graph @t(%x: $T[3,17], %y: $T[17]) {\n %z = aten.add(%x, %y)\n return %z\n}"},
    {"binary", NUMERIC, "graph @t(%x: $T[3,1], %y: $T[1,17]) {\n %z = aten.add(%x, %y) {alpha = 2}\n return %z\n}"},
    {"binary", "bool", "graph @t(%x: $T[3,17], %y: $T[17]) {\n %z = aten.add(%x, %y)\n return %z\n}"},
    {"binary", NUMERIC, "graph @t(%x: $T[3,17], %y: $T[3,17]) {\n %z = aten.sub(%x, %y)\n return %z\n}"},
    {"binary", ALL, "graph @t(%x: $T[3,17], %y: $T[3,1]) {\n %z = aten.mul(%x, %y)\n return %z\n}"},
    {"binary", ALL, "graph @t(%x: $T[3,17], %y: $T[17]) {\n %z = aten.maximum(%x, %y)\n return %z\n}"},
    {"binary", ALL, "graph @t(%x: $T[3,17], %y: $T[17]) {\n %z = aten.minimum(%x, %y)\n return %z\n}"},
    {"binary", NUMERIC, "graph @t(%x: $T[3,17], %y: $T[17]) {\n %z = aten.div(%x, %y)\n return %z\n}"},
    {"binary", NUMERIC, "graph @t(%x: $T[3,17], %y: $T[17]) {\n %z = aten.div(%x, %y) {rounding_mode = \"trunc\"}\n return %z\n}"},
    {"binary", NUMERIC, "graph @t(%x: $T[3,17], %y: $T[17]) {\n %z = aten.div(%x, %y) {rounding_mode = \"floor\"}\n return %z\n}"},
    {"binary", NUMERIC, "graph @t(%x: $T[3,17]) {\n %z = aten.pow(%x, 2)\n return %z\n}"},
    {"binary", "i32 i64", "graph @t(%x: $T[3,17], %y: $T[17]) {\n %z = aten.pow(%x, %y)\n return %z\n}"},
    {"binary", FLOATS, "graph @t(%x: $T[3,17]) {\n %a = aten.abs(%x)\n %z = aten.pow(%a, 0.5)\n return %z\n}"},
    {"binary", NUMERIC, "graph @t(%x: $T[3,17]) {\n %z = aten.mul(%x, 2.5)\n return %z\n}"},
    {"compare", ALL, "graph @t(%x: $T[3,17], %y: $T[17]) {\n %a = aten.eq(%x, %y)\n %b = aten.ne(%x, %y)\n"
                     " %c = aten.lt(%x, %y)\n %d = aten.le(%x, %y)\n %e = aten.gt(%x, %y)\n %f = aten.ge(%x, %y)\n"
                     " return %a, %b, %c, %d, %e, %f\n}"},
    {"compare", NUMERIC, "graph @t(%x: $T[3,17]) {\n %a = aten.gt(%x, 0.25)\n return %a\n}"},
    {"logical", ALL, "graph @t(%x: $T[3,17], %y: $T[17]) {\n %a = aten.logical_and(%x, %y)\n"
                     " %b = aten.logical_or(%x, %y)\n %c = aten.logical_xor(%x, %y)\n return %a, %b, %c\n}"},
    {"where", ALL, "graph @t(%c: bool[3,17], %x: $T[3,17], %y: $T[17]) {\n %z = aten.where(%c, %x, %y)\n return %z\n}"},
    {"where", NUMERIC, "graph @t(%c: bool[3,17], %x: $T[3,17]) {\n %z = aten.where(%c, %x, 0)\n return %z\n}"},
    // Special values through kiln's own f32 exp/log/tanh/erf
    // (math_approx.c): infinities, NaN, overflow and underflow edges, tiny
    // and large inputs.
    {"special", "f32 f16 bf16 f64", "graph @t(%x: $T[3]) {\n"
     " %c = kiln.constant() {value = [-inf, -104.0, -88.0, -87.0, -20.0, -2.5, -0.7, -0.001, 0.0, 1e-06, 0.3, 0.62, 0.63, 3.0, 9.5, 20.0, 88.0, 88.7, 88.73, 100.0, inf, nan]} : $T[22]\n"
     " %a = aten.exp(%c)\n %b = aten.tanh(%c)\n %d = aten.erf(%c)\n %e = aten.sigmoid(%c)\n"
     " %f = aten.gelu(%c)\n %g = aten.gelu(%c) {approximate = \"tanh\"}\n %l = aten.log(%c)\n %y = aten.neg(%x)\n"
     " return %a, %b, %d, %e, %f, %g, %l, %y\n}"},
    // log across the range: subnormals, both sides of the reduction's
    // sqrt(1/2) split, around 1, the largest finite floats, -0.
    {"special", "f32 bf16 f64", "graph @t(%x: $T[3]) {\n"
     " %c = kiln.constant() {value = [1e-45, 1e-40, 1.1e-38, 1.2e-38, 1e-30, 1e-10, 0.001, 0.5, 0.7071067, 0.7071068, 0.75, 0.9999999, 1.0, 1.0000001, 1.1, 1.4142135, 1.4142137, 2.0, 2.718282, 10.0, 12345.678, 1e10, 1e30, 3.4e38, -0.0, -1e-40]} : $T[26]\n"
     " %l = aten.log(%c)\n %y = aten.neg(%x)\n return %l, %y\n}"},
    // f32 log within 2 ulp of the correctly rounded result over 9 decades
    // of magnitude (subnormals included): the graph measures its own
    // relative error against the f64 log and answers a bool (the
    // tolerances above would let a wrong coefficient through).
    {"special", "f32", "graph @t(%x: $T[4096]) {\n"
     " %s = kiln.constant() {value = [1e-40, 1e-30, 1e-10, 0.001, 1.0, 1.5, 1000.0, 1e10, 1e30]} : $T[9,1]\n"
     " %a = aten.abs(%x)\n %b = aten.mul(%a, %s)\n %l = aten.log(%b)\n"
     " %w = prims.convert_element_type(%b) {dtype = f64}\n %lw = aten.log(%w)\n"
     " %l64 = prims.convert_element_type(%l) {dtype = f64}\n %d = aten.sub(%l64, %lw)\n"
     " %r = aten.div(%d, %lw)\n %m = aten.abs(%r)\n %mx = aten.amax(%m)\n"
     " %ok = aten.lt(%mx, 2.4e-07)\n return %ok\n}"},
    // f32 erf within 4e-7 of the f64 erf on [-5, 5] (math_approx.c's
    // rational form, 3.3e-7 at worst), and saturated: GELU below -15 is
    // exactly 0 (as the f64 reference rounds it), where an erf a rounding
    // error short of -1 would give |x| times that error.
    {"special", "f32", "graph @t(%x: $T[4096]) {\n"
     " %s = kiln.constant() {value = [0.5, 2.0, 3.5, 5.0]} : $T[4,1]\n"
     " %b = aten.mul(%x, %s)\n %e = aten.erf(%b)\n"
     " %w = prims.convert_element_type(%b) {dtype = f64}\n %ew = aten.erf(%w)\n"
     " %e64 = prims.convert_element_type(%e) {dtype = f64}\n %d = aten.sub(%e64, %ew)\n"
     " %m = aten.abs(%d)\n %mx = aten.amax(%m)\n %ok = aten.lt(%mx, 4e-07)\n"
     " %a = aten.abs(%x)\n %n = aten.mul(%a, -10000.0)\n %n6 = aten.sub(%n, 15.0)\n"
     " %g = aten.gelu(%n6)\n %ga = aten.abs(%g)\n %gm = aten.amax(%ga)\n"
     " %z = aten.eq(%gm, 0.0)\n return %ok, %z\n}"},
    // Type promotion across dtypes.
    {"promote", "f16 bf16 i32", "graph @t(%x: $T[3,17], %y: f32[17]) {\n %z = aten.add(%x, %y)\n return %z\n}"},
    {"promote", "i32 i64 bool", "graph @t(%x: $T[3,17]) {\n %z = aten.add(%x, 1.5)\n return %z\n}"},
    {"promote", "f16 bf16", "graph @t(%x: $T[3,17], %y: f32[]) {\n %z = aten.mul(%x, %y)\n return %z\n}"},
    {"promote", "i32", "graph @t(%x: $T[3,17], %y: i64[17]) {\n %z = aten.mul(%x, %y)\n return %z\n}"},
    // Reductions.
    {"reduce", ALL, "graph @t(%x: $T[4,5,7]) {\n %a = aten.sum(%x) {dims = [1]}\n %b = aten.sum(%x) {dims = [0, 2], keepdim = true}\n"
                    " %c = aten.sum(%x)\n return %a, %b, %c\n}"},
    {"reduce", NUMERIC, "graph @t(%x: $T[4,5,7]) {\n %a = aten.amax(%x) {dims = [-1]}\n %b = aten.amin(%x) {dims = [0], keepdim = true}\n"
                        " %c = aten.prod(%x) {dims = [1]}\n return %a, %b, %c\n}"},
    {"reduce", FLOATS, "graph @t(%x: $T[4,5,7]) {\n %a = aten.mean(%x) {dims = [-1], keepdim = true}\n %b = aten.var(%x) {dims = [1]}\n"
                       " %c = aten.var(%x) {dims = [0, 2], correction = 0, keepdim = true}\n %d = aten.mean(%x)\n return %a, %b, %c, %d\n}"},
    // Two outputs whose reductions start from identical fills: each must land
    // in its own output (a shared init once made them alias).
    {"reduce", "f32 bf16", "graph @t(%x: $T[4,7,48], %y: $T[4,7,48]) {\n %m = aten.mul(%x, %y)\n"
                           " %s = aten.sum(%m) {dims = [0, 1]}\n %t = aten.sum(%x) {dims = [0, 1]}\n return %s, %t\n}"},
    {"reduce", "i32", "graph @t(%x: $T[4,5]) {\n %a = aten.mean(%x) {dims = [1], dtype = f32}\n return %a\n}"},
    // Whole tensors of 128K elements: split into rows of partials, then the
    // partials (kiln_lower_options_t.split_full_reductions).
    {"reduce", ALL, "graph @t(%x: $T[64,2048], %v: $T[131072]) {\n %a = aten.sum(%x)\n"
                    " %b = aten.sum(%x) {dims = [0, 1], keepdim = true}\n %c = aten.sum(%v)\n return %a, %b, %c\n}",
     362.0 /* sqrt(131072) */},
    {"reduce", NUMERIC, "graph @t(%x: $T[64,2048]) {\n %a = aten.amax(%x)\n %b = aten.amin(%x) {keepdim = true}\n return %a, %b\n}"},
    // Bool max and min (any, all) along rows: the accumulator combines in its
    // i8 storage, one op the schedule's reduction tiling matches (an i1
    // load and store around it failed to compile: _safe_softmax's row test).
    {"reduce", "bool", "graph @t(%x: $T[8,4,64,64], %y: $T[64,64,3]) {\n %a = aten.amax(%x) {dims = [-1], keepdim = true}\n"
                       " %b = aten.amin(%x) {dims = [-1]}\n %c = aten.amax(%y) {dims = [-1]}\n %d = aten.amin(%y) {dims = [-1]}\n"
                       " return %a, %b, %c, %d\n}"},
    {"reduce", FLOATS, "graph @t(%x: $T[64,2048]) {\n %a = aten.mean(%x)\n %b = aten.var(%x) {dims = [0, 1]}\n return %a, %b\n}"},
    // Contractions.
    {"matmul", NUMERIC, "graph @t(%a: $T[5,7], %b: $T[7,9]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    {"matmul", NUMERIC, "graph @t(%a: $T[2,5,7], %b: $T[2,7,9]) {\n %c = aten.bmm(%a, %b)\n return %c\n}"},
    {"matmul", FLOATS, "graph @t(%c: $T[9], %a: $T[5,7], %b: $T[7,9]) {\n %d = aten.addmm(%c, %a, %b) {beta = 0.5, alpha = 2.0}\n return %d\n}"},
    {"matmul", "f32 i64", "graph @t(%c: $T[5,9], %a: $T[5,7], %b: $T[7,9]) {\n %d = aten.addmm(%c, %a, %b)\n return %d\n}"},
    // Transposed operands read through indexing maps, not materialized.
    {"matmul", NUMERIC, "graph @t(%a: $T[7,5], %b: $T[9,7], %c: $T[9]) {\n %at = aten.permute(%a) {dims = [1, 0]}\n"
                        " %bt = aten.transpose(%b) {dim0 = 0, dim1 = 1}\n %d = aten.mm(%at, %bt)\n"
                        " %e = aten.addmm(%c, %at, %bt)\n return %d, %e, %bt\n}"},
    {"matmul", "f32", "graph @t(%a: $T[64,96], %b: $T[128,96]) {\n %bt = aten.permute(%b) {dims = [1, 0]}\n %c = aten.mm(%a, %bt)\n return %c\n}"},
    {"matmul", "f32", "graph @t(%a: $T[64,96], %b: $T[96,128]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    // addmm accumulating into its broadcast bias (alpha = 1), fused into
    // the register tiles of a distributed contraction; beta scales the
    // bias first.
    {"matmul", FLOATS, "graph @t(%c: $T[128], %a: $T[64,96], %b: $T[96,128]) {\n %d = aten.addmm(%c, %a, %b)\n"
                       " %e = aten.addmm(%c, %a, %b) {beta = 0.5}\n return %d, %e\n}"},
    // K in cache blocks of 256 (the [1024, 512] slab of B outgrows L2): the
    // zero fill stays at the thread tile, ahead of the blocks (16 rows:
    // under the f32 microkernel's 32).
    {"matmul", "f32", "graph @t(%a: $T[16,1024], %b: $T[1024,512]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    // bf16 shapes the AVX512-BF16 microkernel takes (K even; M of 8, 4 and
    // 2 rows per register tile; other N below), strided A included,
    // and an addmm epilogue; on other CPUs the f32-FMA path.
    {"matmul", "bf16", "graph @t(%a: $T[64,96], %b: $T[96,128]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    // Empty dims: nothing to tile (an empty K gives zeros; an empty output
    // has nothing to write).
    {"matmul", "f32 bf16", "graph @t(%a: $T[4,0], %b: $T[0,32]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    {"matmul", "f32", "graph @t(%a: $T[0,16], %b: $T[16,32]) {\n %c = aten.mm(%a, %b)\n %r = aten.relu(%c)\n return %r\n}"},
    {"matmul", "bf16", "graph @t(%a: $T[12,34], %b: $T[34,64]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    {"matmul", "bf16", "graph @t(%a: $T[6,2], %b: $T[2,32]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    {"matmul", "bf16", "graph @t(%c: $T[96], %a: $T[40,256], %b: $T[256,96]) {\n %d = aten.addmm(%c, %a, %b)\n return %d\n}"},
    // A linear layer's transposed weight: B = W^T packed by 8x8 transposes
    // of W's bf16 pairs (K a multiple of 16), plain mm and addmm; K of 34
    // takes the generic pack.
    {"matmul", "bf16", "graph @t(%a: $T[24,48], %w: $T[64,48]) {\n %t = aten.permute(%w) {dims = [1, 0]}\n"
                       " %c = aten.mm(%a, %t)\n return %c\n}"},
    {"matmul", "bf16", "graph @t(%c: $T[96], %a: $T[10,32], %w: $T[96,32]) {\n %t = aten.permute(%w) {dims = [1, 0]}\n"
                       " %d = aten.addmm(%c, %a, %t)\n return %d\n}"},
    {"matmul", "bf16", "graph @t(%a: $T[8,34], %w: $T[32,34]) {\n %t = aten.permute(%w) {dims = [1, 0]}\n"
                       " %c = aten.mm(%a, %t)\n return %c\n}"},
    // N not a multiple of 32: packed B zero-padded to whole 32-column
    // panels, the last panel's writes stopping at N (a masked half, a
    // skipped half); the transposed pack with N a multiple of 8 (40) and
    // the generic one (37); addmm's f32 accumulator path.
    {"matmul", "bf16", "graph @t(%a: $T[8,64], %b: $T[64,37], %c: $T[64,48], %d: $T[64,50]) {\n"
                       " %x = aten.mm(%a, %b)\n %y = aten.mm(%a, %c)\n %z = aten.mm(%a, %d)\n return %x, %y, %z\n}"},
    // B of more than one 16K-element slab (its rows go into the zero-padded
    // panels by slabs, kiln_emit_insert_slabs).
    {"matmul", "bf16", "graph @t(%a: $T[16,512], %b: $T[512,100]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    {"matmul", "bf16", "graph @t(%a: $T[16,32], %w: $T[40,32], %v: $T[37,32]) {\n"
                       " %wt = aten.permute(%w) {dims = [1, 0]}\n %vt = aten.permute(%v) {dims = [1, 0]}\n"
                       " %x = aten.mm(%a, %wt)\n %y = aten.mm(%a, %vt)\n return %x, %y\n}"},
    {"matmul", "bf16", "graph @t(%c: $T[70], %a: $T[12,96], %b: $T[96,70]) {\n %d = aten.addmm(%c, %a, %b)\n return %d\n}"},
    // Few rows against a linear's weight, W read in place (emit_rowdot):
    // one row, K in one block, a relu after it; five rows, three K blocks
    // (f32; two for bf16), N = 100 (a partial block of W's rows), bias and
    // GELU (f32 takes both into the kernel); an odd bf16 row count over 32.
    {"matmul", "f32 bf16", "graph @t(%a: $T[1,512], %w: $T[200,512]) {\n %t = aten.permute(%w) {dims = [1, 0]}\n"
                           " %c = aten.mm(%a, %t)\n %r = aten.relu(%c)\n return %r\n}"},
    {"matmul", "f32 bf16", "graph @t(%c: $T[100], %a: $T[5,640], %w: $T[100,640]) {\n"
                           " %t = aten.permute(%w) {dims = [1, 0]}\n %d = aten.addmm(%c, %a, %t)\n"
                           " %g = aten.gelu(%d)\n return %g\n}"},
    {"matmul", "bf16", "graph @t(%a: $T[33,64], %w: $T[48,64]) {\n %t = aten.permute(%w) {dims = [1, 0]}\n"
                       " %c = aten.mm(%a, %t)\n return %c\n}"},
    // bf16 rows on AMX where the CPU has it (emit_amx_rowdot: W the tile
    // unit's A operand, A^T packed in pairs): 6 rows (one A^T tile), 20
    // (two tiles), 32, 70 (three chunks of 32, the last partial), 128;
    // with a bias, rounded after.
    {"matmul", "bf16", "graph @t(%a: $T[6,256], %w: $T[64,256], %c: $T[20,128], %v: $T[96,128], %b: $T[96]) {\n"
                       " %t = aten.permute(%w) {dims = [1, 0]}\n %x = aten.mm(%a, %t)\n"
                       " %u = aten.permute(%v) {dims = [1, 0]}\n %y = aten.addmm(%b, %c, %u)\n"
                       " return %x, %y\n}"},
    {"matmul", "bf16", "graph @t(%a: $T[32,128], %w: $T[96,128], %x: $T[70,64], %v: $T[64,64], %y: $T[128,64]) {\n"
                       " %t = aten.permute(%w) {dims = [1, 0]}\n %c = aten.mm(%a, %t)\n"
                       " %u = aten.permute(%v) {dims = [1, 0]}\n %d = aten.mm(%x, %u)\n %e = aten.mm(%y, %u)\n"
                       " return %c, %d, %e\n}"},
    // Few rows of other dtypes (f16, f64) keep the other forms.
    {"matmul", FLOATS, "graph @t(%a: $T[5,640], %w: $T[100,640]) {\n %t = aten.permute(%w) {dims = [1, 0]}\n"
                       " %c = aten.mm(%a, %t)\n return %c\n}"},
    // K not a whole number of steps: the last partial step masked
    // (K = 1000 after full steps; K = 8, no full step).
    {"matmul", "f32 bf16", "graph @t(%a: $T[3,1000], %w: $T[64,1000], %b: $T[20,8], %v: $T[1024,8]) {\n"
                           " %t = aten.permute(%w) {dims = [1, 0]}\n %c = aten.mm(%a, %t)\n"
                           " %u = aten.permute(%v) {dims = [1, 0]}\n %d = aten.mm(%b, %u)\n return %c, %d\n}"},
    // A permute of a permute is A itself: strided inputs (the second run
    // of every case) stay off AMX, which reads A's rows in place.
    {"matmul", "bf16", "graph @t(%a: $T[64,128], %b: $T[128,32]) {\n %t = aten.permute(%a) {dims = [1, 0]}\n"
                       " %u = aten.permute(%t) {dims = [1, 0]}\n %c = aten.mm(%u, %b)\n return %c\n}"},
    // An f32 linear whose W^T rows (N = 1024 floats) would be 4 KiB apart:
    // the transpose is written into rows of N + 16 and the matmul reads
    // the slice.
    {"matmul", "f32", "graph @t(%c: $T[1024], %a: $T[128,64], %w: $T[1024,64]) {\n %t = aten.permute(%w) {dims = [1, 0]}\n"
                      " %d = aten.addmm(%c, %a, %t)\n %g = aten.gelu(%d)\n return %g\n}"},
    // The f32 microkernel (AVX-512 CPUs; elsewhere the tiled matmul): two
    // K blocks (the second starting from C), 12 whole 8-row tiles and a
    // masked one of 4 rows, a last panel of 6 columns read from B in place
    // (masked) beside two packed ones; a linear layer (B = W^T, bias
    // first) whose last 18 columns are a transpose of W's last rows; N
    // under one panel (no packed B); row blocks x groups of panels.
    {"matmul", "f32", "graph @t(%a: $T[100,320], %b: $T[320,70]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    {"matmul", "f32", "graph @t(%c: $T[50], %a: $T[100,288], %w: $T[50,288]) {\n %t = aten.permute(%w) {dims = [1, 0]}\n"
                      " %d = aten.addmm(%c, %a, %t)\n %r = aten.relu(%d)\n return %r\n}"},
    {"matmul", "f32", "graph @t(%a: $T[512,128], %b: $T[128,20]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    {"matmul", "f32", "graph @t(%a: $T[600,96], %b: $T[96,256]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    // ... and addmms whose bias is added after it: beta and alpha, a [1, N]
    // and an [M, N] bias.
    {"matmul", "f32", "graph @t(%c: $T[96], %d: $T[1,96], %e: $T[128,96], %a: $T[128,256], %b: $T[256,96]) {\n"
                      " %x = aten.addmm(%c, %a, %b) {beta = 0.5, alpha = 2.0}\n"
                      " %y = aten.addmm(%d, %a, %b)\n %z = aten.addmm(%e, %a, %b)\n return %x, %y, %z\n}"},
    // Epilogues the f32 microkernel applies as it stores (the product's
    // only user, unary): GELU (erf and tanh forms) after three K blocks
    // (the last peeled off the loop), sigmoid, relu, abs, exp and erf
    // after two (an empty loop between the first and the peeled last), on
    // a masked last tile and a partial panel; not fused where the product
    // is also an output (tanh) or has two users (relu and neg).
    {"matmul", "f32", "graph @t(%c: $T[70], %a: $T[100,600], %w: $T[70,600], %b: $T[600,40]) {\n"
                      " %t = aten.permute(%w) {dims = [1, 0]}\n %d = aten.addmm(%c, %a, %t)\n"
                      " %g = aten.gelu(%d)\n %e = aten.mm(%a, %b)\n %h = aten.gelu(%e) {approximate = \"tanh\"}\n"
                      " return %g, %h\n}"},
    {"matmul", "f32", "graph @t(%a: $T[72,300], %b: $T[300,96], %c: $T[300,64]) {\n"
                      " %d = aten.mm(%a, %b)\n %s = aten.sigmoid(%d)\n %e = aten.mm(%a, %c)\n"
                      " %r = aten.relu(%e)\n %n = aten.neg(%e)\n %f = aten.mm(%a, %c)\n %t = aten.tanh(%f)\n"
                      " %g = aten.mm(%a, %b)\n %x = aten.abs(%g)\n %h = aten.mm(%a, %c)\n %y = aten.exp(%h)\n"
                      " %i = aten.mm(%a, %b)\n %z = aten.erf(%i)\n %j = aten.mm(%a, %c)\n %q = aten.relu(%j)\n"
                      " return %s, %r, %n, %t, %f, %x, %y, %z, %q\n}"},
    // ... through views: a linear on a 3-D input (mm, view, + bias,
    // relu), the bias [1, 1, N] as the add's first operand; refused: a
    // bias computed after the matmul, an add with alpha (then GELU).
    {"matmul", "f32", "graph @t(%a: $T[4,32,256], %w: $T[96,256], %c: $T[96], %d: $T[1,1,96]) {\n"
                      " %x = aten.view(%a) {shape = [128, 256]}\n %t = aten.permute(%w) {dims = [1, 0]}\n"
                      " %m = aten.mm(%x, %t)\n %v = aten.view(%m) {shape = [4, 32, 96]}\n"
                      " %y = aten.add(%v, %c)\n %r = aten.relu(%y)\n"
                      " %m2 = aten.mm(%x, %t)\n %v2 = aten.view(%m2) {shape = [4, 32, 96]}\n"
                      " %y2 = aten.add(%d, %v2)\n"
                      " %m3 = aten.mm(%x, %t)\n %c3 = aten.mul(%c, 2.0)\n %y3 = aten.add(%m3, %c3)\n"
                      " %m4 = aten.mm(%x, %t)\n %y4 = aten.add(%m4, %c) {alpha = 0.5}\n %g4 = aten.gelu(%y4)\n"
                      " return %r, %y2, %y3, %g4\n}"},
    // Weight gradients on the f32 microkernel (M·K·N from 2^24): A = X^T
    // packed into [M/8, K, 8] (M = 264) or, with M = 260 not a multiple of
    // the tile, read from X in place (a masked last tile); N = 1000 and
    // 1010 end in partial panels.
    {"matmul", "f32", "graph @t(%x: $T[64,264], %g: $T[64,1000], %y: $T[64,260], %h: $T[64,1010]) {\n"
                      " %xt = aten.permute(%x) {dims = [1, 0]}\n %a = aten.mm(%xt, %g)\n"
                      " %yt = aten.permute(%y) {dims = [1, 0]}\n %b = aten.mm(%yt, %h)\n return %a, %b\n}"},
    // AMX (where the CPU has it): 32x32 tiles over K in steps of 32, rows
    // past the last whole tile (8 of 136) on the vector microkernel, a
    // ragged last panel (N = 40); the f32 accumulator of an addmm with a
    // transposed weight (blocks of 32 rows); K = 48 stays off AMX.
    {"matmul", "bf16", "graph @t(%a: $T[136,64], %b: $T[64,40]) {\n %c = aten.mm(%a, %b)\n return %c\n}"},
    {"matmul", "bf16", "graph @t(%c: $T[64], %a: $T[128,96], %w: $T[64,96]) {\n %t = aten.permute(%w) {dims = [1, 0]}\n"
                       " %d = aten.addmm(%c, %a, %t)\n %g = aten.gelu(%d)\n return %g\n}"},
    {"conv", FLOATS, "graph @t(%x: $T[2,4,9,9], %w: $T[6,4,3,3], %b: $T[6]) {\n"
                     " %y = aten.convolution(%x, %w, %b) {stride = [2, 2], padding = [1, 1], dilation = [1, 1], groups = 1}\n return %y\n}"},
    {"conv", "f32 f64", "graph @t(%x: $T[2,4,9,8], %w: $T[6,2,3,2]) {\n"
                        " %y = aten.convolution(%x, %w, none) {stride = [1, 2], padding = [2, 0], dilation = [2, 1], groups = 2}\n return %y\n}"},
    // Stride 1: the flattened-input form (wide output grid, extra zero row
    // and columns), with padding, dilation, groups and a 1x1 kernel.
    {"conv", FLOATS, "graph @t(%x: $T[2,4,7,9], %w: $T[6,4,3,3], %b: $T[6]) {\n"
                     " %y = aten.convolution(%x, %w, %b) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1}\n return %y\n}"},
    {"conv", "f32 f64", "graph @t(%x: $T[3,6,10,11], %w: $T[9,2,3,2]) {\n"
                        " %y = aten.convolution(%x, %w, none) {stride = [1, 1], padding = [2, 1], dilation = [2, 3], groups = 3}\n return %y\n}"},
    // Full 8x32 register tiles over two rows of filters and seven column
    // tiles (14 x 16 wide grid), accumulated across 16 channels x 9 taps;
    // the [2,4,7,9] case above has 16-wide ones (P = 7 x 16 = 112).
    {"conv", FLOATS, "graph @t(%x: $T[1,16,14,14], %w: $T[16,16,3,3]) {\n"
                     " %y = aten.convolution(%x, %w, none) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1}\n return %y\n}"},
    // The f32 microkernel's direct form (AVX-512, one group, filters a
    // multiple of 8): dilation (2, 3) with padding, positions split over
    // threads (one image), a last block of positions under 32, a bias; and
    // a 5x5 kernel over 3 images.
    {"conv", "f32", "graph @t(%x: $T[1,8,13,17], %w: $T[16,8,3,3], %b: $T[16]) {\n"
                    " %y = aten.convolution(%x, %w, %b) {stride = [1, 1], padding = [2, 1], dilation = [2, 3], groups = 1}\n return %y\n}"},
    {"conv", "f32", "graph @t(%x: $T[3,5,11,9], %w: $T[8,5,5,5]) {\n"
                    " %y = aten.convolution(%x, %w, none) {stride = [1, 1], padding = [2, 2], dilation = [1, 1], groups = 1}\n return %y\n}"},
    {"conv", "f32 bf16", "graph @t(%x: $T[2,16,5,5], %w: $T[8,16,1,1]) {\n"
                         " %y = aten.convolution(%x, %w, none) {stride = [1, 1], padding = [0, 0], dilation = [1, 1], groups = 1}\n return %y\n}"},
    // Strided convolutions with 8 or more filters per group as stride-1
    // convolutions over the phases of the padded input (emit_conv_phases):
    // 3x3 stride 2 with odd sizes and a bias; 1x1 stride 2 (one phase);
    // a 7x7 stride-2 stem; strides (2, 1) and 3; two groups; and a
    // stride-2 layer feeding relu and a stride-1 one (its wide grid as the
    // next padded input).
    {"conv", "f32 f64", "graph @t(%x: $T[2,8,13,11], %w: $T[16,8,3,3], %b: $T[16]) {\n"
                        " %y = aten.convolution(%x, %w, %b) {stride = [2, 2], padding = [1, 1], dilation = [1, 1], groups = 1}\n return %y\n}"},
    {"conv", "f32", "graph @t(%x: $T[1,8,12,12], %w: $T[8,8,1,1], %v: $T[2,4,15,15], %u: $T[8,4,7,7]) {\n"
                    " %y = aten.convolution(%x, %w, none) {stride = [2, 2], padding = [0, 0], dilation = [1, 1], groups = 1}\n"
                    " %z = aten.convolution(%v, %u, none) {stride = [2, 2], padding = [3, 3], dilation = [1, 1], groups = 1}\n"
                    " return %y, %z\n}"},
    {"conv", "f32", "graph @t(%x: $T[1,8,10,9], %w: $T[8,8,3,3], %v: $T[2,16,14,13], %u: $T[16,8,3,2]) {\n"
                    " %y = aten.convolution(%x, %w, none) {stride = [2, 1], padding = [1, 1], dilation = [1, 1], groups = 1}\n"
                    " %z = aten.convolution(%v, %u, none) {stride = [3, 3], padding = [0, 1], dilation = [1, 1], groups = 2}\n"
                    " return %y, %z\n}"},
    {"conv", "f32", "graph @t(%x: $T[2,8,12,12], %w: $T[16,8,3,3], %w2: $T[16,16,3,3]) {\n"
                    " %c = aten.convolution(%x, %w, none) {stride = [2, 2], padding = [1, 1], dilation = [1, 1], groups = 1}\n"
                    " %r = aten.relu(%c)\n"
                    " %y = aten.convolution(%r, %w2, none) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1}\n"
                    " return %y\n}"},
    // A stride-1 convolution whose input is elementwise ops over another
    // one's output (lowering/ops/matmul.c, emit_prepadded): the ops run on
    // the first convolution's wide grid (bias included) and write the
    // second one's zero-padded input directly. Batch norm + relu with
    // per-channel operands of ranks 3 and 4 and a scalar; one image in channel
    // blocks; the first result also read elsewhere (returned); a second
    // convolution with other padding (Wp differs: the plain pad).
    {"conv", "f32", "graph @t(%x: $T[2,8,9,13], %w: $T[8,8,3,3], %b: $T[8], %m: $T[8,1,1], %s: $T[1,8,1,1], %v: $T[8,1,1], %w2: $T[6,8,3,3]) {\n"
                    " %c = aten.convolution(%x, %w, %b) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1}\n"
                    " %d = aten.sub(%c, %m)\n %e = aten.mul(%d, %s)\n %f = aten.add(%e, %v)\n %g = aten.mul(%f, 0.5)\n %r = aten.relu(%g)\n"
                    " %y = aten.convolution(%r, %w2, none) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1}\n"
                    " %z = aten.convolution(%r, %w2, none) {stride = [1, 1], padding = [2, 2], dilation = [2, 2], groups = 1}\n"
                    " return %y, %z\n}"},
    {"conv", "f32", "graph @t(%x: $T[1,16,14,14], %w: $T[16,16,3,3], %w2: $T[16,16,3,3]) {\n"
                    " %c = aten.convolution(%x, %w, none) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1}\n"
                    " %r = aten.relu(%c)\n"
                    " %y = aten.convolution(%r, %w2, none) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1}\n"
                    " return %c, %y\n}"},
    // Multi-output fusion (kernels/cpu_vectorize.c): an Adam-like step,
    // whose moment updates are computed inside the parameter update's
    // thread tiles and still returned; a producer read by an op before its
    // consumer (not fused); a producer with two consumers (fused into the
    // first, which yields it to the second).
    {"fusion", FLOATS, "graph @t(%g: $T[256,512], %m: $T[256,512], %v: $T[256,512], %p: $T[256,512]) {\n"
                       " %a = aten.mul(%m, 0.9)\n %b = aten.mul(%g, 0.1)\n %m1 = aten.add(%a, %b)\n"
                       " %g2 = aten.mul(%g, %g)\n %c = aten.mul(%v, 0.999)\n %d = aten.mul(%g2, 0.001)\n"
                       " %v1 = aten.add(%c, %d)\n %s = aten.sqrt(%v1)\n %e = aten.add(%s, 1e-3)\n"
                       " %u = aten.div(%m1, %e)\n %p1 = aten.sub(%p, %u)\n return %m1, %v1, %p1\n}"},
    {"fusion", "f32 bf16", "graph @t(%x: $T[256,512]) {\n %m = aten.mul(%x, 2.0)\n"
                           " %r = aten.sum(%m) {dims = [1]}\n %y = aten.add(%m, %x)\n return %r, %y\n}"},
    {"fusion", "f32 bf16", "graph @t(%x: $T[256,512], %z: $T[256,512]) {\n %m = aten.mul(%x, 2.0)\n"
                           " %y1 = aten.add(%m, %z)\n %y2 = aten.sub(%m, %z)\n %w = aten.mul(%y2, %y2)\n"
                           " return %y1, %w\n}"},
    // Epilogue fusion: a matmul inside its elementwise consumer's register
    // tiles (relu; addmm's bias init then GELU; a batched matmul scaled).
    {"fusion", FLOATS, "graph @t(%a: $T[64,96], %b: $T[96,128]) {\n %c = aten.mm(%a, %b)\n"
                       " %r = aten.relu(%c)\n return %r\n}"},
    {"fusion", "f32 bf16", "graph @t(%c: $T[128], %a: $T[64,96], %b: $T[96,128]) {\n"
                           " %d = aten.addmm(%c, %a, %b)\n %g = aten.gelu(%d)\n return %g\n}"},
    {"fusion", "f32", "graph @t(%a: $T[4,32,64], %b: $T[4,64,96]) {\n %c = aten.bmm(%a, %b)\n"
                      " %s = aten.mul(%c, 0.125)\n return %s\n}"},
    // Data movement.
    {"shape", ALL, "graph @t(%x: $T[3,4,5]) {\n %a = aten.permute(%x) {dims = [2, 0, 1]}\n %b = aten.transpose(%x) {dim0 = 0, dim1 = -1}\n"
                   " %c = aten.view(%x) {shape = [12, -1]}\n %d = aten.reshape(%x) {shape = [5, 2, 6]}\n return %a, %b, %c, %d\n}"},
    // Chains of permutes compose (and cancel).
    {"shape", "f32 i64 bool", "graph @t(%x: $T[3,4,5]) {\n %a = aten.permute(%x) {dims = [2, 0, 1]}\n"
                              " %b = aten.permute(%a) {dims = [1, 2, 0]}\n %c = aten.transpose(%a) {dim0 = 0, dim1 = 2}\n"
                              " %d = aten.add(%b, %x)\n return %b, %c, %d\n}"},
    {"shape", ALL, "graph @t(%x: $T[3,1], %y: $T[4]) {\n %a = aten.expand(%x) {shape = [3, 4]}\n %b = aten.expand(%y) {shape = [2, 3, -1]}\n"
                   " %c = aten.squeeze(%x) {dims = [1]}\n %d = aten.unsqueeze(%y) {dim = -1}\n %e = aten.squeeze(%x)\n return %a, %b, %c, %d, %e\n}"},
    {"shape", ALL, "graph @t(%x: $T[6,10]) {\n %a = aten.slice(%x) {dim = 1, start = 1, end = 9, step = 3}\n"
                   " %b = aten.slice(%x) {dim = 0, start = -4}\n return %a, %b\n}"},
    {"shape", ALL, "graph @t(%x: $T[3,4], %y: $T[3,2]) {\n %a = aten.cat(%x, %y) {dim = 1}\n %b = aten.cat(%x, %x, %x) {dim = 0}\n return %a, %b\n}"},
    {"shape", "f16", "graph @t(%x: $T[3,4], %y: f32[3,2]) {\n %a = aten.cat(%x, %y) {dim = -1}\n return %a\n}"},
    // Pieces over one 16K-element slab: inserted by a forall over slabs
    // (chunks of the last dim's planes; of dim 0 when it is the cat dim).
    {"shape", "f32 f16 i32", "graph @t(%x: $T[2,40,300], %y: $T[2,40,100], %z: $T[3,6000]) {\n %a = aten.cat(%x, %y) {dim = 2}\n %b = aten.cat(%z, %z) {dim = 0}\n %c = aten.cat(%z, %z) {dim = 1}\n return %a, %b, %c\n}"},
    {"create", ALL, "graph @t(%x: $T[2,3]) {\n %a = aten.full() {shape = [2, 3], value = 1.5, dtype = $T}\n %b = aten.add(%x, %a)\n"
                    " %c = kiln.constant() {value = [1, 0, -2, 3, 0.5, 7]} : $T[2,3]\n %d = aten.mul(%x, %c)\n return %b, %d\n}"},
    // Composites.
    {"softmax", FLOATS, "graph @t(%x: $T[4,33]) {\n %a = aten._softmax(%x) {dim = -1}\n %b = aten._softmax(%x) {dim = 0}\n"
                        " %c = aten._log_softmax(%x) {dim = 1}\n return %a, %b, %c\n}"},
    // Short f32 rows (C a multiple of 16, up to 1024) in one pass
    // (lowering/ops/nn.c): two rows per step (48 rows) or one (15 rows);
    // a positive scale read with the rows where the softmax is its only
    // user, not where the scaled tensor has another; masked (-inf) entries,
    // a row of -inf and a row with a NaN (NaN rows, as in PyTorch).
    {"softmax", "f32", "graph @t(%x: $T[6,8,48], %y: $T[3,5,32]) {\n"
                       " %a = aten._softmax(%x) {dim = -1}\n %b = aten._log_softmax(%x) {dim = 2}\n"
                       " %s = aten.mul(%x, 0.125)\n %c = aten._softmax(%s) {dim = -1}\n"
                       " %u = aten.mul(%y, 3.0)\n %d = aten._softmax(%u) {dim = -1}\n"
                       " %f = aten._log_softmax(%y) {dim = -1}\n return %a, %b, %c, %d, %f, %u\n}"},
    // The longest one-pass rows (1024 floats: 64 vectors a row, written
    // by one vector<64x16xf32>), paired and single.
    {"softmax", "f32", "graph @t(%x: $T[6,1024], %y: $T[5,1024]) {\n"
                       " %a = aten._softmax(%x) {dim = -1}\n %b = aten._log_softmax(%y) {dim = 1}\n"
                       " return %a, %b\n}"},
    {"softmax", "f32", "graph @t(%x: $T[3]) {\n"
                       " %c = kiln.constant() {value = [1.5, -2.0, 88.0, -100.0, 0.25, 3.0, -0.5, 7.0, 80.0, -3.0, 0.0, 1.0, 2.0, -88.0, 5.0, 0.5, -inf, 1.0, -inf, 2.0, 0.5, -inf, -inf, 3.0, 0.0, -inf, 1.0, -inf, -1.0, -inf, 2.5, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, 1.0, 2.0, nan, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 1.0, 2.0, 3.0]} : $T[4,16]\n"
                       " %a = aten._softmax(%c) {dim = -1}\n %b = aten._log_softmax(%c) {dim = 1}\n"
                       " %y = aten.neg(%x)\n return %a, %b, %y\n}"},
    // ... across vectors (C = 48): a NaN in the third vector, a row of
    // -inf, -inf in the first two vectors only, large values.
    {"softmax", "f32", "graph @t(%x: $T[3]) {\n"
                       " %c = kiln.constant() {value = [-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, -3.0, -2.0, nan, 0.0, 1.0, 2.0, 3.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.5, 1.0, -100.0, 2.0, 2.5, 3.0, 3.5, 4.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 0.0, 0.5, 1.0, 1.5, 80.0, 2.5, 3.0, 3.5, 4.0, 0.0, 0.5, 1.0]} : $T[4,48]\n"
                       " %a = aten._softmax(%c) {dim = -1}\n %b = aten._log_softmax(%c) {dim = 1}\n"
                       " %y = aten.neg(%x)\n return %a, %b, %y\n}"},
    // Above 8 MB softmax runs in blocks of rows (lowering/ops/nn.c).
    {"softmax", "f32 bf16", "graph @t(%x: $T[2,260,4100]) {\n %a = aten._softmax(%x) {dim = -1}\n"
                            " %b = aten._log_softmax(%x) {dim = 2}\n return %a, %b\n}"},
    {"softmax", "f16 bf16", "graph @t(%x: $T[4,33]) {\n %a = aten._softmax(%x) {dim = -1, half_to_float = true}\n return %a\n}"},
    {"layer_norm", FLOATS, "graph @t(%x: $T[3,5,16], %w: $T[16], %b: $T[16]) {\n"
                           " %y, %m, %r = aten.native_layer_norm(%x, %w, %b) {normalized_shape = [16], eps = 1e-5}\n return %y, %m, %r\n}"},
    // Short f32 rows (16-1024 floats, a multiple of 16) in one pass
    // (lowering/ops/nn.c, emit_layer_norm_rows): rows of 1024 (64 vectors),
    // a weight without a bias, no affine parameters, an odd row count; a
    // constant row (variance 0) and a row far from zero.
    {"layer_norm", "f32", "graph @t(%x: $T[6,1024], %w: $T[1024], %b: $T[1024], %y: $T[5,3,48], %v: $T[48], %z: $T[7,32]) {\n"
                          " %a, %m, %r = aten.native_layer_norm(%x, %w, %b) {normalized_shape = [1024], eps = 1e-5}\n"
                          " %c, %n, %s = aten.native_layer_norm(%y, %v, none) {normalized_shape = [48], eps = 1e-3}\n"
                          " %d, %o, %t = aten.native_layer_norm(%z, none, none) {normalized_shape = [32], eps = 1e-5}\n"
                          " return %a, %m, %r, %c, %n, %s, %d, %o, %t\n}"},
    // eps of whole numbers (0 and 1: constants printed by their bits).
    {"layer_norm", "f32", "graph @t(%x: $T[4,32]) {\n"
                          " %a, %m, %r = aten.native_layer_norm(%x, none, none) {normalized_shape = [32], eps = 0.0}\n"
                          " %b, %n, %s = aten.native_layer_norm(%x, none, none) {normalized_shape = [32], eps = 1.0}\n"
                          " return %a, %m, %r, %b, %n, %s\n}"},
    {"layer_norm", "f32", "graph @t(%x: $T[3]) {\n"
                          " %c = kiln.constant() {value = [2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 1000.0, 1001.0, 1002.0, 1003.0, 1004.0, 1005.0, 1006.0, 1007.0, 1008.0, 1009.0, 1010.0, 1011.0, 1012.0, 1013.0, 1014.0, 1015.0]} : $T[2,16]\n"
                          " %a, %m, %r = aten.native_layer_norm(%c, none, none) {normalized_shape = [16], eps = 1e-5}\n"
                          " %y = aten.neg(%x)\n return %a, %m, %r, %y\n}"},
    {"layer_norm", "f32 f64", "graph @t(%x: $T[3,5,16]) {\n"
                              " %y, %m, %r = aten.native_layer_norm(%x, none, none) {normalized_shape = [5, 16], eps = 1e-3}\n return %y, %m, %r\n}"},
    // Above 8 MB layer norm runs in blocks of rows (lowering/ops/nn.c):
    // 520 rows in blocks of 8, with and without weight and bias.
    {"layer_norm", "f32 bf16", "graph @t(%x: $T[2,260,4100], %w: $T[4100], %b: $T[4100]) {\n"
                               " %y, %m, %r = aten.native_layer_norm(%x, %w, %b) {normalized_shape = [4100], eps = 1e-5}\n"
                               " %z, %n, %s = aten.native_layer_norm(%x, none, none) {normalized_shape = [4100], eps = 1e-5}\n"
                               " return %y, %m, %r, %z, %n, %s\n}"},
    // Layer norm backward: flat (small, two normalized dims), and from 1 MB
    // in blocks of rows with partial weight and bias gradients per block
    // (260 rows in blocks of 4).
    {"layer_norm", FLOATS, "graph @t(%dy: $T[3,5,16], %x: $T[3,5,16], %m: $T[3,5,1], %r: $T[3,5,1], %w: $T[16]) {\n"
                           " %a, %b, %c = aten.native_layer_norm_backward(%dy, %x, %m, %r, %w) {normalized_shape = [16]}\n"
                           " return %a, %b, %c\n}"},
    {"layer_norm", "f32 f64", "graph @t(%dy: $T[3,5,8], %x: $T[3,5,8], %m: $T[3,1,1], %r: $T[3,1,1], %w: $T[5,8]) {\n"
                              " %a, %b, %c = aten.native_layer_norm_backward(%dy, %x, %m, %r, %w) {normalized_shape = [5, 8]}\n"
                              " return %a, %b, %c\n}"},
    {"layer_norm", "f32 bf16", "graph @t(%dy: $T[5,52,1024], %x: $T[5,52,1024], %m: $T[5,52,1], %r: $T[5,52,1], %w: $T[1024]) {\n"
                               " %a, %b, %c = aten.native_layer_norm_backward(%dy, %x, %m, %r, %w) {normalized_shape = [1024]}\n"
                               " return %a, %b, %c\n}"},
    {"embedding", "f32 bf16 f64 i64", "graph @t(%w: $T[10,4], %i: i64[3,5]) {\n %y = aten.embedding(%w, %i)\n return %y\n}"},
    {"embedding", "f32", "graph @t(%w: $T[10,4], %i: i32[7]) {\n %y = aten.embedding(%w, %i)\n return %y\n}"},
    // Index tensors on adjacent dims (aten.index), indices in [-5, 5]:
    // negative ones wrap, 5 on a dim of 5 is clamped (PyTorch raises).
    // The second index broadcasts against the first (a nearest upsampling's
    // [H', 1] and [W'] form); x computed in the graph is gathered vectorized
    // (kernels/cpu_vectorize.c, gather_source_dense), except where it is
    // also inserted into a cat (it may then live in the cat's buffer).
    {"index", "f32 bf16 f64 i64", "graph @t(%x: $T[3,4,5,6], %ih: i64[7,1], %iw: i64[5]) {\n"
                                  " %y = aten.index(%x, %ih, %iw) {dim = 2}\n return %y\n}"},
    {"index", "f32 i32", "graph @t(%x: $T[6], %i: i32[3,5]) {\n %y = aten.index(%x, %i) {dim = 0}\n return %y\n}"},
    {"index", "f32", "graph @t(%x: $T[4,5,3], %i: i64[2,1,3]) {\n %y = aten.index(%x, %i) {dim = 1}\n return %y\n}"},
    // max_pool2d: padded (-inf) or not, strides, dilation, a kernel wider
    // than high, the default stride (the kernel), a 1x1 window.
    {"max_pool2d", FLOATS, "graph @t(%x: $T[2,3,13,11]) {\n"
                           " %y = aten.max_pool2d(%x) {kernel_size = [3, 3], stride = [2, 2], padding = [1, 1]}\n return %y\n}"},
    {"max_pool2d", "f32 f64", "graph @t(%x: $T[1,4,9,10]) {\n"
                              " %y = aten.max_pool2d(%x) {kernel_size = [2, 3], stride = [1, 2], padding = [1, 0], dilation = [2, 1]}\n"
                              " %z = aten.max_pool2d(%x) {kernel_size = [2, 2]}\n"
                              " %w = aten.max_pool2d(%x) {kernel_size = [1, 1], stride = [2, 3]}\n return %y, %z, %w\n}"},
    {"index", "f32 bf16", "graph @t(%x0: $T[4,16,20,20], %ih: i64[40,1], %iw: i64[40]) {\n"
                          " %x = aten.mul(%x0, 2.0)\n %y = aten.index(%x, %ih, %iw) {dim = 2}\n"
                          " return %y\n}"},
    {"index", "f32", "graph @t(%x0: $T[4,16,20], %i: i64[30]) {\n"
                     " %x = aten.mul(%x0, 2.0)\n %c = aten.cat(%x, %x0) {dim = 0}\n"
                     " %y = aten.index(%x, %i) {dim = 2}\n return %c, %y\n}"},
    // Embedding gradients: indices in [-5, 5] over 4 rows wrap (negative)
    // or add nothing (out of range); repeated rows accumulate.
    {"index_put", "f32", "graph @t(%b: $T[4,6], %i: i64[3,5], %v: $T[3,5,6]) {\n %y = aten.index_put(%b, %i, %v) {accumulate = true}\n return %y\n}"},
    {"index_put", "f32", "graph @t(%b: $T[8,3], %i: i32[40], %v: $T[40,3]) {\n %y = aten.index_put(%b, %i, %v) {accumulate = true}\n return %y\n}"},
};

// Replaces every $T with `dt`.
static void subst(const char *text, const char *dt, char *out, size_t n) {
  size_t o = 0;
  for (const char *p = text; *p && o + 8 < n; ++p) {
    if (p[0] == '$' && p[1] == 'T') {
      o += (size_t)snprintf(out + o, n - o, "%s", dt);
      p++;
    } else {
      out[o++] = *p;
    }
  }
  out[o] = 0;
}

#define MAXT 16

// Compiles and runs one case in one layout; returns the number of failures.
static int run_case(kiln_context_t *ctx, const char *text, const char *dt,
                    bool strided, double error_scale, uint64_t *seed) {
  kiln_graph_t *g = NULL;
  kiln_function_t *fn = NULL;
  int fails = 0;
  kiln_status_t s = kiln_graph_parse(ctx, text, strlen(text), "case", &g);
  if (!s) s = kiln_function_compile(ctx, g, NULL, &fn);
  if (s) {
    fprintf(stderr, "FAIL [%s] compile: %s\n%s\n", dt, kiln_status_message(s), text);
    kiln_status_free(s);
    kiln_graph_destroy(g);
    return 1;
  }
  size_t nin = kiln_graph_input_count(g), nout = kiln_graph_output_count(g);
  kt_tensor_t in[MAXT], got[MAXT], want[MAXT];
  DLTensor in_dl[MAXT], got_dl[MAXT], want_dl[MAXT];
  for (size_t i = 0; i < nin; ++i) {
    kiln_tensor_type_t t;
    kiln_graph_input_type(g, i, &t);
    kt_alloc(&in[i], &t, strided);
    kt_fill_random(&in[i], seed);
    in_dl[i] = in[i].dl;
  }
  kiln_tensor_type_t ot[MAXT];
  for (size_t i = 0; i < nout; ++i) kiln_graph_output_type(g, i, &ot[i]);
  if (!kt_alloc_outputs(ot, nout, got, want, got_dl, want_dl)) {
    fprintf(stderr, "FAIL [%s] out of memory for the outputs\n", dt);
    kt_free_n(in, nin);
    kiln_function_release(fn);
    kiln_graph_destroy(g);
    return 1;
  }
  s = kiln_function_call(fn, in_dl, nin, got_dl, nout);
  if (!s) s = kiln_graph_interpret(g, in_dl, nin, want_dl, nout);
  if (s) {
    fprintf(stderr, "FAIL [%s%s] run: %s\n%s\n", dt, strided ? ", strided" : "",
            kiln_status_message(s), text);
    kiln_status_free(s);
    fails++;
  } else {
    for (size_t i = 0; i < nout; ++i) {
      kt_compare_t c;
      // kt_compare scales atol by max(1, max |want|); the case's
      // error_scale replaces that magnitude where it is larger.
      kt_tolerance_t tol = kt_tolerance_for(got[i].dl.dtype);
      double magnitude = 1;
      for (int64_t k = 0; k < kt_numel(&want[i]); ++k) {
        double w = fabs(kt_get(&want[i], k));
        if (isfinite(w) && w > magnitude) magnitude = w;
      }
      if (error_scale > magnitude) tol.atol *= error_scale / magnitude;
      if (!kt_compare(&got[i], &want[i], tol, &c)) {
        fprintf(stderr,
                "FAIL [%s%s] output %zu: %lld mismatches, first at %lld: kiln "
                "%.9g vs reference %.9g (max abs err %.3g)\n%s\n",
                dt, strided ? ", strided" : "", i, (long long)c.mismatches,
                (long long)c.first_bad, kt_get(&got[i], c.first_bad),
                kt_get(&want[i], c.first_bad), c.max_abs_err, text);
        fails++;
      }
    }
  }
  kt_free_n(in, nin);
  kt_free_n(got, nout);
  kt_free_n(want, nout);
  kiln_function_release(fn);
  kiln_graph_destroy(g);
  return fails;
}

int main(int argc, char **argv) {
  const char *family = NULL;
  uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], "--seed=", 7) == 0) seed = strtoull(argv[i] + 7, NULL, 0);
    else family = argv[i];
  }
  printf("ops_numeric: seed %llu (rerun with --seed=%llu)\n",
         (unsigned long long)seed, (unsigned long long)seed);
  kiln_context_t *ctx = NULL;
  CHECK_OK(kiln_context_create(NULL, &ctx));
  if (!ctx) return 1;
  int runs = 0;
  for (size_t c = 0; c < sizeof(kCases) / sizeof(kCases[0]); ++c) {
    if (family && strcmp(family, kCases[c].family) != 0) continue;
    char dts[64];
    snprintf(dts, sizeof(dts), "%s", kCases[c].dtypes);
    for (char *dt = strtok(dts, " "); dt; dt = strtok(NULL, " ")) {
      char text[4096];
      subst(kCases[c].text, dt, text, sizeof(text));
      for (int strided = 0; strided < 2; ++strided) {
        kt_failures += run_case(ctx, text, dt, strided, kCases[c].error_scale, &seed);
        runs++;
      }
    }
  }
  kiln_context_destroy(ctx);
  CHECK(runs > 0);
  printf("ops_numeric %s: %d runs\n", family ? family : "all", runs);
  return kt_finish("ops_numeric");
}
