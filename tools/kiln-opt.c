// kiln-opt: graph text or MLIR in, the IR after a pipeline stage out.
//   kiln-opt [--emit=graph|linalg|fused|vectorized|bufferized|loops|llvm]
//            [--no-vectorize] [--threads=N] [--target=cpu|cuda] [FILE|-]
// With --target=cuda, the stages after 'bufferized' print the module after
// the GPU pipeline: host function with kernel launches, and the PTX (for
// the local device's architecture, or sm_90 without one).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

static char *read_all(FILE *f, size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  size_t r;
  while ((r = fread(buf + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) {
        free(buf);
        return NULL;
      }
      buf = nb;
    }
  }
  *len = n;
  return buf;
}

static int fail(kiln_status_t s) {
  fprintf(stderr, "kiln-opt: %s: %s\n",
          kiln_status_code_name(kiln_status_code(s)), kiln_status_message(s));
  kiln_status_free(s);
  return 1;
}

int main(int argc, char **argv) {
  const char *path = "-", *emit = "linalg";
  kiln_compile_options_t opts;
  kiln_compile_options_init(&opts);
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], "--emit=", 7) == 0) emit = argv[i] + 7;
    else if (strcmp(argv[i], "--no-vectorize") == 0) opts.vectorize = 0;
    else if (strncmp(argv[i], "--target=", 9) == 0) opts.target = argv[i] + 9;
    else if (strncmp(argv[i], "--threads=", 10) == 0) opts.num_threads = atoi(argv[i] + 10);
    else if (strcmp(argv[i], "--help") == 0) {
      printf("usage: kiln-opt [--emit=STAGE] [--no-vectorize] [--threads=N] [--target=cpu|cuda] [FILE|-]\n"
             "stages: graph linalg fused vectorized bufferized loops llvm\n");
      return 0;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "kiln-opt: unknown option '%s' (try --help)\n", argv[i]);
      return 2;
    } else path = argv[i];
  }
  kiln_stage_t stage;
  kiln_status_t s = kiln_stage_parse(emit, &stage);
  if (s) return fail(s);
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "kiln-opt: cannot open '%s'\n", path);
    return 1;
  }
  size_t len = 0;
  char *text = read_all(f, &len);
  if (f != stdin) fclose(f);
  if (!text) {
    fprintf(stderr, "kiln-opt: out of memory reading '%s'\n", path);
    return 1;
  }
  kiln_context_t *ctx = NULL;
  s = kiln_context_create(NULL, &ctx);
  if (s) {
    free(text);
    return fail(s);
  }
  char *out = NULL;
  s = kiln_emit(ctx, text, len, strcmp(path, "-") ? path : "<stdin>", &opts,
                stage, &out);
  free(text);
  int rc = 0;
  if (s) rc = fail(s);
  else fputs(out, stdout);
  kiln_free(out);
  kiln_context_destroy(ctx);
  return rc;
}
