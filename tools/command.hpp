#pragma once
/// \file command.hpp
/// \brief What the computing commands (`vpce loss`, `vpce linear`) share around the computation: type names,
/// the HDF5 types of their outputs, the attributes every output carries.

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "h5io.hpp"
#include "loss_input.hpp"
#include "vpce/communicator.hpp"
#include "vpce/half.hpp"

namespace vpce::tool {

/// Shortest text that reads back as the same double ("0.1", "1e-05").
std::string number_text(double x);

/// The name of an element type in messages and attributes.
template <class S>
const char* dtype_name() {
  if constexpr (std::is_same_v<S, float>)
    return "float32";
  else if constexpr (std::is_same_v<S, double>)
    return "float64";
  else if constexpr (std::is_same_v<S, bfloat16>)
    return "bfloat16";
  else
    return "float16";
}

/// The file type of an output dataset of S (16-bit types: their bits, tagged with a dtype attribute).
template <class S>
hid_t little_endian_type() {
  if constexpr (std::is_same_v<S, float>)
    return H5T_IEEE_F32LE;
  else if constexpr (std::is_same_v<S, double>)
    return H5T_IEEE_F64LE;
  else
    return H5T_STD_U16LE;
}

/// The root attributes of an output: vpce_version, input, strategy, ranks, reduction, ignore_index,
/// label_smoothing, z_loss, logit_scale, softcap, num_valid. Collective.
void write_common_attributes(H5File& out, const Communicator& comm, const LossOptions& cfg, std::int64_t n_valid);

}  // namespace vpce::tool
