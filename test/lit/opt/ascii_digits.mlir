// Indices in pass options are ASCII digits only.  Python's str.isdigit and
// \d accept other scripts' digits ('٣' ARABIC-INDIC THREE, '३' DEVANAGARI
// THREE) and int() reads them as 3: donate=٣ used to donate argument 3.
// Every such option is now an error naming what was written.
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=٣})' 2>&1 | filecheck %s --check-prefix=DONATE
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=a,३})' 2>&1 | filecheck %s --check-prefix=DONATE-DEVA
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results{dead-results=١})' 2>&1 | filecheck %s --check-prefix=DEAD
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results{dead-results=0,²})' 2>&1 | filecheck %s --check-prefix=DEAD-SUP
// The same option in ASCII digits donates argument 3 ('d').
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=3})' | filecheck %s --check-prefix=ASCII

// DONATE: error: alias-donated-buffers: donate names unknown argument '٣' (arguments: a, b, c, d)
// DONATE-DEVA: error: alias-donated-buffers: donate names unknown argument '३' (arguments: a, b, c, d)
// DEAD: error: eliminate-view-results: option 'dead-results' expects a comma-separated list of integers, got '١'
// DEAD-SUP: error: eliminate-view-results: option 'dead-results' expects a comma-separated list of integers, got '0,²'
// ASCII: hloalias.name = "c"}, %arg3: tensor<4xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "d", tf.aliasing_output = 0 : i32}

func.func @main(%a: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "a"}, %b: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "b"}, %c: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "c"}, %d: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "d"}) -> tensor<4xf32> {
  %n = stablehlo.add %d, %d : tensor<4xf32>
  return %n : tensor<4xf32>
}
