// Options of alias-donated-buffers apply to every chunk of a file, so each
// RUN line below runs the pass with one option set on the module of this
// file: two mutated arguments (parameter w, buffer b), a user input x and a
// user input y that is an explicit donor in the IR (jax.buffer_donor).
//
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=x,0})' --print-alias-report -o %t.donate 2>&1 | filecheck %s --check-prefix=DONATE-REPORT
// RUN: filecheck %s --check-prefix=DONATE --input-file=%t.donate
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{exclude-kinds=parameter,user_input})' --print-alias-report -o %t.exclude 2>&1 | filecheck %s --check-prefix=EXCLUDE-REPORT
// RUN: filecheck %s --check-prefix=EXCLUDE --input-file=%t.exclude
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{inferred=false})' --print-alias-report -o %t.noinfer 2>&1 | filecheck %s --check-prefix=NOINFER-REPORT
// RUN: filecheck %s --check-prefix=NOINFER --input-file=%t.noinfer
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{explicit=false donate=x})' --print-alias-report -o %t.noexplicit 2>&1 | filecheck %s --check-prefix=NOEXPLICIT-REPORT
// RUN: filecheck %s --check-prefix=NOEXPLICIT --input-file=%t.noexplicit
//
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=z})' 2>&1 | filecheck %s --check-prefix=ERR-NAME
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=x,2})' 2>&1 | filecheck %s --check-prefix=ERR-TWICE
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{exclude-kinds=parameter,weights})' 2>&1 | filecheck %s --check-prefix=ERR-KIND

func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "parameter", hloalias.name = "w"}, %arg1: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "b"}, %arg2: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x"}, %arg3: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "y", jax.buffer_donor = true}) -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<8xf32> {hloalias.mutates = 1 : i64, hloalias.role = "mutation"}, tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<8xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.add %arg0, %arg2 : tensor<8xf32>
  %1 = stablehlo.add %arg1, %arg3 : tensor<8xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<8xf32>
  %3 = stablehlo.subtract %0, %1 : tensor<8xf32>
  return %0, %1, %2, %3 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}

// donate= by name (x) and by index (0, which is w): w is also mutated, so
// its origin is "both"; b is inferred; the explicit donors x and y (from the
// IR) take the free results 2 and 3 in argument order.
// DONATE-REPORT:      alias-donated-buffers: 4 aliases, 128 bytes saved
// DONATE-REPORT-NEXT:   alias   arg 0 'w' -> result 0  32 bytes  (both)
// DONATE-REPORT-NEXT:   alias   arg 1 'b' -> result 1  32 bytes  (inferred)
// DONATE-REPORT-NEXT:   alias   arg 2 'x' -> result 2  32 bytes  (explicit)
// DONATE-REPORT-NEXT:   alias   arg 3 'y' -> result 3  32 bytes  (explicit)
// DONATE-REPORT-NOT:    unused
// DONATE-LABEL: func.func @main(
// DONATE-SAME:    %arg0: tensor<8xf32> {hloalias.donation = "both", hloalias.kind = "parameter", hloalias.name = "w", tf.aliasing_output = 0 : i32},
// DONATE-SAME:    %arg1: tensor<8xf32> {hloalias.donation = "inferred", hloalias.kind = "buffer", hloalias.name = "b", tf.aliasing_output = 1 : i32},
// DONATE-SAME:    %arg2: tensor<8xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "x", tf.aliasing_output = 2 : i32},
// DONATE-SAME:    %arg3: tensor<8xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "y", tf.aliasing_output = 3 : i32})

// Excluded kinds are never donated, whether inferred (w) or explicit (y, whose
// jax.buffer_donor is dropped); b still aliases its new value.
// EXCLUDE-REPORT:      alias-donated-buffers: 1 aliases, 32 bytes saved
// EXCLUDE-REPORT-NEXT:   alias   arg 1 'b' -> result 1  32 bytes  (inferred)
// EXCLUDE-REPORT-NEXT:   unused  arg 0 'w' (inferred): arguments of kind 'parameter' are excluded from donation
// EXCLUDE-REPORT-NEXT:   unused  arg 3 'y' (explicit): arguments of kind 'user_input' are excluded from donation
// EXCLUDE-LABEL: func.func @main(
// EXCLUDE-SAME:    %arg0: tensor<8xf32> {hloalias.donation = "inferred", hloalias.kind = "parameter", hloalias.name = "w", hloalias.unused_donation = "arguments of kind 'parameter' are excluded from donation"},
// EXCLUDE-SAME:    %arg1: tensor<8xf32> {hloalias.donation = "inferred", hloalias.kind = "buffer", hloalias.name = "b", tf.aliasing_output = 1 : i32},
// EXCLUDE-SAME:    %arg2: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x"},
// EXCLUDE-SAME:    %arg3: tensor<8xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "y", hloalias.unused_donation = "arguments of kind 'user_input' are excluded from donation"})

// inferred=false: mutated arguments are not aliased, so the explicit donor y
// takes the first free result of its type, result 0.
// NOINFER-REPORT:      alias-donated-buffers: 1 aliases, 32 bytes saved
// NOINFER-REPORT-NEXT:   alias   arg 3 'y' -> result 0  32 bytes  (explicit)
// NOINFER-REPORT-NOT:    unused
// NOINFER-LABEL: func.func @main(
// NOINFER-SAME:    %arg0: tensor<8xf32> {hloalias.kind = "parameter", hloalias.name = "w"},
// NOINFER-SAME:    %arg1: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "b"},
// NOINFER-SAME:    %arg2: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x"},
// NOINFER-SAME:    %arg3: tensor<8xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "y", tf.aliasing_output = 0 : i32})

// explicit=false ignores donate= and jax.buffer_donor alike (the attribute
// is dropped so XLA does not reuse y either).
// NOEXPLICIT-REPORT:      alias-donated-buffers: 2 aliases, 64 bytes saved
// NOEXPLICIT-REPORT-NEXT:   alias   arg 0 'w' -> result 0  32 bytes  (inferred)
// NOEXPLICIT-REPORT-NEXT:   alias   arg 1 'b' -> result 1  32 bytes  (inferred)
// NOEXPLICIT-REPORT-NOT:    unused
// NOEXPLICIT-LABEL: func.func @main(
// NOEXPLICIT-SAME:    %arg0: tensor<8xf32> {hloalias.donation = "inferred", hloalias.kind = "parameter", hloalias.name = "w", tf.aliasing_output = 0 : i32},
// NOEXPLICIT-SAME:    %arg1: tensor<8xf32> {hloalias.donation = "inferred", hloalias.kind = "buffer", hloalias.name = "b", tf.aliasing_output = 1 : i32},
// NOEXPLICIT-SAME:    %arg2: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x"},
// NOEXPLICIT-SAME:    %arg3: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "y"})

// ERR-NAME-NOT: Traceback
// ERR-NAME: alias_donated_buffers_options.mlir:{{[0-9]+}}:1: error: alias-donated-buffers: donate names unknown argument 'z' (arguments: w, b, x, y)
// ERR-NAME-NOT: module

// x by name and by index (2) is the same argument.
// ERR-TWICE-NOT: Traceback
// ERR-TWICE: alias_donated_buffers_options.mlir:{{[0-9]+}}:1: error: alias-donated-buffers: argument 2 ('x') is donated twice
// ERR-TWICE-NOT: module

// ERR-KIND-NOT: Traceback
// ERR-KIND: alias_donated_buffers_options.mlir:{{[0-9]+}}:1: error: alias-donated-buffers: exclude-kinds has unknown kind 'weights' (kinds: parameter, buffer, constant, user_input, rng_key)
// ERR-KIND-NOT: module
