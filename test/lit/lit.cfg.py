# lit configuration for kiln's FileCheck tests.
import os
import lit.formats

config.name = "kiln"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".kiln", ".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["lit.cfg.py", "Inputs"]

build_dir = lit_config.params.get("build_dir",
                                  os.path.join(config.test_source_root,
                                               "..", "..", "build"))
llvm_bin = lit_config.params.get("llvm_bin", "/usr/lib/llvm-22/bin")
config.test_exec_root = os.path.join(build_dir, "test", "lit")
config.environment["PATH"] = os.pathsep.join(
    [os.path.join(build_dir, "tools"), llvm_bin, config.environment.get("PATH", os.environ.get("PATH", ""))])

# Tools run by the tests keep their compile cache in the build tree.
config.environment["KILN_CACHE_DIR"] = os.path.join(build_dir, "test-cache")

# CPU features some lowerings depend on (REQUIRES: avx512f, avx512bf16, amx).
try:
    with open("/proc/cpuinfo") as f:
        flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
except OSError:
    flags = []
if "avx512f" in flags:
    config.available_features.add("avx512f")
if "avx512_bf16" in flags:
    config.available_features.add("avx512bf16")
if "amx_bf16" in flags and "amx_tile" in flags:
    config.available_features.add("amx")
