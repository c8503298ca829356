// lib/cache: a persistent, content-addressed store of compiled code.
// Knows files and bytes, nothing of MLIR, LLVM or CUDA.
//
// Layout: <dir>/<32 hex digits>.kobj, one entry per key. An entry is a
// header (magic, format version, key, payload size, payload checksum) and the
// payload. Writes go to a private temporary file renamed into place, so
// readers in other processes see whole entries or none. An entry that is
// truncated, corrupted, of another format, not a regular file or not owned
// by this user is never loaded: it is removed and reported. The directory is
// created private (0700). A size cap evicts least-recently-used entries.
#ifndef KILN_LIB_CACHE_CACHE_H_
#define KILN_LIB_CACHE_CACHE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/base/base.h"

// A 128-bit content hash (not cryptographic: keys are not adversarial, and
// every entry also carries a checksum of its payload).
typedef struct kiln_hash128 {
  uint64_t hi, lo;
} kiln_hash128_t;

typedef struct kiln_hasher {
  uint64_t a, b;
  uint64_t length;
} kiln_hasher_t;

void kiln_hasher_init(kiln_hasher_t *h);
void kiln_hasher_update(kiln_hasher_t *h, const void *data, size_t n);
void kiln_hasher_update_str(kiln_hasher_t *h, const char *s);  // with its NUL
kiln_hash128_t kiln_hasher_final(const kiln_hasher_t *h);
// 64-bit checksum of a buffer.
uint64_t kiln_checksum64(const void *data, size_t n);

typedef struct kiln_cache kiln_cache_t;

// Opens (creating it private to the user) the cache directory `dir`; NULL
// means $KILN_CACHE_DIR, else ~/.cache/kiln. `max_bytes` caps the total size
// (0: 1 GiB). Fails when the directory cannot be made or belongs to another
// user.
kiln_status_t kiln_cache_open(const char *dir, uint64_t max_bytes,
                              kiln_cache_t **out_cache);
void kiln_cache_close(kiln_cache_t *cache);
const char *kiln_cache_dir(const kiln_cache_t *cache);

// Looks `key` up. On a hit, *out_data (malloc'd, caller frees) and *out_size
// are set and the entry becomes most recently used. A bad entry is removed,
// counts as a miss, and `note` (may be NULL) says what was wrong.
bool kiln_cache_get(kiln_cache_t *cache, kiln_hash128_t key, void **out_data,
                    size_t *out_size, char *note, size_t note_len);
// Stores `data` under `key` atomically, then evicts past the cap.
kiln_status_t kiln_cache_put(kiln_cache_t *cache, kiln_hash128_t key,
                             const void *data, size_t size);

// Every valid entry, serialized into one buffer (caller frees), and back:
// the pair behind kiln.save_cache_artifacts / load_cache_artifacts.
kiln_status_t kiln_cache_export(kiln_cache_t *cache, void **out_data,
                                size_t *out_size);
// Returns the number of entries stored; invalid records are skipped.
kiln_status_t kiln_cache_import(kiln_cache_t *cache, const void *data,
                                size_t size, int *out_count);

#endif  // KILN_LIB_CACHE_CACHE_H_
