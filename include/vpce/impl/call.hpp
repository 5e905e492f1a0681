#pragma once
/// \file call.hpp
/// \brief What a call writes: the enums shared by CrossEntropy, its kernels and LinearCrossEntropy.
/// Kernel-free (the public headers include it).

namespace vpce::impl {

/// loss: the per-row loss and lse only (forward() in recompute mode); stash: also the softmax stash
/// (forward() in stash mode); grad: also the gradient (loss_and_grad(), backward()).
enum class Write { loss, stash, grad };

/// The per-row outputs computed from a call's merged records when asked (CrossEntropy::entropy() etc.).
enum class RowOutput { entropy, logprob, z_loss };

}  // namespace vpce::impl
