// The guard table: open addressing over immutable-once-published slots.
#include "guard.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static inline uint64_t mix(uint64_t h, uint64_t w) {
  h ^= w + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 32);
}

// The calling thread's buffer for keys longer than the inline words; freed
// when the thread exits.
static pthread_key_t long_key_buffer;
static pthread_once_t long_key_once = PTHREAD_ONCE_INIT;
static void long_key_init(void) { pthread_key_create(&long_key_buffer, free); }

static uint64_t *long_key_words(size_t need) {
  pthread_once(&long_key_once, long_key_init);
  uint64_t *buf = pthread_getspecific(long_key_buffer);
  size_t cap = buf ? (size_t)buf[0] : 0;
  if (cap < need) {
    size_t ncap = need + need / 2;
    uint64_t *nb = malloc(sizeof(uint64_t) * (ncap + 1));
    if (!nb) return NULL;
    free(buf);
    nb[0] = ncap;
    buf = nb;
    if (pthread_setspecific(long_key_buffer, buf)) {
      free(buf);
      return NULL;
    }
  }
  return buf + 1;
}

bool kiln_guard_key_make(const DLTensor *inputs, size_t count,
                         kiln_guard_key_t *key) {
  size_t need = 0;
  for (size_t i = 0; i < count; ++i) {
    if (inputs[i].ndim < 0 || inputs[i].ndim > KILN_MAX_RANK) return false;
    need += 2 + (size_t)inputs[i].ndim;
  }
  if (need > UINT32_MAX) return false;
  key->words = key->inline_words;
  if (need > KILN_GUARD_INLINE_WORDS && !(key->words = long_key_words(need)))
    return false;
  uint32_t n = 0;
  uint64_t h = 0x243F6A8885A308D3ull ^ count;
  for (size_t i = 0; i < count; ++i) {
    const DLTensor *t = &inputs[i];
    // Stride class: contiguous (NULL strides or row-major) or not.
    bool contiguous = true;
    if (t->strides) {
      int64_t expect = 1;
      for (int d = t->ndim - 1; d >= 0; --d) {
        if (t->shape[d] != 1 && t->strides[d] != expect) contiguous = false;
        expect *= t->shape[d];
      }
    }
    uintptr_t addr = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
    uint64_t w0 = (uint64_t)t->dtype.code | (uint64_t)t->dtype.bits << 8 |
                  (uint64_t)t->dtype.lanes << 16 | (uint64_t)t->ndim << 32 |
                  (uint64_t)contiguous << 40 | (uint64_t)((addr & 15) == 0) << 41;
    uint64_t w1 = (uint64_t)(uint32_t)t->device.device_type |
                  (uint64_t)(uint32_t)t->device.device_id << 32;
    key->words[n++] = w0;
    key->words[n++] = w1;
    h = mix(mix(h, w0), w1);
    for (int d = 0; d < t->ndim; ++d) {
      uint64_t w = (uint64_t)t->shape[d];
      key->words[n++] = w;
      h = mix(h, w);
    }
  }
  key->count = n;
  key->hash = h ? h : 1;  // 0 marks an empty slot
  return true;
}

typedef struct {
  uint64_t hash;  // 0: empty; published last
  uint32_t count;
  const uint64_t *words;
  void *value;
} slot_t;

typedef struct slots {
  uint32_t capacity;  // power of two
  slot_t *slot;
  struct slots *retired;  // the array this one replaced
} slots_t;

struct kiln_guard_table {
  slots_t *current;  // atomically published
  uint32_t size, max_entries;
  pthread_mutex_t lock;
  kiln_arena_t arena;  // key words, owned for the table's lifetime
};

static slots_t *slots_new(uint32_t capacity) {
  slots_t *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  s->slot = calloc(capacity, sizeof(slot_t));
  if (!s->slot) {
    free(s);
    return NULL;
  }
  s->capacity = capacity;
  return s;
}

kiln_status_t kiln_guard_table_create(uint32_t max_entries,
                                      kiln_guard_table_t **out_table) {
  *out_table = NULL;
  kiln_guard_table_t *t = calloc(1, sizeof(*t));
  if (!t || !(t->current = slots_new(16))) {
    free(t);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "guard table");
  }
  t->max_entries = max_entries ? max_entries : 1024;
  pthread_mutex_init(&t->lock, NULL);
  kiln_arena_init(&t->arena);
  *out_table = t;
  return NULL;
}

void kiln_guard_table_destroy(kiln_guard_table_t *table) {
  if (!table) return;
  slots_t *s = table->current;
  while (s) {
    slots_t *next = s->retired;
    free(s->slot);
    free(s);
    s = next;
  }
  kiln_arena_free(&table->arena);
  pthread_mutex_destroy(&table->lock);
  free(table);
}

static void *probe(const slots_t *s, const kiln_guard_key_t *key) {
  uint32_t mask = s->capacity - 1;
  for (uint32_t i = (uint32_t)key->hash & mask;; i = (i + 1) & mask) {
    const slot_t *sl = &s->slot[i];
    uint64_t h = __atomic_load_n(&sl->hash, __ATOMIC_ACQUIRE);
    if (h == 0) return NULL;
    if (h == key->hash && sl->count == key->count &&
        memcmp(sl->words, key->words, sizeof(uint64_t) * key->count) == 0)
      return sl->value;
  }
}

void *kiln_guard_lookup(const kiln_guard_table_t *table,
                        const kiln_guard_key_t *key) {
  const slots_t *s = __atomic_load_n(&table->current, __ATOMIC_ACQUIRE);
  return probe(s, key);
}

static void place(slots_t *s, uint64_t hash, uint32_t count,
                  const uint64_t *words, void *value) {
  uint32_t mask = s->capacity - 1;
  uint32_t i = (uint32_t)hash & mask;
  while (s->slot[i].hash) i = (i + 1) & mask;
  s->slot[i].count = count;
  s->slot[i].words = words;
  s->slot[i].value = value;
  __atomic_store_n(&s->slot[i].hash, hash, __ATOMIC_RELEASE);
}

void *kiln_guard_insert(kiln_guard_table_t *table, const kiln_guard_key_t *key,
                        void *value) {
  pthread_mutex_lock(&table->lock);
  slots_t *s = table->current;
  void *existing = probe(s, key);
  if (existing || table->size >= table->max_entries) {
    pthread_mutex_unlock(&table->lock);
    return existing ? existing : value;
  }
  uint64_t *words = kiln_arena_alloc(&table->arena,
                                     sizeof(uint64_t) * (key->count + 1));
  if (!words) {
    pthread_mutex_unlock(&table->lock);
    return value;
  }
  memcpy(words, key->words, sizeof(uint64_t) * key->count);
  if ((table->size + 1) * 2 > s->capacity) {
    // Grow into a new array; readers keep using the old one until the
    // release store below, and the old one lives until destroy.
    slots_t *g = slots_new(s->capacity * 2);
    if (!g) {
      pthread_mutex_unlock(&table->lock);
      return value;
    }
    for (uint32_t i = 0; i < s->capacity; ++i)
      if (s->slot[i].hash)
        place(g, s->slot[i].hash, s->slot[i].count, s->slot[i].words,
              s->slot[i].value);
    g->retired = s;
    place(g, key->hash, key->count, words, value);
    __atomic_store_n(&table->current, g, __ATOMIC_RELEASE);
  } else {
    place(s, key->hash, key->count, words, value);
  }
  __atomic_add_fetch(&table->size, 1, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&table->lock);
  return value;
}

uint32_t kiln_guard_size(const kiln_guard_table_t *table) {
  return __atomic_load_n(&table->size, __ATOMIC_RELAXED);
}
