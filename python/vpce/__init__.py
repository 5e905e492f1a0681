"""vpce: softmax cross entropy over a vocabulary split across MPI ranks (Megatron-LM's vocab-parallel cross
entropy), on Kokkos.

Every rank holds the logits of its own slice of the vocabulary, ``[..., V_local]``, and the same global target
ids; ``CrossEntropy`` gives each token's loss over the whole vocabulary and this rank's slice of the gradient,
with one MPI all-reduce per call. Arrays are any DLPack array (numpy, PyTorch, ...) and are never copied.

    from mpi4py import MPI
    import numpy as np, vpce

    ce = vpce.CrossEntropy(MPI.COMM_WORLD, local_vocab=1000, label_smoothing=0.1)
    loss, grad = ce.loss_and_grad(logits, targets)      # logits: float32 [N, 1000], targets: int64 [N]

Errors raise ``vpce.Error`` with the same message on every rank. Kokkos is initialised on first use (unless
the program already did) and finalised at exit. ``vpce.torch`` has a drop-in for Megatron's
``vocab_parallel_cross_entropy``.
"""
import atexit as _atexit
import weakref as _weakref

from . import _vpce
from ._vpce import Error, has_device

__all__ = ["CrossEntropy", "Error", "has_device"]

_DTYPES = {"float32": 0, "float64": 1, "bfloat16": 2, "float16": 3}
_STRATEGIES = {"fused": 0, "seed": 1}
_MODES = {"recompute": 0, "stash_softmax": 1}
_REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}
_NON_FINITE = {"error": True, "propagate": False}
_OPTIONS = {  # name: (default, converter)
    "strategy": ("fused", _STRATEGIES),
    "mode": ("recompute", _MODES),
    "non_finite": ("error", _NON_FINITE),
    "ignore_index": (-100, int),
    "reduction": ("none", _REDUCTIONS),
    "label_smoothing": (0.0, float),
    "z_loss": (0.0, float),
    "logit_scale": (1.0, float),
    "softcap": (0.0, float),
    "grad_in_logits_type": (False, bool),
    "entropy": (False, bool),
    "entropy_weight": (0.0, float),
    "probability_targets": (False, bool),
}

_live = _weakref.WeakSet()  # every open CrossEntropy: closed before Kokkos is finalised at exit
_initialized = False


def _initialize():
    global _initialized
    if not _initialized:
        _vpce.initialize()
        _atexit.register(_finalize)  # runs before mpi4py finalises MPI (its hook is registered at C level)
        _initialized = True


def _finalize():
    for ce in list(_live):
        ce.close()
    _vpce.finalize()


def _agree(comm, error):
    """Raises Error on every rank when some rank found one (the lowest such rank's message)."""
    errors = comm.allgather(error)
    for rank, e in enumerate(errors):
        if e:
            everywhere = all(errors)
            raise Error("vpce: " + e + ("" if everywhere else f" (found on rank {rank})"))


def _convert(name, value):
    default, conv = _OPTIONS[name]
    if isinstance(conv, dict):
        if value not in conv:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, conv))}, not {value!r}")
        return conv[value]
    return conv(value)


def _allocator(like):
    """allocate(shape, dtype name): uninitialised arrays from the framework and device of `like` (which is
    not kept)."""
    fw = type(like).__module__.split(".")[0]
    if fw == "torch":
        import torch

        device = like.device
        return lambda shape, dtype: torch.empty(shape, dtype=getattr(torch, dtype), device=device)
    if hasattr(like, "__array_namespace__") and fw != "numpy":
        xp, device = like.__array_namespace__(), like.device
        return lambda shape, dtype: xp.empty(shape, dtype=getattr(xp, dtype), device=device)
    import numpy

    return lambda shape, dtype: numpy.empty(shape, dtype=dtype)


class CrossEntropy:
    """Softmax cross entropy over the vocabulary split across the ranks of an mpi4py communicator.

    comm: the tensor-parallel communicator (mpi4py); collective calls are made by all of its ranks.
    local_vocab: this rank's number of vocabulary entries (ranks own consecutive slices, in rank order; an
        uneven split, or an empty slice, is fine); or sizes: every rank's, the same list on every rank.
    dtype: the logits' type, "float32", "float64", "bfloat16" or "float16". The loss, lse and incoming
        gradients are float64 for float64 logits and float32 otherwise; the gradient too, unless
        grad_in_logits_type=True (16-bit logits: the gradient in their own type, which allows it in place).
    device: "cpu" (host arrays) or "cuda" (arrays in the memory of the GPU Kokkos runs on; a build of vpce on a
        CUDA Kokkos, vpce.has_device()). Every array of every call must be there, and ready: vpce runs on
        Kokkos' stream, so synchronise the stream that produced them first (vpce.torch does); its outputs are
        complete when a call returns.
    Options (vpce::Options, docs/design.md): strategy ("fused", "seed"), mode ("recompute",
        "stash_softmax"), non_finite ("error", "propagate"), ignore_index (-100), reduction ("none", "sum",
        "mean"), label_smoothing, z_loss, logit_scale, softcap, entropy, entropy_weight, probability_targets
        (the calls' targets are then probabilities: an array of the logits' type and shape, each row >= 0
        summing to 1 over the global vocabulary).
    """

    def __init__(self, comm, local_vocab=None, sizes=None, dtype="float32", device="cpu", **options):
        error = ""
        try:
            if (local_vocab is None) == (sizes is None):
                raise ValueError("give one of local_vocab and sizes")
            if sizes is not None:
                sizes = [int(s) for s in sizes]
                if len(sizes) != comm.Get_size():
                    raise ValueError(f"sizes has {len(sizes)} entries for {comm.Get_size()} ranks")
                local_vocab = sizes[comm.Get_rank()]
            if device not in ("cpu", "cuda"):
                raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
            if dtype not in _DTYPES:
                raise ValueError(f"dtype must be one of {', '.join(map(repr, _DTYPES))}, not {dtype!r}")
            unknown = sorted(set(options) - set(_OPTIONS))
            if unknown:
                raise ValueError(f"unknown option(s): {', '.join(unknown)} (known: {', '.join(_OPTIONS)})")
            args = {name: _convert(name, options.get(name, default)) for name, (default, _) in _OPTIONS.items()}
        except (ValueError, TypeError) as e:
            error = str(e)
        _agree(comm, error)
        if sizes is not None:  # the same list everywhere: each rank checks against the others' sizes
            _agree(comm, "" if comm.allgather(sizes) == [sizes] * comm.Get_size() else "sizes differ between ranks")
        _initialize()
        self.dtype, self.device = dtype, device
        self.options = {name: options.get(name, default) for name, (default, _) in _OPTIONS.items()}
        self._ce = _vpce.CrossEntropy(
            comm.py2f(), int(local_vocab), _DTYPES[dtype], args["strategy"], args["mode"], args["non_finite"],
            args["ignore_index"], args["reduction"], args["label_smoothing"], args["z_loss"], args["logit_scale"],
            args["softcap"], args["grad_in_logits_type"], args["entropy"], args["entropy_weight"],
            args["probability_targets"], device == "cuda")
        self.begin, self.local_vocab, self.vocab = self._ce.partition()
        self._loss_type = "float64" if dtype == "float64" else "float32"
        self._grad_type = dtype if args["grad_in_logits_type"] and dtype in ("bfloat16", "float16") else self._loss_type
        self._alloc = None  # allocates like the last call's logits (backward's gradient, lse)
        self._shape = None
        self.generation = 0  # counts the calls that replace what backward uses
        _live.add(self)

    def close(self):
        """Frees the library's buffers (also done at exit)."""
        self._ce.close()

    def forward(self, logits, targets, out=None):
        """Per-token losses (shape of `targets`; reduction none), keeping what backward needs (recompute mode:
        the logits must stay unchanged until then). Collective."""
        alloc = _allocator(logits)
        loss = out if out is not None else alloc(self._loss_shape(targets), self._loss_type)
        self.generation += 1
        self._ce.forward(logits, targets, loss)
        self._alloc, self._shape = alloc, tuple(logits.shape)
        return loss

    def backward(self, grad_loss=1.0, out=None):
        """This rank's gradient of the last forward with respect to its logits: of sum_i grad_loss[i] * loss_i
        for an array grad_loss (reduction none), or of grad_loss * (the sum, or the mean, of the losses) for a
        number. `out` may be the logits themselves (same dtype). No communication."""
        if self._alloc is None:
            raise Error("vpce: backward() before any forward()")
        grad = out if out is not None else self._alloc(self._shape, self._grad_type)
        if isinstance(grad_loss, (int, float)):
            self._ce.backward(None, float(grad_loss), grad)
        else:
            self._ce.backward(grad_loss, 1.0, grad)
        return grad

    def loss_and_grad(self, logits, targets, grad=None, grad_loss=1.0, loss=None):
        """(per-token losses, gradient) in one call: the training step. grad may be the logits themselves
        (in place: float32/float64 logits, or 16-bit ones with grad_in_logits_type). Collective."""
        alloc = _allocator(logits)
        loss = loss if loss is not None else alloc(self._loss_shape(targets), self._loss_type)
        grad = grad if grad is not None else alloc(tuple(logits.shape), self._grad_type)
        self.generation += 1
        if isinstance(grad_loss, (int, float)):
            self._ce.loss_and_grad(logits, targets, loss, grad, None, float(grad_loss))
        else:
            self._ce.loss_and_grad(logits, targets, loss, grad, grad_loss, 1.0)
        self._alloc, self._shape = alloc, tuple(logits.shape)
        return loss, grad

    def _loss_shape(self, targets):
        return tuple(targets.shape[:-1] if self.options["probability_targets"] else targets.shape)

    def _row_output(self, what):
        if self._alloc is None:
            raise Error(f"vpce: {what} before any call")
        out = self._alloc((self._ce.rows(),), self._loss_type)
        self._ce.row_output(what, out)
        return out

    @property
    def lse(self):
        """log(sum_j exp(x_j)) over the global vocabulary, per row of the last call (a flat array)."""
        return self._row_output("lse")

    @property
    def entropy(self):
        """The softmax's entropy per row of the last call (needs entropy=True or an entropy_weight)."""
        return self._row_output("entropy")

    @property
    def logprob(self):
        """The target's log-softmax per row of the last call (0 for ignored rows)."""
        return self._row_output("logprob")

    @property
    def z_loss_terms(self):
        """z_loss * lse^2 per row of the last call, the part of the loss the z-loss adds (0 for ignored rows)."""
        return self._row_output("z_loss")

    def set_class_weights(self, weights):
        """PyTorch's `weight`: this rank's V_local values for its own columns (the loss's type), finite and >= 0;
        the mean then divides by the valid targets' weights. None removes them (on every rank). Collective."""
        self._ce.set_class_weights(weights)

    @property
    def num_valid(self):
        """The number of rows of the last call whose target is not ignore_index."""
        return self._ce.num_valid()

    @property
    def reduced_loss(self):
        """The last call's loss reduced as `reduction` says (the sum for reduction none), a float."""
        return self._ce.reduced_loss()
