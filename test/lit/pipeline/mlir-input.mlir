// kiln-opt also takes MLIR at the linalg stage.
// RUN: kiln-opt --emit=llvm %s | FileCheck %s
func.func @kiln_main(%a: memref<16xf32>, %o: memref<16xf32>) {
  %t = bufferization.to_tensor %a restrict : memref<16xf32> to tensor<16xf32>
  %e = tensor.empty() : tensor<16xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%t : tensor<16xf32>) outs(%e : tensor<16xf32>) {
  ^bb0(%x: f32, %y: f32):
    %n = arith.negf %x : f32
    linalg.yield %n : f32
  } -> tensor<16xf32>
  bufferization.materialize_in_destination %r in restrict writable %o : (tensor<16xf32>, memref<16xf32>) -> ()
  return
}
// CHECK: llvm.func @kiln_main
// CHECK: llvm.fneg {{.*}} : vector<16xf32>
