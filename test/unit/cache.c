// The persistent compile cache: a second process compiles nothing; a
// truncated, corrupted or foreign-owned entry is discarded and rebuilt with
// correct results; concurrent writers leave a valid cache; identical graphs
// under other names share an entry; the cap evicts; artifacts round-trip;
// the directory is private.
#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"
#include "tools/tensor_util.h"

extern char **environ;

static const char *kGraphA =
    "graph @a(%x: f32[8,32], %w: f32[32,16]) {\n"
    "  %h = aten.mm(%x, %w)\n  %y = aten._softmax(%h) {dim = 1}\n  return %y\n}\n";
// The same code under another name: must hit A's entry.
static const char *kGraphA2 =
    "graph @a_copy(%x: f32[8,32], %w: f32[32,16]) {\n"
    "  %h = aten.mm(%x, %w)\n  %y = aten._softmax(%h) {dim = 1}\n  return %y\n}\n";
// And with every value named otherwise (as N layers of one model arrive).
static const char *kGraphA3 =
    "graph @layer7(%inp_7: f32[8,32], %w7: f32[32,16]) {\n"
    "  %mm_13 = aten.mm(%inp_7, %w7)\n  %softmax_2 = aten._softmax(%mm_13) {dim = 1}\n"
    "  return %softmax_2\n}\n";
// Two graphs of equal names and types whose operands are swapped: other
// code, each its own entry (the canonical text numbers uses by definition).
static const char *kSubAB =
    "graph @s(%a: f32[8,32], %b: f32[8,32]) {\n"
    "  %d = aten.sub(%a, %b)\n  return %d\n}\n";
static const char *kSubBA =
    "graph @s(%a: f32[8,32], %b: f32[8,32]) {\n"
    "  %d = aten.sub(%b, %a)\n  return %d\n}\n";
static const char *kGraphB =
    "graph @b(%x: f32[8,32]) {\n  %y = aten.tanh(%x)\n  return %y\n}\n";
static const char *kGraphC =
    "graph @c(%x: f32[8,32]) {\n  %y = aten.exp(%x)\n  return %y\n}\n";

static char dir[200];

static kiln_context_t *open_ctx(const char *d, uint64_t cap) {
  kiln_context_options_t o;
  kiln_context_options_init(&o);
  o.cache_dir = d;
  o.cache_max_bytes = cap;
  kiln_context_t *ctx = NULL;
  CHECK_OK(kiln_context_create(&o, &ctx));
  return ctx;
}

// Compiles `text`, runs it once against the reference; returns failures.
static int compile_and_check(kiln_context_t *ctx, const char *text) {
  kiln_graph_t *g = NULL;
  kiln_function_t *fn = NULL;
  kiln_status_t s = kiln_graph_parse(ctx, text, strlen(text), "cache", &g);
  if (!s) s = kiln_function_compile(ctx, g, NULL, &fn);
  if (s) {
    fprintf(stderr, "compile: %s\n", kiln_status_message(s));
    kiln_status_free(s);
    kiln_graph_destroy(g);
    return 1;
  }
  uint64_t seed = 42;
  size_t nin = kiln_graph_input_count(g);
  kt_tensor_t in[4], got, want;
  DLTensor in_dl[4];
  for (size_t i = 0; i < nin; ++i) {
    kiln_tensor_type_t t;
    kiln_graph_input_type(g, i, &t);
    kt_alloc(&in[i], &t, false);
    kt_fill_random(&in[i], &seed);
    in_dl[i] = in[i].dl;
  }
  kiln_tensor_type_t ot;
  kiln_graph_output_type(g, 0, &ot);
  kt_alloc(&got, &ot, false);
  kt_alloc(&want, &ot, false);
  kt_poison(&got);
  int fails = 0;
  s = kiln_function_call(fn, in_dl, nin, &got.dl, 1);
  if (!s) s = kiln_graph_interpret(g, in_dl, nin, &want.dl, 1);
  kt_compare_t c;
  if (s || !kt_compare(&got, &want, kt_tolerance_for(ot.dtype), &c)) {
    fprintf(stderr, "results differ from the reference (%s)\n",
            s ? kiln_status_message(s) : "mismatch");
    fails++;
  }
  kiln_status_free(s);
  for (size_t i = 0; i < nin; ++i) kt_free(&in[i]);
  kt_free(&got);
  kt_free(&want);
  kiln_function_release(fn);
  kiln_graph_destroy(g);
  return fails;
}

static int entry_count(const char *d, bool *temp_left) {
  DIR *dd = opendir(d);
  int n = 0;
  struct dirent *de;
  while (dd && (de = readdir(dd))) {
    if (strstr(de->d_name, ".kobj")) n++;
    if (strncmp(de->d_name, ".tmp-", 5) == 0 && temp_left) *temp_left = true;
  }
  if (dd) closedir(dd);
  return n;
}

static void entry_path(const char *d, char *out, size_t n) {
  DIR *dd = opendir(d);
  struct dirent *de;
  out[0] = 0;
  while (dd && (de = readdir(dd)))
    if (strstr(de->d_name, ".kobj")) snprintf(out, n, "%s/%s", d, de->d_name);
  if (dd) closedir(dd);
}

// Child mode: compile graph A in `d` and exit 0 iff it was a cache hit (or,
// with "any", just correct).
static int child(const char *d, const char *mode) {
  kiln_context_t *ctx = open_ctx(d, 0);
  if (!ctx) return 3;
  int fails = compile_and_check(ctx, kGraphA);
  kiln_stats_t st;
  kiln_context_stats(ctx, &st);
  kiln_context_destroy(ctx);
  if (fails) return 2;
  if (strcmp(mode, "hit") == 0)
    return (st.compiles == 0 && st.cache_hits == 1) ? 0 : 1;
  return 0;
}

static pid_t spawn_child(const char *self, const char *d, const char *mode) {
  pid_t pid;
  char *argv[] = {(char *)self, "--child", (char *)d, (char *)mode, NULL};
  if (posix_spawn(&pid, self, NULL, NULL, argv, environ) != 0) return -1;
  return pid;
}

static int wait_child(pid_t pid) {
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--child") == 0) return child(argv[2], argv[3]);
  const char *self = "/proc/self/exe";
  char exe[4096];
  ssize_t n = readlink(self, exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = 0;
    self = exe;
  }
  snprintf(dir, sizeof(dir), "/tmp/kiln-cache-test-%d", (int)getpid());
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  if (system(cmd) != 0) return 1;

  // Cold: one compile, the directory is private.
  kiln_context_t *ctx = open_ctx(dir, 0);
  if (!ctx) return kt_finish("cache");
  kt_failures += compile_and_check(ctx, kGraphA);
  kiln_stats_t st;
  kiln_context_stats(ctx, &st);
  CHECK(st.compiles == 1 && st.cache_misses == 1 && st.cache_hits == 0);
  struct stat ds;
  CHECK(stat(dir, &ds) == 0 && (ds.st_mode & 0077) == 0);
  CHECK(entry_count(dir, NULL) == 1);
  // The same graph under another name is the same entry.
  kt_failures += compile_and_check(ctx, kGraphA2);
  kiln_context_stats(ctx, &st);
  CHECK(st.compiles == 1 && st.cache_hits == 1);
  // So is the same graph with its values named otherwise.
  kt_failures += compile_and_check(ctx, kGraphA3);
  kiln_context_stats(ctx, &st);
  CHECK(st.compiles == 1 && st.cache_hits == 2);
  kiln_context_destroy(ctx);
  // Operands in the other order are other code (in a directory of its own:
  // the damage checks below take `dir` to hold A's entry alone).
  char dir_order[240];
  snprintf(dir_order, sizeof(dir_order), "%s-order", dir);
  kiln_context_t *octx = open_ctx(dir_order, 0);
  if (octx) {
    kt_failures += compile_and_check(octx, kSubAB);
    kt_failures += compile_and_check(octx, kSubBA);
    kiln_context_stats(octx, &st);
    CHECK(st.compiles == 2 && st.cache_hits == 0);
    CHECK(entry_count(dir_order, NULL) == 2);
    kiln_context_destroy(octx);
  }
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir_order);
  CHECK(system(cmd) == 0);

  // A second process compiles nothing.
  CHECK(wait_child(spawn_child(self, dir, "hit")) == 0);

  // Truncated, bytes flipped, foreign-owned: each discarded and rebuilt.
  char entry[1024];
  for (int damage = 0; damage < 3; ++damage) {
    entry_path(dir, entry, sizeof(entry));
    CHECK(entry[0]);
    if (damage == 0) {
      CHECK(truncate(entry, 40) == 0);
    } else if (damage == 1) {
      int fd = open(entry, O_RDWR);
      unsigned char byte = 0;
      CHECK(fd >= 0 && pread(fd, &byte, 1, 200) == 1);
      byte ^= 0x5a;
      CHECK(pwrite(fd, &byte, 1, 200) == 1);
      close(fd);
    } else {
      if (geteuid() != 0) continue;  // only root can hand a file to another
      CHECK(chown(entry, 65534, 65534) == 0);
    }
    ctx = open_ctx(dir, 0);
    kt_failures += compile_and_check(ctx, kGraphA);
    kiln_context_stats(ctx, &st);
    CHECK(st.cache_rejected == 1 && st.compiles == 1 && st.cache_hits == 0);
    kiln_context_destroy(ctx);
    CHECK(wait_child(spawn_child(self, dir, "hit")) == 0);
  }

  // Two processes writing the same entry at once leave a valid cache.
  snprintf(cmd, sizeof(cmd), "rm -rf %s/*", dir);
  CHECK(system(cmd) == 0);
  pid_t p1 = spawn_child(self, dir, "any"), p2 = spawn_child(self, dir, "any");
  CHECK(wait_child(p1) == 0 && wait_child(p2) == 0);
  bool temp_left = false;
  CHECK(entry_count(dir, &temp_left) == 1 && !temp_left);
  CHECK(wait_child(spawn_child(self, dir, "hit")) == 0);

  // Artifacts: export here, import into an empty directory, hit there.
  ctx = open_ctx(dir, 0);
  void *art = NULL;
  size_t art_size = 0;
  CHECK_OK(kiln_context_cache_export(ctx, &art, &art_size));
  kiln_context_destroy(ctx);
  char dir2[280];
  snprintf(dir2, sizeof(dir2), "%s-import", dir);
  ctx = open_ctx(dir2, 0);
  int imported = 0;
  CHECK_OK(kiln_context_cache_import(ctx, art, art_size, &imported));
  CHECK(imported == 1);
  CHECK_ERR(kiln_context_cache_import(ctx, "garbage!", 8, &imported),
            KILN_STATUS_INVALID_ARGUMENT, "bad magic");
  kiln_context_destroy(ctx);
  kiln_free(art);
  CHECK(wait_child(spawn_child(self, dir2, "hit")) == 0);

  // The cap evicts the least recently used entry: measure B's and C's
  // entries, then cap below their sum.
  struct stat sb, sc;
  snprintf(cmd, sizeof(cmd), "rm -rf %s/*", dir);
  CHECK(system(cmd) == 0);
  ctx = open_ctx(dir, 0);
  kt_failures += compile_and_check(ctx, kGraphB);
  entry_path(dir, entry, sizeof(entry));
  CHECK(stat(entry, &sb) == 0);
  CHECK(system(cmd) == 0);
  kt_failures += compile_and_check(ctx, kGraphC);
  entry_path(dir, entry, sizeof(entry));
  char c_entry[1024];
  snprintf(c_entry, sizeof(c_entry), "%s", entry);
  CHECK(stat(entry, &sc) == 0);
  kiln_context_destroy(ctx);
  CHECK(system(cmd) == 0);
  ctx = open_ctx(dir, (uint64_t)(sb.st_size > sc.st_size ? sb.st_size : sc.st_size));
  kt_failures += compile_and_check(ctx, kGraphB);
  kt_failures += compile_and_check(ctx, kGraphC);
  CHECK(entry_count(dir, NULL) == 1 && access(c_entry, F_OK) == 0);
  kiln_context_destroy(ctx);

  snprintf(cmd, sizeof(cmd), "rm -rf %s %s", dir, dir2);
  CHECK(system(cmd) == 0);
  return kt_finish("cache");
}
