// lib/guard: the guard table. A call's signature (per input: dtype, rank,
// sizes, stride class, 16-byte alignment, device) is packed into a key; the
// table maps keys to whatever the caller stores (a compiled variant).
//
// Lookups take no lock and allocate nothing: the slot array is only ever
// appended to in place (a slot is published by storing its hash last, with
// release order) and replaced wholesale when it grows; replaced arrays are
// kept until the table is destroyed, so a reader never sees freed memory.
// Inserts serialize on a mutex. Knows DLPack, nothing of MLIR or CUDA.
#ifndef KILN_LIB_GUARD_GUARD_H_
#define KILN_LIB_GUARD_GUARD_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/base/base.h"

// Words of the packed key of one call: 2 per input plus one per dim. Keys of
// up to 64 inputs of any rank live in the key itself; longer ones (an
// optimizer step over every parameter) in a buffer kept per thread, so a
// lookup still allocates nothing once a thread has seen its longest key.
#define KILN_GUARD_INLINE_WORDS (64 * (2 + KILN_MAX_RANK))

typedef struct kiln_guard_key {
  uint64_t hash;
  uint32_t count;
  uint64_t *words;  // `inline_words`, or the calling thread's buffer
  uint64_t inline_words[KILN_GUARD_INLINE_WORDS];
} kiln_guard_key_t;

// Packs `inputs` into `key`. False for a rank above KILN_MAX_RANK or when
// the thread's buffer for a long key cannot grow (the caller takes the slow,
// checking path). A key made on one thread is used on that thread only.
bool kiln_guard_key_make(const DLTensor *inputs, size_t count,
                         kiln_guard_key_t *key);

typedef struct kiln_guard_table kiln_guard_table_t;

// `max_entries` bounds memory (0: 1024); past it inserts are dropped and
// those calls take the slow path.
kiln_status_t kiln_guard_table_create(uint32_t max_entries,
                                      kiln_guard_table_t **out_table);
void kiln_guard_table_destroy(kiln_guard_table_t *table);
// The value stored for `key`, or NULL. Lock-free; safe against concurrent
// inserts.
void *kiln_guard_lookup(const kiln_guard_table_t *table,
                        const kiln_guard_key_t *key);
// Stores `value` for `key` (first insert wins; returns the stored value).
void *kiln_guard_insert(kiln_guard_table_t *table, const kiln_guard_key_t *key,
                        void *value);
uint32_t kiln_guard_size(const kiln_guard_table_t *table);

#endif  // KILN_LIB_GUARD_GUARD_H_
