/// \file command.cpp
/// \brief What the computing commands share around their skeleton (command.hpp): the input, the partition, the
/// attributes every output carries.

#include "command.hpp"

#include <cstdlib>
#include <sstream>
#include <string>

#include "vpce/config.hpp"
#include "vpce/options.hpp"

namespace vpce::tool {

std::string number_text(double x) {
  for (int prec = 1; prec <= 17; ++prec) {
    std::ostringstream s;
    s.precision(prec);
    s << x;
    if (std::strtod(s.str().c_str(), nullptr) == x) return s.str();
  }
  return std::to_string(x);
}

std::string ranks_text(const Communicator& comm) {
  return std::to_string(comm.size()) + (comm.size() > 1 ? " ranks" : " rank");
}

void write_common_attributes(H5File& out, const Communicator& comm, const LossOptions& cfg, std::int64_t n_valid) {
  out.write_attribute("vpce_version", VPCE_VERSION_STRING);
  out.write_attribute("input", cfg.input);
  out.write_attribute("strategy", to_string(cfg.strategy));
  out.write_attribute("ranks", std::to_string(comm.size()));
  out.write_attribute("reduction", to_string(cfg.reduction));
  out.write_attribute("ignore_index", std::to_string(cfg.ignore_index));
  out.write_attribute("label_smoothing", number_text(cfg.label_smoothing));
  out.write_attribute("z_loss", number_text(cfg.z_loss));
  out.write_attribute("logit_scale", number_text(cfg.logit_scale));
  out.write_attribute("softcap", number_text(cfg.softcap));
  out.write_attribute("num_valid", std::to_string(n_valid));
}

H5File open_input(const Communicator& comm, const LossOptions& cfg) {
  check_fault_setting();
  check_writable(comm, cfg.output, "output");
  return H5File::open_read(cfg.input, comm);
}

VocabPartition partition_of(const Communicator& comm, const LossOptions& cfg, std::int64_t v) {
  return cfg.have_partition ? VocabPartition::from_sizes(cfg.partition, comm, v) : VocabPartition::even(v, comm);
}

}  // namespace vpce::tool
