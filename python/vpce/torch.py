"""vpce.torch: a drop-in for Megatron-LM's ``vocab_parallel_cross_entropy``.

    from vpce.torch import vocab_parallel_cross_entropy
    loss = vocab_parallel_cross_entropy(logits, target, tp_comm)   # logits [..., V_local], target [...]

Megatron's calling convention (this rank's logits ``[..., V_local]`` for its consecutive slice of the vocabulary,
global target ids, per-token losses back, ``label_smoothing``), with the tensor-parallel group given as an mpi4py
communicator (default: the one set with ``set_default_comm``, else ``MPI.COMM_WORLD``). The logits are not
modified (Megatron's function overwrites them with the softmax) unless ``inplace=True`` asks for the gradient in
their buffer. bfloat16 and float16 logits get their gradient in their own type, the loss in float32.

mode="recompute" (default): the forward keeps only lse per row (and holds on to the logits, which autograd keeps
anyway); the backward recomputes the softmax from them: one read and one write of the logits' size.
mode="stash_softmax": the forward also writes the gradient (an N x V_local tensor kept until the backward,
as Megatron keeps the softmax); the backward scales it by the incoming gradient (into a new tensor).
Other options of vpce.CrossEntropy (ignore_index, z_loss, logit_scale, softcap, strategy, non_finite,
entropy_weight) pass through by name; the reduction is always per token (reduce the result yourself).
"""
import torch

from . import CrossEntropy

__all__ = ["vocab_parallel_cross_entropy", "set_default_comm"]

_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_default_comm = None
_handles = {}  # (id(comm), V_local, dtype, device, options) -> (comm, CrossEntropy): one per configuration


def set_default_comm(comm):
    """The communicator used when none is passed (e.g. the tensor-parallel group's, once, after set-up)."""
    global _default_comm
    _default_comm = comm


def _handle(comm, v_local, dtype, device, options):
    key = (id(comm), v_local, dtype, device, options)
    entry = _handles.get(key)
    if entry is None:  # collective: every rank meets the same configurations in the same order
        entry = _handles[key] = (comm, CrossEntropy(comm, local_vocab=v_local, dtype=dtype, device=device,
                                                    grad_in_logits_type=True, **dict(options)))
    return entry[1]


def _ready(x):
    """vpce runs on its own (Kokkos') stream and takes arrays as they are: PyTorch's queued work on a CUDA tensor
    must be done first (vpce's outputs are complete when its call returns)."""
    if x.is_cuda:
        torch.cuda.current_stream(x.device).synchronize()


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, comm, inplace, options):
        if logits.dtype not in _DTYPES:
            raise TypeError(f"vocab_parallel_cross_entropy: logits of {logits.dtype} (float32, float64, bfloat16 "
                            "or float16 expected)")
        device = "cuda" if logits.is_cuda else "cpu"
        ce = _handle(comm, logits.shape[-1], _DTYPES[logits.dtype], device, options)
        x = logits.contiguous()  # a view when it already is: no copy
        if inplace and x.data_ptr() != logits.data_ptr():
            raise ValueError("vocab_parallel_cross_entropy(inplace=True) needs contiguous logits")
        t = target.to(torch.int64).contiguous()
        _ready(x)
        ctx.ce, ctx.inplace, ctx.stash = ce, inplace, dict(options).get("mode") == "stash_softmax"
        if ctx.stash:
            loss, grad = ce.loss_and_grad(x, t, grad=x if inplace else None)
            if inplace:  # the logits now hold the gradient (as Megatron's hold the softmax): kept unversioned
                ctx.grad = grad
            else:
                ctx.save_for_backward(grad)
        else:
            loss = ce.forward(x, t)
            ctx.save_for_backward(x, t)
            ctx.generation = ce.generation
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        ce = ctx.ce
        g = grad_output.to(torch.float64 if ce.dtype == "float64" else torch.float32).contiguous()
        _ready(g)
        if ctx.inplace:
            if getattr(ctx, "done", False):
                raise RuntimeError("vocab_parallel_cross_entropy(inplace=True): a second backward through the "
                                   "same call (the logits' buffer already holds the gradient)")
            ctx.done = True
        if ctx.stash:
            grad = ctx.grad if ctx.inplace else ctx.saved_tensors[0]
            if bool((g == 1).all()):  # e.g. loss.sum().backward(): the stored gradient is the answer
                return (grad if ctx.inplace else grad.clone()), None, None, None, None
            # Otherwise scaled: in place into the logits' buffer, or into a new tensor (a graph kept for a
            # second backward, retain_graph, still holds the stored one unscaled).
            return (grad.mul_(g.unsqueeze(-1)) if ctx.inplace else grad * g.unsqueeze(-1)), None, None, None, None
        x, t = ctx.saved_tensors
        if ce.generation != ctx.generation:  # another forward used the handle since: this one's state again
            ce.forward(x, t)
        return ce.backward(g, out=x if ctx.inplace else None), None, None, None, None


def vocab_parallel_cross_entropy(vocab_parallel_logits, target, comm=None, label_smoothing=0.0, inplace=False,
                                 **options):
    """Per-token cross entropy of logits split over the vocabulary across the ranks of `comm`.

    vocab_parallel_logits: [..., V_local] (this rank's slice; ranks own consecutive slices in rank order, any
    sizes); target: [...] global ids (int64, or any integer type), the same on every rank. Returns [...] losses
    (float32; float64 for float64 logits). Collective over `comm` (forward and, after another forward on the
    same configuration, backward).

    inplace=True: the gradient is written over the logits' own buffer and returned as their gradient, as
    Megatron's function does (no N x V_local tensor is allocated: a fresh one costs its page faults on every
    step). Only when nothing else reads the logits after the loss; with mode="stash_softmax" the logits are
    overwritten in the forward already. One backward per call."""
    if comm is None:
        if _default_comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        else:
            comm = _default_comm
    if isinstance(comm, (int, float)):
        raise TypeError("vocab_parallel_cross_entropy(logits, target, comm, label_smoothing=...): the third "
                        "argument is the mpi4py communicator; pass label_smoothing by name")
    if "reduction" in options:
        raise TypeError("vocab_parallel_cross_entropy returns per-token losses: reduce them yourself")
    if options.get("probability_targets"):
        raise TypeError("vocab_parallel_cross_entropy takes target ids (vpce.CrossEntropy takes probabilities)")
    opts = tuple(sorted(dict(options, label_smoothing=float(label_smoothing)).items()))
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target, comm, bool(inplace), opts)
