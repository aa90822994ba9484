// What every single-node CPU kernel of mlx-core does before its work runs: check that its
// inputs are row-contiguous (callers pass mx::contiguous copies), allocate the output, register
// both with the CPU command encoder, and keep weak handles for the dispatched closure.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

namespace mlxr {

inline std::vector<mlx::core::array> hold_row_inputs(const std::vector<mlx::core::array>& inputs,
                                                     mlx::core::array& out, mlx::core::Stream stream,
                                                     const char* kernel) {
  namespace mx = mlx::core;
  for (const auto& a : inputs) {
    if (!a.flags().row_contiguous) throw std::invalid_argument(std::string(kernel) + ": inputs must be row-contiguous");
  }
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream);
  std::vector<mx::array> held;
  for (const auto& a : inputs) {
    enc.set_input_array(a);
    held.push_back(mx::array::unsafe_weak_copy(a));
  }
  enc.set_output_array(out);
  return held;
}

}  // namespace mlxr
