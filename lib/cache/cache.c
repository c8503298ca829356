// The on-disk compile cache. See cache.h for the contract.
#include "cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

//===--- hashing ----------------------------------------------------------===//

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

void kiln_hasher_init(kiln_hasher_t *h) {
  h->a = 0x9E3779B97F4A7C15ull;
  h->b = 0xD1B54A32D192ED03ull;
  h->length = 0;
}

void kiln_hasher_update(kiln_hasher_t *h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; ++i) {
    // Two independent FNV-style lanes, each byte folded with its position.
    h->a = (h->a ^ p[i]) * 0x100000001B3ull;
    h->b = (h->b ^ (uint64_t)(p[i] + 0x5bd1e995u * (h->length + i))) *
           0x9E3779B97F4A7C15ull;
  }
  h->length += n;
}

void kiln_hasher_update_str(kiln_hasher_t *h, const char *s) {
  kiln_hasher_update(h, s, strlen(s) + 1);
}

kiln_hash128_t kiln_hasher_final(const kiln_hasher_t *h) {
  kiln_hash128_t r;
  r.hi = mix64(h->a ^ mix64(h->length));
  r.lo = mix64(h->b ^ r.hi);
  return r;
}

uint64_t kiln_checksum64(const void *data, size_t n) {
  kiln_hasher_t h;
  kiln_hasher_init(&h);
  kiln_hasher_update(&h, data, n);
  return kiln_hasher_final(&h).lo;
}

//===--- entries ----------------------------------------------------------===//

#define KILN_CACHE_MAGIC "KILNOBJ\1"
#define KILN_CACHE_FORMAT 1u

typedef struct {
  char magic[8];
  uint32_t format;
  uint32_t header_size;
  uint64_t key_hi, key_lo;
  uint64_t payload_size;
  uint64_t payload_checksum;
} entry_header_t;

struct kiln_cache {
  char *dir;
  uint64_t max_bytes;
};

static void key_name(kiln_hash128_t key, char out[40]) {
  snprintf(out, 40, "%016llx%016llx", (unsigned long long)key.hi,
           (unsigned long long)key.lo);
}

static kiln_status_t mkdir_private(const char *path) {
  char buf[PATH_MAX];
  snprintf(buf, sizeof(buf), "%s", path);
  for (char *p = buf + 1; *p; ++p) {
    if (*p != '/') continue;
    *p = 0;
    mkdir(buf, 0700);  // parents: EEXIST is fine
    *p = '/';
  }
  if (mkdir(buf, 0700) != 0 && errno != EEXIST)
    return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                            "compile cache: cannot create %s: %s", path,
                            strerror(errno));
  struct stat st;
  if (lstat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
    return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                            "compile cache: %s is not a directory", path);
  if (st.st_uid != geteuid())
    return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                            "compile cache: %s belongs to uid %u, not to this "
                            "user (uid %u); not using it",
                            path, (unsigned)st.st_uid, (unsigned)geteuid());
  return NULL;
}

kiln_status_t kiln_cache_open(const char *dir, uint64_t max_bytes,
                              kiln_cache_t **out_cache) {
  *out_cache = NULL;
  char path[PATH_MAX];
  const char *env = getenv("KILN_CACHE_DIR");
  if (dir && dir[0]) {
    snprintf(path, sizeof(path), "%s", dir);
  } else if (env && env[0]) {
    snprintf(path, sizeof(path), "%s", env);
  } else {
    const char *home = getenv("HOME");
    if (!home || !home[0])
      return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                              "compile cache: neither KILN_CACHE_DIR nor HOME "
                              "is set");
    snprintf(path, sizeof(path), "%s/.cache/kiln", home);
  }
  KILN_RETURN_IF_ERROR_PLAIN(mkdir_private(path));
  kiln_cache_t *c = calloc(1, sizeof(*c));
  if (!c || !(c->dir = strdup(path))) {
    free(c);
    return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "compile cache");
  }
  c->max_bytes = max_bytes ? max_bytes : (uint64_t)1 << 30;
  *out_cache = c;
  return NULL;
}

void kiln_cache_close(kiln_cache_t *cache) {
  if (!cache) return;
  free(cache->dir);
  free(cache);
}

const char *kiln_cache_dir(const kiln_cache_t *cache) { return cache->dir; }

// Reads and validates one entry file; on success returns the payload.
static bool read_entry(const char *path, const kiln_hash128_t *expect,
                       kiln_hash128_t *out_key, void **out_data,
                       size_t *out_size, char *note, size_t note_len) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (note) note[0] = 0;  // a plain miss
    return false;
  }
  struct stat st;
  const char *bad = NULL;
  entry_header_t h;
  void *data = NULL;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) bad = "not a regular file";
  else if (st.st_uid != geteuid()) bad = "owned by another user";
  else if ((size_t)st.st_size < sizeof(h)) bad = "truncated header";
  else if (read(fd, &h, sizeof(h)) != (ssize_t)sizeof(h)) bad = "unreadable";
  else if (memcmp(h.magic, KILN_CACHE_MAGIC, 8) != 0) bad = "bad magic";
  else if (h.format != KILN_CACHE_FORMAT || h.header_size != sizeof(h))
    bad = "other format version";
  else if (expect && (h.key_hi != expect->hi || h.key_lo != expect->lo))
    bad = "key does not match its file name";
  else if ((uint64_t)st.st_size != sizeof(h) + h.payload_size)
    bad = "truncated or padded payload";
  else if (!(data = malloc(h.payload_size ? h.payload_size : 1)))
    bad = "out of memory";
  else if (read(fd, data, h.payload_size) != (ssize_t)h.payload_size)
    bad = "short read";
  else if (kiln_checksum64(data, h.payload_size) != h.payload_checksum)
    bad = "checksum mismatch";
  close(fd);
  if (bad) {
    free(data);
    if (note) snprintf(note, note_len, "%s: %s", path, bad);
    return false;
  }
  if (out_key) {
    out_key->hi = h.key_hi;
    out_key->lo = h.key_lo;
  }
  *out_data = data;
  *out_size = h.payload_size;
  return true;
}

bool kiln_cache_get(kiln_cache_t *cache, kiln_hash128_t key, void **out_data,
                    size_t *out_size, char *note, size_t note_len) {
  *out_data = NULL;
  *out_size = 0;
  if (note && note_len) note[0] = 0;
  char name[40], path[PATH_MAX];
  key_name(key, name);
  snprintf(path, sizeof(path), "%s/%s.kobj", cache->dir, name);
  if (read_entry(path, &key, NULL, out_data, out_size, note, note_len)) {
    utimes(path, NULL);  // most recently used
    return true;
  }
  if (note && note[0]) unlink(path);  // bad entry: discard, rebuild
  return false;
}

static kiln_status_t write_entry(kiln_cache_t *cache, kiln_hash128_t key,
                                 const void *data, size_t size) {
  char name[40], path[PATH_MAX], tmp[PATH_MAX];
  key_name(key, name);
  snprintf(path, sizeof(path), "%s/%s.kobj", cache->dir, name);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(tmp, sizeof(tmp), "%s/.tmp-%s-%ld-%ld", cache->dir, name,
           (long)getpid(), (long)ts.tv_nsec);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                            "compile cache: cannot write %s: %s", tmp,
                            strerror(errno));
  entry_header_t h;
  memset(&h, 0, sizeof(h));
  memcpy(h.magic, KILN_CACHE_MAGIC, 8);
  h.format = KILN_CACHE_FORMAT;
  h.header_size = sizeof(h);
  h.key_hi = key.hi;
  h.key_lo = key.lo;
  h.payload_size = size;
  h.payload_checksum = kiln_checksum64(data, size);
  bool ok = write(fd, &h, sizeof(h)) == (ssize_t)sizeof(h) &&
            write(fd, data, size) == (ssize_t)size;
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                            "compile cache: writing %s failed: %s", path,
                            strerror(e));
  }
  return NULL;
}

typedef struct {
  char name[64];
  off_t size;
  struct timespec mtime;
} dir_item_t;

static int by_mtime(const void *a, const void *b) {
  const dir_item_t *x = a, *y = b;
  if (x->mtime.tv_sec != y->mtime.tv_sec)
    return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
  return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : x->mtime.tv_nsec > y->mtime.tv_nsec;
}

// Deletes least recently used entries until the total fits the cap.
static void evict(kiln_cache_t *cache) {
  DIR *d = opendir(cache->dir);
  if (!d) return;
  dir_item_t *items = NULL;
  size_t n = 0, cap = 0;
  uint64_t total = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t len = strlen(de->d_name);
    if (len < 5 || strcmp(de->d_name + len - 5, ".kobj") != 0 || len >= 64)
      continue;
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", cache->dir, de->d_name);
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      dir_item_t *ni = realloc(items, cap * sizeof(*items));
      if (!ni) break;
      items = ni;
    }
    snprintf(items[n].name, sizeof(items[n].name), "%s", de->d_name);
    items[n].size = st.st_size;
    items[n].mtime = st.st_mtim;
    total += (uint64_t)st.st_size;
    n++;
  }
  closedir(d);
  if (total > cache->max_bytes) {
    qsort(items, n, sizeof(*items), by_mtime);
    for (size_t i = 0; i < n && total > cache->max_bytes; ++i) {
      char path[PATH_MAX];
      snprintf(path, sizeof(path), "%s/%s", cache->dir, items[i].name);
      if (unlink(path) == 0) total -= (uint64_t)items[i].size;
    }
  }
  free(items);
}

kiln_status_t kiln_cache_put(kiln_cache_t *cache, kiln_hash128_t key,
                             const void *data, size_t size) {
  KILN_RETURN_IF_ERROR_PLAIN(write_entry(cache, key, data, size));
  evict(cache);
  return NULL;
}

//===--- artifacts --------------------------------------------------------===//

#define KILN_ARTIFACTS_MAGIC "KILNART1"

kiln_status_t kiln_cache_export(kiln_cache_t *cache, void **out_data,
                                size_t *out_size) {
  *out_data = NULL;
  *out_size = 0;
  DIR *d = opendir(cache->dir);
  if (!d)
    return kiln_make_status(KILN_STATUS_UNAVAILABLE,
                            "compile cache: cannot read %s", cache->dir);
  kiln_sbuf_t b;
  kiln_sbuf_init(&b);
  kiln_sbuf_append(&b, KILN_ARTIFACTS_MAGIC, 8);
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t len = strlen(de->d_name);
    if (len < 5 || strcmp(de->d_name + len - 5, ".kobj") != 0) continue;
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", cache->dir, de->d_name);
    kiln_hash128_t key;
    void *data;
    size_t size;
    if (!read_entry(path, NULL, &key, &data, &size, NULL, 0)) continue;
    uint64_t rec[4] = {key.hi, key.lo, size, kiln_checksum64(data, size)};
    kiln_sbuf_append(&b, (const char *)rec, sizeof(rec));
    kiln_sbuf_append(&b, data, size);
    free(data);
  }
  closedir(d);
  size_t n = b.length;
  char *p = kiln_sbuf_take(&b);
  if (!p) return kiln_make_status(KILN_STATUS_OUT_OF_MEMORY, "cache export");
  *out_data = p;
  *out_size = n;
  return NULL;
}

kiln_status_t kiln_cache_import(kiln_cache_t *cache, const void *data,
                                size_t size, int *out_count) {
  *out_count = 0;
  const unsigned char *p = data, *end = p + size;
  if (size < 8 || memcmp(p, KILN_ARTIFACTS_MAGIC, 8) != 0)
    return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                            "cache artifacts: bad magic; expected bytes from "
                            "kiln.save_cache_artifacts()");
  p += 8;
  while ((size_t)(end - p) >= 4 * sizeof(uint64_t)) {
    uint64_t rec[4];
    memcpy(rec, p, sizeof(rec));
    p += sizeof(rec);
    if (rec[2] > (uint64_t)(end - p))
      return kiln_make_status(KILN_STATUS_INVALID_ARGUMENT,
                              "cache artifacts: truncated record");
    if (kiln_checksum64(p, rec[2]) == rec[3]) {
      kiln_hash128_t key = {rec[0], rec[1]};
      KILN_RETURN_IF_ERROR_PLAIN(write_entry(cache, key, p, rec[2]));
      (*out_count)++;
    }
    p += rec[2];
  }
  evict(cache);
  return NULL;
}
