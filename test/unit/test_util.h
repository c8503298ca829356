// Minimal assertion helpers for kiln's C unit tests (ctest runs each binary;
// a non-zero exit is a failure).
#ifndef KILN_TEST_UNIT_TEST_UTIL_H_
#define KILN_TEST_UNIT_TEST_UTIL_H_

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

static int kt_failures = 0;

#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,  \
              #cond);                                                    \
      kt_failures++;                                                     \
    }                                                                    \
  } while (0)

#define CHECK_OK(expr)                                                   \
  do {                                                                   \
    kiln_status_t s_ = (expr);                                           \
    if (s_) {                                                            \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__,     \
              #expr, kiln_status_message(s_));                           \
      kiln_status_free(s_);                                              \
      kt_failures++;                                                     \
    }                                                                    \
  } while (0)

// Expects `expr` to fail with `code` and a message containing `needle`.
#define CHECK_ERR(expr, code, needle)                                    \
  do {                                                                   \
    kiln_status_t s_ = (expr);                                           \
    if (!s_) {                                                           \
      fprintf(stderr, "%s:%d: %s succeeded; expected %s\n", __FILE__,   \
              __LINE__, #expr, #code);                                   \
      kt_failures++;                                                     \
    } else {                                                             \
      if (kiln_status_code(s_) != (code) ||                              \
          !strstr(kiln_status_message(s_), (needle))) {                  \
        fprintf(stderr, "%s:%d: %s: got %s \"%s\"; expected %s with "   \
                "\"%s\"\n", __FILE__, __LINE__, #expr,                   \
                kiln_status_code_name(kiln_status_code(s_)),             \
                kiln_status_message(s_), #code, (needle));               \
        kt_failures++;                                                   \
      }                                                                  \
      kiln_status_free(s_);                                              \
    }                                                                    \
  } while (0)

static int kt_finish(const char *name) {
  if (kt_failures) {
    fprintf(stderr, "%s: %d failure(s)\n", name, kt_failures);
    return 1;
  }
  printf("%s: ok\n", name);
  return 0;
}

#endif  // KILN_TEST_UNIT_TEST_UTIL_H_
