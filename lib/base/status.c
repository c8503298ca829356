// kiln_status_t: NULL is OK, a heap payload exists only on failure.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

struct kiln_status_payload {
  kiln_status_code_t code;
  char message[];  // NUL-terminated
};

// Returned when even the error cannot be allocated; freeing it is a no-op.
static struct {
  kiln_status_code_t code;
  char message[32];
} kiln_oom_status = {KILN_STATUS_OUT_OF_MEMORY, "out of memory"};
#define KILN_OOM_STATUS ((kiln_status_t)&kiln_oom_status)

kiln_status_t kiln_make_statusv(kiln_status_code_t code, const char *fmt,
                                va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) n = 0;
  kiln_status_t s = malloc(sizeof(*s) + (size_t)n + 1);
  if (!s) return KILN_OOM_STATUS;
  s->code = code;
  vsnprintf(s->message, (size_t)n + 1, fmt, ap);
  return s;
}

kiln_status_t kiln_make_status(kiln_status_code_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kiln_status_t s = kiln_make_statusv(code, fmt, ap);
  va_end(ap);
  return s;
}

kiln_status_t kiln_status_annotate(kiln_status_t status, const char *fmt,
                                   ...) {
  if (!status || status == KILN_OOM_STATUS) return status;
  char prefix[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof(prefix), fmt, ap);
  va_end(ap);
  if (!prefix[0]) return status;
  kiln_status_t s =
      kiln_make_status(status->code, "%s: %s", prefix, status->message);
  if (s == KILN_OOM_STATUS) return status;
  free(status);
  return s;
}

kiln_status_code_t kiln_status_code(kiln_status_t status) {
  return status ? status->code : KILN_STATUS_OK;
}

const char *kiln_status_message(kiln_status_t status) {
  return status ? status->message : "";
}

const char *kiln_status_code_name(kiln_status_code_t code) {
  switch (code) {
    case KILN_STATUS_OK: return "OK";
    case KILN_STATUS_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case KILN_STATUS_PARSE_ERROR: return "PARSE_ERROR";
    case KILN_STATUS_VERIFY_ERROR: return "VERIFY_ERROR";
    case KILN_STATUS_UNSUPPORTED: return "UNSUPPORTED";
    case KILN_STATUS_COMPILE_ERROR: return "COMPILE_ERROR";
    case KILN_STATUS_UNAVAILABLE: return "UNAVAILABLE";
    case KILN_STATUS_OUT_OF_MEMORY: return "OUT_OF_MEMORY";
    case KILN_STATUS_INTERNAL: return "INTERNAL";
  }
  return "UNKNOWN";
}

void kiln_status_free(kiln_status_t status) {
  if (status && status != KILN_OOM_STATUS) free(status);
}

void kiln_free(void *ptr) { free(ptr); }

const char *kiln_version_string(void) { return "0.1.0"; }
