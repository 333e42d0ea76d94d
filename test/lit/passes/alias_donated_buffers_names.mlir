// donate= names an argument by kind where a bare name is ambiguous: a
// parameter and a user input both called "weight" (issue 24, item 7).
// state:NAME takes the parameter, input:NAME the user input, a bare name
// that names both is refused, as hloalias.compile's donate= refuses it.
//
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=state:weight inferred=false})' --print-alias-report 2>&1 | filecheck %s --check-prefix=STATE
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=input:weight inferred=false})' --print-alias-report 2>&1 | filecheck %s --check-prefix=INPUT
// A rerun decides the same (the request is recorded in the IR as the donation).
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=input:weight inferred=false},alias-donated-buffers{inferred=false})' --print-alias-report 2>&1 | filecheck %s --check-prefix=INPUT
//
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=weight})' 2>&1 | filecheck %s --check-prefix=ERR-AMBIGUOUS
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=input:bias})' 2>&1 | filecheck %s --check-prefix=ERR-KIND

func.func @main(%arg0: tensor<4xf32> {hloalias.kind = "parameter", hloalias.name = "weight"}, %arg1: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "bias"}, %arg2: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "weight"}) -> (tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.add %arg0, %arg2 : tensor<4xf32>
  %1 = stablehlo.add %0, %arg1 : tensor<4xf32>
  return %1 : tensor<4xf32>
}

// STATE:      alias-donated-buffers: 1 aliases, 16 bytes saved
// STATE-NEXT:   alias   arg 0 'weight' -> result 0  16 bytes  (explicit)
// STATE-LABEL: func.func @main(
// STATE-SAME:    %arg0: tensor<4xf32> {hloalias.donation = "explicit", hloalias.kind = "parameter", hloalias.name = "weight", tf.aliasing_output = 0 : i32},
// STATE-SAME:    %arg2: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "weight"})

// INPUT:      alias-donated-buffers: 1 aliases, 16 bytes saved
// INPUT-NEXT:   alias   arg 2 'weight' -> result 0  16 bytes  (explicit)
// INPUT-LABEL: func.func @main(
// INPUT-SAME:    %arg0: tensor<4xf32> {hloalias.kind = "parameter", hloalias.name = "weight"},
// INPUT-SAME:    %arg2: tensor<4xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "weight", tf.aliasing_output = 0 : i32})

// ERR-AMBIGUOUS-NOT: Traceback
// ERR-AMBIGUOUS: error: alias-donated-buffers: donate name 'weight' is ambiguous: it is user input 'weight' (input:weight, {{.*}}) and parameter 'weight' (state:weight, {{.*}})
// ERR-AMBIGUOUS-NOT: module

// ERR-KIND-NOT: Traceback
// ERR-KIND: error: alias-donated-buffers: donate names unknown user input 'bias' (known: weight)
// ERR-KIND-NOT: module
