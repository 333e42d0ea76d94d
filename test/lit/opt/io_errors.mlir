// Input that is not UTF-8 and an output path in a missing directory are
// diagnostics with exit status 1, never a Python traceback.
// RUN: %PYTHON -c "import sys; open(sys.argv[1], 'wb').write(b'func.func @main() {\n  return\n}\n// caf\xe9\n')" %t.latin1.mlir
// RUN: not hloalias-opt %t.latin1.mlir 2>&1 | filecheck %s --check-prefix=UTF8
// UTF8-NOT: Traceback
// UTF8: latin1.mlir:4:7: error: input is not UTF-8 text (byte 0xe9)
// RUN: not hloalias-opt %s -o %t.missing-dir/out.mlir 2>&1 | filecheck %s --check-prefix=OUT
// OUT-NOT: Traceback
// OUT: hloalias-opt: cannot write '{{.*}}missing-dir/out.mlir': No such file or directory

func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  return %arg0 : tensor<4xf32>
}
