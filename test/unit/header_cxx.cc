// include/kiln/kiln.h compiles as C++ (the C11 build compiles it as C) and
// its declarations have C linkage: this test links against libkiln.
#include "kiln/kiln.h"

#include <cstdio>
#include <cstring>

int main() {
  kiln_compile_options_t opts;
  kiln_compile_options_init(&opts);
  kiln_stage_t stage = KILN_STAGE_GRAPH;
  kiln_status_t s = kiln_stage_parse("llvm", &stage);
  bool ok = s == nullptr && stage == KILN_STAGE_LLVM && opts.opt_level == 3 &&
            std::strcmp(kiln_status_code_name(KILN_STATUS_PARSE_ERROR), "PARSE_ERROR") == 0 &&
            std::strcmp(kiln_version_string(), "0.1.0") == 0;
  std::printf("header_cxx: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
