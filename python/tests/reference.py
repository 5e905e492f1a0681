"""A float64 PyTorch reference over the gathered vocabulary: the loss of vpce's options (docs/design.md) written
out in full, and its gradient by autograd."""
import numpy as np
import torch


def gather_columns(comm, local):
    """The ranks' [N, V_local] blocks side by side: [N, V]."""
    return np.concatenate(comm.allgather(np.asarray(local, dtype=np.float64)), axis=1)


def reference(z, targets, ignore_index=-100, reduction="none", label_smoothing=0.0, z_loss=0.0, logit_scale=1.0,
              softcap=0.0, entropy_weight=0.0, grad_loss=None):
    """(per-token losses [N], reduced loss, gradient [N, V] of sum(grad_loss * loss) or of the reduced loss)."""
    z = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    t = torch.as_tensor(np.asarray(targets), dtype=torch.int64)
    x = softcap * torch.tanh(logit_scale * z / softcap) if softcap > 0 else logit_scale * z
    lse = torch.logsumexp(x, dim=1)
    valid = t != ignore_index
    xt = torch.gather(x, 1, torch.where(valid, t, 0)[:, None])[:, 0]
    p = torch.softmax(x, dim=1)
    entropy = lse - (p * x).sum(dim=1)
    loss = lse - (1 - label_smoothing) * xt - label_smoothing * x.mean(dim=1) + z_loss * lse**2
    loss = loss + entropy_weight * entropy
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    if reduction == "none":
        reduced = loss.sum()
        objective = (loss * torch.as_tensor(np.asarray(grad_loss), dtype=torch.float64)).sum() if grad_loss is not None \
            else reduced
    else:
        count = int(valid.sum())
        reduced = loss.sum() / count if reduction == "mean" and count > 0 else loss.sum()
        objective = reduced
    objective.backward()
    return loss.detach().numpy(), float(reduced), z.grad.numpy()
