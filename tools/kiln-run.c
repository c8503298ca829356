// kiln-run: compiles a graph, runs it on random inputs (or raw binary files),
// compares every output with the reference interpreter, and prints the max
// error and the times.
//   kiln-run [--iters=N] [--seed=S] [--dim NAME=SIZE]... [--input=FILE]...
//            [--no-vectorize] [--strided] FILE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "tensor_util.h"

#define MAX_TENSORS 2048  // (a whole MobileNetV2 partition has 268 inputs)

static int fail(const char *what, kiln_status_t s) {
  fprintf(stderr, "kiln-run: %s: %s: %s\n", what,
          kiln_status_code_name(kiln_status_code(s)), kiln_status_message(s));
  kiln_status_free(s);
  return 1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

// Compares kiln's tensor with the reference interpreter's and prints one
// line (MISMATCH and the first differing element when they differ).
static bool report(const char *what, size_t i, const char *note, kt_tensor_t *got,
                   kt_tensor_t *want, DLDataType dtype) {
  kt_compare_t c;
  bool ok = kt_compare(got, want, kt_tolerance_for(dtype), &c);
  printf("%s %zu%s: max abs err %.3g, max rel err %.3g%s\n", what, i, note,
         c.max_abs_err, c.max_rel_err, ok ? "" : "  MISMATCH");
  if (!ok)
    printf("  %lld elements differ; first at %lld: kiln %.9g, reference %.9g\n",
           (long long)c.mismatches, (long long)c.first_bad, kt_get(got, c.first_bad),
           kt_get(want, c.first_bad));
  return ok;
}

int main(int argc, char **argv) {
  const char *path = NULL;
  int iters = 20;
  uint64_t seed = 0x5eed;
  bool strided = false;
  const char *dim_names[16];
  int64_t dim_values[16];
  int ndims = 0;
  const char *input_files[MAX_TENSORS];
  int ninput_files = 0;
  kiln_compile_options_t opts;
  kiln_compile_options_init(&opts);
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    if (strncmp(a, "--iters=", 8) == 0) iters = atoi(a + 8);
    else if (strncmp(a, "--seed=", 7) == 0) seed = strtoull(a + 7, NULL, 0);
    else if (strcmp(a, "--strided") == 0) strided = true;
    else if (strcmp(a, "--no-vectorize") == 0) opts.vectorize = 0;
    else if (strcmp(a, "--autotune") == 0) opts.autotune = KILN_AUTOTUNE_MEASURE;
    else if (strncmp(a, "--autotune-budget=", 18) == 0) {
      opts.autotune = KILN_AUTOTUNE_MEASURE;
      opts.autotune_budget_seconds = atof(a + 18);
    } else if (strncmp(a, "--threads=", 10) == 0) opts.num_threads = atoi(a + 10);
    else if (strncmp(a, "--dynamic=", 10) == 0) {
      const char *p = a + 10;
      if (strcmp(p, "auto") == 0) opts.dynamic = KILN_DYNAMIC_AUTO;
      else if (strcmp(p, "always") == 0) opts.dynamic = KILN_DYNAMIC_ALWAYS;
      else if (strcmp(p, "never") == 0) opts.dynamic = KILN_DYNAMIC_NEVER;
      else {
        fprintf(stderr, "kiln-run: --dynamic expects auto, always or never, not '%s'\n", p);
        return 2;
      }
    }
    else if (strncmp(a, "--input=", 8) == 0 && ninput_files < MAX_TENSORS)
      input_files[ninput_files++] = a + 8;
    else if (strcmp(a, "--dim") == 0 && i + 1 < argc && ndims < 16) {
      char *eq = strchr(argv[++i], '=');
      if (!eq) {
        fprintf(stderr, "kiln-run: --dim expects NAME=SIZE\n");
        return 2;
      }
      *eq = 0;
      dim_names[ndims] = argv[i];
      dim_values[ndims++] = strtoll(eq + 1, NULL, 10);
    } else if (strcmp(a, "--help") == 0) {
      printf("usage: kiln-run [--iters=N] [--seed=S] [--dim NAME=SIZE]... "
             "[--input=FILE]... [--strided] [--no-vectorize] [--threads=N]\n"
             "                [--autotune] [--autotune-budget=SECONDS]\n"
             "                [--dynamic=auto|always|never] FILE\n"
             "  --dynamic: policy for symbolic sizes (always: one kernel for\n"
             "  every binding, as torch.compile(dynamic=True) graphs get)\n"
             "  --autotune: measured tile-size search (max-autotune), results\n"
             "  kept in the tuning database\n");
      return 0;
    } else if (a[0] == '-') {
      fprintf(stderr, "kiln-run: unknown option '%s' (try --help)\n", a);
      return 2;
    } else path = a;
  }
  if (!path) {
    fprintf(stderr, "kiln-run: no graph file (try --help)\n");
    return 2;
  }
  if (iters < 1) iters = 1;
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "kiln-run: cannot open '%s'\n", path);
    return 1;
  }
  static char text[1 << 20];
  size_t len = fread(text, 1, sizeof(text) - 1, f);
  fclose(f);

  kiln_context_t *ctx = NULL;
  kiln_graph_t *g = NULL;
  kiln_function_t *fn = NULL;
  kiln_status_t s = kiln_context_create(NULL, &ctx);
  if (s) return fail("context", s);
  s = kiln_graph_parse(ctx, text, len, path, &g);
  if (s) return fail("parse", s);

  size_t nin = kiln_graph_input_count(g), nout = kiln_graph_output_count(g);
  if (nin > MAX_TENSORS || nout > MAX_TENSORS) {
    fprintf(stderr, "kiln-run: too many tensors\n");
    return 1;
  }
  if (ninput_files && (size_t)ninput_files != nin) {
    fprintf(stderr, "kiln-run: %d --input files for %zu graph inputs\n",
            ninput_files, nin);
    return 2;
  }
  // Input types: symbolic dims take their sizes from --dim NAME=SIZE.
  static kt_tensor_t in[MAX_TENSORS], got[MAX_TENSORS], want[MAX_TENSORS];
  DLTensor in_dl[MAX_TENSORS], got_dl[MAX_TENSORS], want_dl[MAX_TENSORS];
  for (size_t i = 0; i < nin; ++i) {
    kiln_tensor_type_t t;
    kiln_graph_input_type(g, i, &t);
    for (int k = 0; k < t.rank; ++k) {
      const char *sym = kiln_graph_input_dim_symbol(g, i, k);
      if (!sym) continue;
      // A size is a symbol or a product ("128*s0"): each name from --dim.
      int64_t size = 1;
      for (const char *p = sym; *p;) {
        size_t n = strcspn(p, "*");
        if (p[0] >= '0' && p[0] <= '9') {
          size *= strtoll(p, NULL, 10);
        } else {
          int d = 0;
          while (d < ndims && (strlen(dim_names[d]) != n ||
                               strncmp(dim_names[d], p, n) != 0))
            d++;
          if (d == ndims) {
            fprintf(stderr, "kiln-run: input %zu has symbolic size '%s'; give "
                            "%.*s with --dim %.*s=SIZE\n",
                    i, sym, (int)n, p, (int)n, p);
            return 2;
          }
          size *= dim_values[d];
        }
        p += n + (p[n] == '*');
      }
      t.shape[k] = size;
    }
    if (!kt_alloc(&in[i], &t, strided && !ninput_files)) {
      fprintf(stderr, "kiln-run: out of memory\n");
      return 1;
    }
    if (ninput_files) {
      FILE *inf = fopen(input_files[i], "rb");
      if (!inf || fread(in[i].base, 1, in[i].bytes, inf) != in[i].bytes) {
        fprintf(stderr, "kiln-run: '%s' does not hold %zu bytes for input %zu\n",
                input_files[i], in[i].bytes, i);
        return 1;
      }
      fclose(inf);
    } else {
      kt_fill_random(&in[i], &seed);
    }
    in_dl[i] = in[i].dl;
  }

  double t0 = kt_now();
  s = kiln_function_compile(ctx, g, &opts, &fn);
  if (s) return fail("compile", s);
  kiln_tensor_type_t otypes[MAX_TENSORS];
  s = kiln_function_output_types(fn, in_dl, nin, otypes, nout);
  if (s) return fail("output types", s);
  if (!kt_alloc_outputs(otypes, nout, got, want, got_dl, want_dl)) {
    fprintf(stderr, "kiln-run: out of memory\n");
    return 1;
  }
  // The first call compiles symbolic graphs; count it as compile time.
  s = kiln_function_call(fn, in_dl, nin, got_dl, nout);
  if (s) return fail("call", s);
  double compile_s = kt_now() - t0;

  // Inputs the graph writes change with every call: keep the values they
  // had, then check one call of kiln against the reference on those.
  static kt_tensor_t before[MAX_TENSORS], ref_in[MAX_TENSORS];
  DLTensor ref_dl[MAX_TENSORS];
  size_t nmut = 0;
  for (size_t i = 0; i < nin; ++i) {
    ref_dl[i] = in_dl[i];
    if (!kiln_graph_input_mutated(g, i)) continue;
    nmut++;
    kiln_tensor_type_t t;
    kiln_graph_input_type(g, i, &t);
    for (int k = 0; k < t.rank; ++k) t.shape[k] = in[i].shape[k];
    if (!kt_alloc(&before[i], &t, in[i].dl.strides != NULL) ||
        !kt_alloc(&ref_in[i], &t, in[i].dl.strides != NULL)) {
      fprintf(stderr, "kiln-run: out of memory\n");
      return 1;
    }
    memcpy(before[i].base, in[i].base, in[i].bytes);
    ref_dl[i] = ref_in[i].dl;
  }

  double *times = calloc((size_t)iters, sizeof(double));
  for (int it = 0; it < iters; ++it) {
    double a = kt_now();
    s = kiln_function_call(fn, in_dl, nin, got_dl, nout);
    times[it] = kt_now() - a;
    if (s) return fail("call", s);
  }
  qsort(times, (size_t)iters, sizeof(double), cmp_double);
  if (nmut) {
    for (size_t i = 0; i < nin; ++i) {
      if (!before[i].base) continue;
      memcpy(in[i].base, before[i].base, in[i].bytes);
      memcpy(ref_in[i].base, before[i].base, in[i].bytes);
    }
    s = kiln_function_call(fn, in_dl, nin, got_dl, nout);
    if (s) return fail("call", s);
  }
  double a = kt_now();
  s = kiln_graph_interpret(g, ref_dl, nin, want_dl, nout);
  double ref_s = kt_now() - a;
  if (s) return fail("reference", s);

  int bad = 0;
  for (size_t i = 0; i < nout; ++i)
    bad |= !report("output", i, "", &got[i], &want[i], otypes[i].dtype);
  for (size_t i = 0; i < nin; ++i) {
    if (!ref_in[i].base) continue;
    kiln_tensor_type_t t;
    kiln_graph_input_type(g, i, &t);
    bad |= !report("input", i, " (written)", &in[i], &ref_in[i], t.dtype);
  }
  printf("compile: %.1f ms\n", compile_s * 1e3);
  printf("run:     %.3f ms (median of %d)\n", times[iters / 2] * 1e3, iters);
  printf("reference interpreter: %.3f ms\n", ref_s * 1e3);
  free(times);
  kt_free_n(in, nin);
  kt_free_n(before, nin);
  kt_free_n(ref_in, nin);
  kt_free_n(got, nout);
  kt_free_n(want, nout);
  kiln_function_release(fn);
  kiln_graph_destroy(g);
  kiln_context_destroy(ctx);
  return bad;
}
