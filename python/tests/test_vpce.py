"""vpce.CrossEntropy against a float64 PyTorch reference over the gathered vocabulary, at any rank count."""
import numpy as np
import pytest
import torch

import vpce
from reference import reference


def partition(comm, kind):
    """Every rank's V_local: even, uneven, or with an empty slice (rank 0's, when there are several ranks)."""
    p = comm.Get_size()
    return {"even": [7] * p, "uneven": [3 + 5 * r for r in range(p)],
            "empty": [0, 9, 4, 6][:p] if p > 1 else [5]}[kind]


def problem(comm, sizes, n=11, seed=0, ignore_index=-100):
    """Global logits [n, V] (the same on every rank), this rank's columns, and targets with one ignored row."""
    rng = np.random.default_rng(seed)
    vocab = sum(sizes)
    z = rng.normal(scale=3.0, size=(n, vocab))
    targets = rng.integers(0, vocab, size=n)
    targets[n // 2] = ignore_index
    begin = sum(sizes[: comm.Get_rank()])
    return z, np.ascontiguousarray(z[:, begin:begin + sizes[comm.Get_rank()]]), targets, begin


OPTIONS = [
    {},
    {"label_smoothing": 0.2},
    {"z_loss": 1e-2},
    {"logit_scale": 0.5},
    {"softcap": 4.0},
    {"entropy_weight": -0.3},
    {"ignore_index": 3},
    {"strategy": "seed"},
    {"mode": "stash_softmax"},
    {"non_finite": "propagate"},
    {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 6.0, "logit_scale": 1.5, "entropy_weight": 0.1,
     "strategy": "seed", "mode": "stash_softmax"},
]
REF_KEYS = ("ignore_index", "label_smoothing", "z_loss", "logit_scale", "softcap", "entropy_weight")


@pytest.mark.parametrize("kind", ["even", "uneven", "empty"])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "defaults")
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_options_float64(comm, kind, options, reduction):
    sizes = partition(comm, kind)
    ignore = options.get("ignore_index", -100)
    z, local, targets, begin = problem(comm, sizes, ignore_index=ignore)
    ce = vpce.CrossEntropy(comm, sizes=sizes, dtype="float64", reduction=reduction, **options)
    assert (ce.begin, ce.local_vocab, ce.vocab) == (begin, sizes[comm.Get_rank()], sum(sizes))
    ref = {k: v for k, v in options.items() if k in REF_KEYS}
    grad_loss = np.linspace(0.5, 1.5, len(targets)) if reduction == "none" else None
    want_loss, want_reduced, want_grad = reference(z, targets, reduction=reduction, grad_loss=grad_loss, **ref)
    cols = slice(begin, begin + sizes[comm.Get_rank()])

    # forward, then backward
    loss = ce.forward(local, targets)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-12, atol=1e-12)
    assert ce.num_valid == int((targets != ignore).sum())
    assert ce.reduced_loss == pytest.approx(want_reduced, rel=1e-12, abs=1e-12)
    grad = ce.backward(grad_loss if grad_loss is not None else 1.0)
    np.testing.assert_allclose(grad, want_grad[:, cols], rtol=1e-10, atol=1e-13)

    # loss_and_grad in one call, then again in place (the gradient in the logits' own buffer)
    loss2, grad2 = ce.loss_and_grad(local, targets, grad_loss=grad_loss if grad_loss is not None else 1.0)
    np.testing.assert_allclose(loss2, want_loss, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad2, want_grad[:, cols], rtol=1e-10, atol=1e-13)
    buf = local.copy()
    _, grad3 = ce.loss_and_grad(buf, targets, grad=buf, grad_loss=grad_loss if grad_loss is not None else 1.0)
    assert grad3 is buf
    np.testing.assert_allclose(buf, want_grad[:, cols], rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(ce.lse, torch.logsumexp(torch.tensor(z) * 0 + _transformed(z, ref), 1).numpy(),
                               rtol=1e-12)


def _transformed(z, ref):
    z = torch.tensor(z)
    s, c = ref.get("logit_scale", 1.0), ref.get("softcap", 0.0)
    return c * torch.tanh(s * z / c) if c > 0 else s * z


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["uneven", "empty"])
def test_dtypes_torch(comm, dtype, kind):
    """float32 and 16-bit logits as torch tensors, the gradient in float32 or in the logits' type (in place)."""
    sizes = partition(comm, kind)
    z, local, targets, begin = problem(comm, sizes, n=9, seed=1)
    tdtype = getattr(torch, dtype)
    x = torch.tensor(local).to(tdtype)
    zq = torch.tensor(z).to(tdtype).double().numpy()  # the reference on the values the logits hold
    want_loss, _, want_grad = reference(zq, targets, label_smoothing=0.1)
    cols = slice(begin, begin + sizes[comm.Get_rank()])
    t = torch.tensor(targets)
    ce = vpce.CrossEntropy(comm, sizes=sizes, dtype=dtype, label_smoothing=0.1)
    loss, grad = ce.loss_and_grad(x, t)
    assert loss.dtype == torch.float32 and grad.dtype == torch.float32
    torch.testing.assert_close(loss.double(), torch.tensor(want_loss), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.double(), torch.tensor(want_grad[:, cols]), rtol=1e-4, atol=1e-6)
    if dtype != "float32":
        ce16 = vpce.CrossEntropy(comm, sizes=sizes, dtype=dtype, label_smoothing=0.1, grad_in_logits_type=True)
        _, g16 = ce16.loss_and_grad(x, t, grad=x)  # in place: the gradient shares the logits' memory
        assert g16.data_ptr() == x.data_ptr() and g16.dtype == tdtype
        torch.testing.assert_close(x.double(), torch.tensor(want_grad[:, cols]), rtol=1e-2, atol=1e-3)


def test_zero_copy(comm):
    """The logits and the gradient are the caller's memory: an in-place gradient overwrites the input, and a
    given `out` is written, never a copy."""
    sizes = partition(comm, "even")
    _, local, targets, _ = problem(comm, sizes)
    x = torch.tensor(local, dtype=torch.float32)
    ptr = x.data_ptr()
    ce = vpce.CrossEntropy(comm, sizes=sizes)
    _, g = ce.loss_and_grad(x, torch.tensor(targets), grad=x)
    assert g is x and x.data_ptr() == ptr
    assert not torch.equal(x, torch.tensor(local, dtype=torch.float32))
    out = np.empty(local.shape, np.float32)
    ce.forward(local.astype(np.float32), targets)
    assert ce.backward(out=out) is out
    np.testing.assert_allclose(out, x.numpy(), rtol=1e-6, atol=1e-7)


def test_megatron_unit_test(comm):
    """Megatron-LM's own test of vocab_parallel_cross_entropy, replayed at TP = 4: each rank's logits 0..7
    repeated to 32 columns, 16 rows, targets 0, 2, ..., 30."""
    import vpce.torch

    if comm.Get_size() != 4:
        pytest.skip("Megatron's test runs at tensor-parallel size 4")
    logits = torch.arange(0, 8, dtype=torch.float32).repeat(16, 4)
    target = torch.arange(0, 32, 2)
    output = vpce.torch.vocab_parallel_cross_entropy(logits, target, comm)
    expected = torch.tensor([10.2309, 8.2309, 6.2309, 4.2309] * 4)
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-4)
    assert torch.equal(torch.round(output), torch.round(expected))  # Megatron's own assertion


class _Replicated(torch.autograd.Function):
    """Megatron's copy to the tensor-parallel region: the identity forward; the backward sums the ranks'
    gradients (each rank's covers only the columns it uses)."""

    @staticmethod
    def forward(ctx, w, comm):
        ctx.comm = comm
        return w.clone()

    @staticmethod
    def backward(ctx, g):
        from mpi4py import MPI

        return torch.from_numpy(ctx.comm.allreduce(g.numpy(), op=MPI.SUM)), None


@pytest.mark.parametrize("mode", ["recompute", "stash_softmax"])
@pytest.mark.parametrize("kind", ["uneven", "empty"])
def test_torch_autograd_gradcheck(comm, mode, kind):
    """The autograd function's gradient against finite differences (torch.autograd.gradcheck, float64). The
    input is the whole [N, V] logits matrix, the same on every rank, of which each rank uses its own columns:
    a perturbation then changes one rank's logits only, on every rank alike."""
    import vpce.torch

    sizes = partition(comm, kind)
    z, _, targets, begin = problem(comm, sizes, n=3, seed=2)
    w = torch.tensor(z, requires_grad=True)
    t = torch.tensor(targets).clamp(min=0)
    cols = slice(begin, begin + sizes[comm.Get_rank()])

    def f(w):
        x = _Replicated.apply(w, comm)[:, cols]
        return vpce.torch.vocab_parallel_cross_entropy(x, t, comm, label_smoothing=0.1, z_loss=1e-2, mode=mode)

    assert torch.autograd.gradcheck(f, (w,), eps=1e-6, atol=1e-7)


def test_torch_matches_reference(comm):
    """vpce.torch at [s, b, V_local] in bfloat16 and float32, against the reference; two forwards before their
    backwards (the second forward replaces the handle's state: the first backward recomputes its own)."""
    import vpce.torch

    sizes = partition(comm, "uneven")
    z, local, targets, begin = problem(comm, sizes, n=12, seed=3)
    cols = slice(begin, begin + sizes[comm.Get_rank()])
    t = torch.tensor(targets).clamp(min=0).reshape(3, 4)
    want_loss, _, want_grad = reference(z, t.reshape(-1).numpy(), label_smoothing=0.2)
    x1 = torch.tensor(local, dtype=torch.float32).reshape(3, 4, -1).requires_grad_()
    x2 = (torch.tensor(local, dtype=torch.float32) * 0.5).reshape(3, 4, -1).requires_grad_()
    l1 = vpce.torch.vocab_parallel_cross_entropy(x1, t, comm, label_smoothing=0.2)
    l2 = vpce.torch.vocab_parallel_cross_entropy(x2, t, comm, label_smoothing=0.2)
    (l1.sum() + 0 * l2.sum()).backward()
    assert l1.shape == (3, 4)
    torch.testing.assert_close(l1.reshape(-1).double(), torch.tensor(want_loss), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x1.grad.reshape(-1, sizes[comm.Get_rank()]).double(), torch.tensor(want_grad[:, cols]),
                               rtol=1e-4, atol=1e-6)
    xb = torch.tensor(local).to(torch.bfloat16).reshape(3, 4, -1).requires_grad_()
    lb = vpce.torch.vocab_parallel_cross_entropy(xb, t, comm, label_smoothing=0.2)
    lb.mean().backward()
    assert lb.dtype == torch.float32 and xb.grad.dtype == torch.bfloat16
    zq = torch.tensor(z).to(torch.bfloat16).double().numpy()
    want_lb, _, want_gb = reference(zq, t.reshape(-1).numpy(), label_smoothing=0.2, reduction="mean")
    torch.testing.assert_close(lb.reshape(-1).double(), torch.tensor(want_lb), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xb.grad.reshape(-1, sizes[comm.Get_rank()]).double(), torch.tensor(want_gb[:, cols]),
                               rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("mode", ["recompute", "stash_softmax"])
def test_torch_inplace(comm, mode):
    """inplace=True: the gradient in the logits' own buffer (Megatron's way), for a per-token and a uniform
    incoming gradient; a second backward through the same call is refused."""
    import vpce.torch

    sizes = partition(comm, "uneven")
    z, local, targets, begin = problem(comm, sizes, n=8, seed=4)
    cols = slice(begin, begin + sizes[comm.Get_rank()])
    t = torch.tensor(targets).clamp(min=0)
    for weights in (torch.linspace(0.5, 2.0, len(targets), dtype=torch.float32), torch.ones(len(targets))):
        want_loss, _, want_grad = reference(z, t.numpy(), z_loss=1e-3, grad_loss=weights.double().numpy())
        leaf = torch.tensor(local, dtype=torch.float32, requires_grad=True)
        logits = leaf * 1.0  # an intermediate, as a matmul's output is
        loss = vpce.torch.vocab_parallel_cross_entropy(logits, t, comm, inplace=True, z_loss=1e-3, mode=mode)
        torch.testing.assert_close(loss.double(), torch.tensor(want_loss), rtol=1e-5, atol=1e-5)
        ptr = logits.data_ptr()
        loss.backward(weights, retain_graph=True)
        torch.testing.assert_close(leaf.grad.double(), torch.tensor(want_grad[:, cols]), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(logits.detach().double(), torch.tensor(want_grad[:, cols]), rtol=1e-4, atol=1e-6)
        assert logits.data_ptr() == ptr
        with pytest.raises(RuntimeError, match="second backward"):
            loss.backward(weights)


@pytest.mark.parametrize("kind", ["uneven", "empty"])
def test_weights_probabilities_and_row_outputs(comm, kind):
    """Class weights and probability targets against PyTorch's own F.cross_entropy over the gathered vocabulary
    (float64); the per-row outputs (entropy, target log-prob, z-loss terms) against their definitions."""
    import torch.nn.functional as F

    sizes = partition(comm, kind)
    z, local, targets, begin = problem(comm, sizes, n=10, seed=5)
    cols = slice(begin, begin + sizes[comm.Get_rank()])
    zt = torch.tensor(z, requires_grad=True)
    t = torch.tensor(targets)
    weights = np.random.default_rng(6).uniform(0.5, 2.0, size=sum(sizes))

    ce = vpce.CrossEntropy(comm, sizes=sizes, dtype="float64", reduction="mean", z_loss=1e-2, entropy=True)
    ce.set_class_weights(np.ascontiguousarray(weights[cols]))
    ce.loss_and_grad(local, targets)
    lse = torch.logsumexp(zt, 1)
    valid = t != -100
    zterm = torch.where(valid, 1e-2 * lse**2, torch.zeros_like(lse))
    np.testing.assert_allclose(ce.z_loss_terms, zterm.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ce.lse, lse.detach().numpy(), rtol=1e-12)
    logp = torch.log_softmax(zt, 1)
    want_lp = torch.where(valid, logp.gather(1, t.clamp(min=0)[:, None])[:, 0], torch.zeros_like(lse))
    np.testing.assert_allclose(ce.logprob, want_lp.detach().numpy(), rtol=1e-12, atol=1e-14)
    ent = -(logp.exp() * logp).sum(1)
    np.testing.assert_allclose(ce.entropy, ent.detach().numpy(), rtol=1e-10)
    ce.set_class_weights(None)
    loss = ce.forward(local, targets)
    np.testing.assert_allclose(loss, (F.cross_entropy(zt, t, reduction="none") + zterm).detach().numpy(), rtol=1e-12)

    wce = vpce.CrossEntropy(comm, sizes=sizes, dtype="float64", reduction="mean")
    wce.set_class_weights(np.ascontiguousarray(weights[cols]))
    loss, grad = wce.loss_and_grad(local, targets)
    want = F.cross_entropy(zt, t, weight=torch.tensor(weights), reduction="none")
    mean = F.cross_entropy(zt, t, weight=torch.tensor(weights), reduction="mean")
    mean.backward()
    np.testing.assert_allclose(loss, want.detach().numpy(), rtol=1e-12, atol=1e-14)
    assert wce.reduced_loss == pytest.approx(mean.item(), rel=1e-12)
    np.testing.assert_allclose(grad, zt.grad.numpy()[:, cols], rtol=1e-10, atol=1e-14)

    q = np.random.default_rng(7).dirichlet(np.ones(sum(sizes)), size=len(targets))
    pce = vpce.CrossEntropy(comm, sizes=sizes, dtype="float64", probability_targets=True, label_smoothing=0.1)
    loss, grad = pce.loss_and_grad(local, np.ascontiguousarray(q[:, cols]))
    zt.grad = None
    want = F.cross_entropy(zt, torch.tensor(q), label_smoothing=0.1, reduction="none")
    want.sum().backward()
    assert loss.shape == (len(targets),)
    np.testing.assert_allclose(loss, want.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(grad, zt.grad.numpy()[:, cols], rtol=1e-10, atol=1e-14)
    msg = _same_error_everywhere(comm, lambda: pce.forward(local, targets))
    assert "target probabilities" in msg


def _same_error_everywhere(comm, call):
    """call() raises vpce.Error on every rank, with the same message; returns it."""
    try:
        call()
        message = None
    except vpce.Error as e:
        message = str(e)
    messages = comm.allgather(message)
    assert messages[0] is not None, "no vpce.Error"
    assert messages == [messages[0]] * comm.Get_size(), messages
    return messages[0]


def test_errors_same_on_every_rank(comm):
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    sizes = partition(comm, "uneven")
    _, local, targets, _ = problem(comm, sizes)
    x = local.astype(np.float32)
    # options and construction arguments
    assert "label_smoothing" in _same_error_everywhere(comm, lambda: vpce.CrossEntropy(comm, 5, label_smoothing=2))
    assert "dtype" in _same_error_everywhere(comm, lambda: vpce.CrossEntropy(comm, 5, dtype="int8" if rank == last else "float32"))
    assert "unknown option" in _same_error_everywhere(comm, lambda: vpce.CrossEntropy(comm, 5, smoothing=0.1))
    assert "reduction" in _same_error_everywhere(comm, lambda: vpce.CrossEntropy(comm, 5, reduction="avg"))
    if comm.Get_size() > 1:
        assert "sizes differ" in _same_error_everywhere(
            comm, lambda: vpce.CrossEntropy(comm, sizes=[3] * comm.Get_size() if rank else [4] * comm.Get_size()))
    if not vpce.has_device():  # a host-only build refuses device arrays at construction, on every rank alike
        assert "no device backend" in _same_error_everywhere(comm, lambda: vpce.CrossEntropy(comm, 5, device="cuda"))
    ce = vpce.CrossEntropy(comm, sizes=sizes)
    # one rank's bad argument: the message of the lowest such rank, on every rank
    msg = _same_error_everywhere(comm, lambda: ce.forward(x.astype(np.float64) if rank == last else x, targets))
    assert "logits is float64, expected float32" in msg
    msg = _same_error_everywhere(comm, lambda: ce.forward(x, targets.astype(np.int32) if rank == last else targets))
    assert "targets is int32" in msg
    msg = _same_error_everywhere(comm, lambda: ce.forward(np.asfortranarray(np.repeat(x, 2, axis=0)), np.repeat(targets, 2)))
    assert "C-contiguous" in msg or x.shape[1] <= 1
    msg = _same_error_everywhere(comm, lambda: ce.forward(x, targets[:-1] if rank == 0 else targets))
    assert "expected N" in msg
    msg = _same_error_everywhere(comm, lambda: ce.loss_and_grad(x, targets, grad=np.empty((3, 3), np.float32)))
    assert "grad has shape" in msg
    # the library's own checks: a target beyond the vocabulary, a NaN logit on one rank, ranks disagreeing on N
    bad = targets.copy()
    bad[0] = sum(sizes)
    assert "outside" in _same_error_everywhere(comm, lambda: ce.forward(x, bad))
    y = x.copy()
    if rank == last and y.size:
        y[2, 0] = np.nan
    if y.size or comm.Get_size() == 1:
        assert "NaN" in _same_error_everywhere(comm, lambda: ce.forward(y, targets)) or y.size == 0
    # and the handle still works afterwards
    loss = ce.forward(x, targets)
    assert np.isfinite(loss).all()
