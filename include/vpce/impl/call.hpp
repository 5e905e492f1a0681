#pragma once
/// \file call.hpp
/// \brief What a call writes: the one enum shared by CrossEntropy, its kernels and LinearCrossEntropy.
/// Kernel-free (the public headers include it).

namespace vpce::impl {

/// loss: the per-row loss and lse only (forward() in recompute mode); stash: also the softmax stash
/// (forward() in stash mode); grad: also the gradient (loss_and_grad(), backward()).
enum class Write { loss, stash, grad };

}  // namespace vpce::impl
