// String buffer and bump arena.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

void kiln_sbuf_init(kiln_sbuf_t *b) { memset(b, 0, sizeof(*b)); }

void kiln_sbuf_free(kiln_sbuf_t *b) {
  free(b->data);
  kiln_sbuf_init(b);
}

static bool kiln_sbuf_reserve(kiln_sbuf_t *b, size_t extra) {
  if (b->oom) return false;
  if (b->length + extra + 1 <= b->capacity) return true;
  size_t cap = b->capacity ? b->capacity : 256;
  while (cap < b->length + extra + 1) cap *= 2;
  char *p = realloc(b->data, cap);
  if (!p) {
    b->oom = true;
    return false;
  }
  b->data = p;
  b->capacity = cap;
  return true;
}

void kiln_sbuf_append(kiln_sbuf_t *b, const char *s, size_t n) {
  if (!kiln_sbuf_reserve(b, n)) return;
  memcpy(b->data + b->length, s, n);
  b->length += n;
  b->data[b->length] = 0;
}

void kiln_sbuf_puts(kiln_sbuf_t *b, const char *s) {
  kiln_sbuf_append(b, s, strlen(s));
}

void kiln_sbuf_printf(kiln_sbuf_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  int n = vsnprintf(small, sizeof(small), fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof(small)) {
    kiln_sbuf_append(b, small, (size_t)n);
    return;
  }
  if (!kiln_sbuf_reserve(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->data + b->length, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->length += (size_t)n;
}

char *kiln_sbuf_take(kiln_sbuf_t *b) {
  if (b->oom) {
    kiln_sbuf_free(b);
    return NULL;
  }
  if (!b->data) kiln_sbuf_reserve(b, 0);
  if (b->oom) return NULL;
  if (b->data) b->data[b->length] = 0;
  char *p = b->data;
  kiln_sbuf_init(b);
  return p;
}

struct kiln_arena_block {
  kiln_arena_block_t *next;
  size_t used, size;
  _Alignas(16) unsigned char data[];
};

void kiln_arena_init(kiln_arena_t *a) { a->head = NULL; }

void kiln_arena_free(kiln_arena_t *a) {
  kiln_arena_block_t *b = a->head;
  while (b) {
    kiln_arena_block_t *next = b->next;
    free(b);
    b = next;
  }
  a->head = NULL;
}

void *kiln_arena_alloc(kiln_arena_t *a, size_t size) {
  size = (size + 15) & ~(size_t)15;
  kiln_arena_block_t *b = a->head;
  if (!b || b->used + size > b->size) {
    size_t bs = size > 16384 ? size : 16384;
    b = malloc(sizeof(*b) + bs);
    if (!b) return NULL;
    b->next = a->head;
    b->used = 0;
    b->size = bs;
    a->head = b;
  }
  void *p = b->data + b->used;
  b->used += size;
  memset(p, 0, size);
  return p;
}

char *kiln_arena_strndup(kiln_arena_t *a, const char *s, size_t n) {
  char *p = kiln_arena_alloc(a, n + 1);
  if (!p) return NULL;
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}
