// Internal support shared by every kiln module: status construction, a
// growable string buffer and a bump arena. No MLIR, no CUDA, no graphs.
#ifndef KILN_LIB_BASE_BASE_H_
#define KILN_LIB_BASE_BASE_H_

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#if defined(__GNUC__)
#define KILN_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define KILN_PRINTF(fmt, args)
#endif

//===--- status -----------------------------------------------------------===//

// Makes a failed status. Never returns NULL: when the payload cannot be
// allocated a static out-of-memory status is returned (freeing it is a no-op).
kiln_status_t kiln_make_status(kiln_status_code_t code, const char *fmt, ...)
    KILN_PRINTF(2, 3);
kiln_status_t kiln_make_statusv(kiln_status_code_t code, const char *fmt,
                                va_list ap);
// Prefixes the message of `status` with "context: " and returns it.
kiln_status_t kiln_status_annotate(kiln_status_t status, const char *fmt, ...)
    KILN_PRINTF(2, 3);

#define KILN_RETURN_IF_ERROR(expr, ...)                        \
  do {                                                         \
    kiln_status_t kiln_status_ = (expr);                       \
    if (kiln_status_) return kiln_status_annotate(kiln_status_, __VA_ARGS__); \
  } while (0)

#define KILN_RETURN_IF_ERROR_PLAIN(expr)        \
  do {                                          \
    kiln_status_t kiln_status_ = (expr);        \
    if (kiln_status_) return kiln_status_;      \
  } while (0)

//===--- string buffer ----------------------------------------------------===//

// A growable NUL-terminated string. On allocation failure `oom` is set and
// further appends are ignored, so emitters check once at the end.
typedef struct kiln_sbuf {
  char *data;
  size_t length;
  size_t capacity;
  bool oom;
} kiln_sbuf_t;

void kiln_sbuf_init(kiln_sbuf_t *b);
void kiln_sbuf_free(kiln_sbuf_t *b);
void kiln_sbuf_append(kiln_sbuf_t *b, const char *s, size_t n);
void kiln_sbuf_puts(kiln_sbuf_t *b, const char *s);
void kiln_sbuf_printf(kiln_sbuf_t *b, const char *fmt, ...) KILN_PRINTF(2, 3);
// Takes the buffer's memory (caller frees with free()); NULL on OOM.
char *kiln_sbuf_take(kiln_sbuf_t *b);

//===--- arena ------------------------------------------------------------===//

// A bump allocator: many small allocations, freed all at once.
typedef struct kiln_arena_block kiln_arena_block_t;
typedef struct kiln_arena {
  kiln_arena_block_t *head;
} kiln_arena_t;

void kiln_arena_init(kiln_arena_t *a);
void kiln_arena_free(kiln_arena_t *a);
// Zeroed, 16-byte aligned memory, or NULL on OOM.
void *kiln_arena_alloc(kiln_arena_t *a, size_t size);
char *kiln_arena_strndup(kiln_arena_t *a, const char *s, size_t n);

#endif  // KILN_LIB_BASE_BASE_H_
