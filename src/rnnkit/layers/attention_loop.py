"""The teacher-forced decoder with attention before each step, as ONE autograd node.

Wiring (``Seq2Seq`` with ``attention_wiring="before"``, one decoder layer): at step t the
previous state scores the encoder states and their weighted sum joins the step's input,

    s_tj = score(h_{t−1}, k_j)            (dot / bilinear: h_{t−1} · k_j;
                                           additive: vᵀ tanh(W_q h_{t−1} + b_q + k_j))
    α_t = softmax_j(s_tj) over real source positions       c_t = Σ_j α_tj m_j
    h_t = cell([x_t; c_t], h_{t−1})

with ``k = Attention.prepare(m)`` the keys of the memory ``m``. Because ``c_t`` depends on
``h_{t−1}``, the recurrence cannot run as one layer call (``recurrence.py``); step by
step in autograd it costs some thirty small eager operations per step, forward and
backward, each paying Python and dispatch overhead at these sizes. This node runs the
same function with fewer, larger operations:

* the input projection of the teacher-forced part ``x_t`` (target embeddings, a fixed
  context) for all steps in one product; per step only ``c_t W_cᵀ`` and the cell's
  recurrent product are added (the cell kernel's ``step_into``, as the time loop's
  PyTorch form runs it; an LSTM's gate math in one call per step on the compiled
  library on the CPU, an LSTM's or a GRU's in Triton launches on a GPU:
  :func:`rnnkit.bptt.dispatch.python_step_kernel`);
* the softmax and the context product into preallocated step buffers;
* a hand-written backward, replaying the kernel's ``step_backward`` from ``t = T`` down
  to 1, where the gradient of the previous state gathers three paths: the recurrence,
  the query (``W_qᵀ d_q``, or ``Σ_j d_s_tj k_j`` for dot/bilinear) and nothing else:

      d_c_t = d_featuresᶜ_t + W_cᵀ d_xp_t        d_α_t = m d_c_t (+ d_weights_t)
      d_s_t = α_t ⊙ (d_α_t − α_t · d_α_t)        (softmax backward; 0 at padding)
      additive: d_q_t = Σ_j d_s_tj (1 − u_tj²) ⊙ v,  u_tj = tanh(W_q h_{t−1} + b_q + k_j)
                (u = 2σ(2a) − 1, so 1 − u² = 4σ(1 − σ): the sigmoid's output is kept)

* then every weight gradient as one product over all steps: ``∂L/∂W_x = d_xpᵀ x``,
  ``∂L/∂W_c = d_xpᵀ c``, ``∂L/∂W_q = d_qᵀ h_prev``, ``∂L/∂v = Σ d_s u``, ``∂L/∂m =
  Σ_t α_tᵀ d_c_t``, ``∂L/∂k`` likewise.

Padded target steps are computed like real ones (their inputs are padding embeddings),
exactly as the step-by-step loop does; the loss masks them. Tested equal to autograd
through the step-by-step decoder in float64 (outputs, attention weights, every gradient).
A decoder of float16/bfloat16 weights on the CPU runs the node in float32 and rounds its
outputs once to the weights' dtype (``rnnkit.cells.amp.computes_in_float32``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rnnkit.bptt import native
from rnnkit.bptt.dispatch import python_step_kernel
from rnnkit.bptt.mask_facts import host_mask
from rnnkit.bptt.unrolled import replayed_gradients
from rnnkit.cells.amp import computes_in_float32, float32, without_autocast
from rnnkit.cells.kernel import Kernel, StepKernel, Weights, batched_gradients
from rnnkit.layers.attention_scores import torch_scores

__all__ = ["AttentionDecoderOutput", "attention_decoder"]


class AttentionDecoderOutput(NamedTuple):
    """Time-major outputs of every decoder step.

    Attributes:
        hidden: ``(T, B, H)`` the decoder states ``h_1..h_T``.
        context: ``(T, B, D)`` the attention contexts ``c_1..c_T``.
        weights: ``(T, B, S)`` the attention weights ``α_1..α_T`` (0 at source padding).
    """

    hidden: Tensor
    context: Tensor
    weights: Tensor


class _Spec(NamedTuple):
    """The non-tensor inputs of the node."""

    kernel: StepKernel
    additive: bool
    fill: Tensor  # (B, S) bool: the score positions set to −inf (padding of rows with any)
    empty_rows: Tensor | None  # (B, 1) bool: rows without any real position (weights 0)
    T: int
    lib: Any  # the compiled loop's operators (fused additive scores), or None: torch ops
    base: Any  # the cell's own kernel: its differentiable ``step`` (:func:`_replay`)


class _AttentionDecoder(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        spec: _Spec,
        x: Tensor,
        weight_x: Tensor,
        weight_c: Tensor,
        weight_hh: Tensor,
        bias: Tensor,
        bias_hn: Tensor | None,
        keys: Tensor,
        memory: Tensor,
        query_weight: Tensor | None,
        query_bias: Tensor | None,
        v: Tensor | None,
        *states0: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        # forward and backward stay one function each: every step reads and writes the
        # same preallocated (T, ...) buffers of the cell, the attention and its scores, and
        # splitting a step over helpers would pass a dozen of them each way per call.
        kernel, T = spec.kernel, spec.T
        B, S, D = memory.shape
        H = weight_hh.shape[1]
        w = Weights(weight_x, weight_hh, bias, bias_hn)
        xps = kernel.project_inputs(x, w, T, B)  # (T, B, ·) each: x_t's part, bias included
        w_c = kernel.input_weights_t(weight_c)  # c_t's part, as project_inputs applies W
        prep = kernel.prepare(w)
        states = tuple(x.new_empty(T + 1, B, H) for _ in states0)
        for buf, s0 in zip(states, states0, strict=True):
            buf[0].copy_(s0)
        cache = kernel.alloc_cache(T, B, H, xps, True)
        contexts = x.new_empty(T, B, D)
        weights = x.new_empty(T, B, S)
        scores = x.new_empty(B, S)
        scores_row = scores.unsqueeze(1)  # (B, 1, S): bmm's output view
        lib = spec.lib
        if not spec.additive:
            keys_t = keys.transpose(1, 2).contiguous()  # (B, A, S): s_t = h_{t−1}ᵀ K as a row
        if spec.additive:
            # s_tj = vᵀ u_tj = 2 vᵀ σ_tj − Σ v with σ_tj = σ(2 (W_q h_{t−1} + b_q + k_j)):
            # tanh a = 2σ(2a) − 1, one sigmoid pass (Attention.scores computes the same).
            assert query_weight is not None and query_bias is not None and v is not None
            w_q, b_q, v_a = query_weight, query_bias, v  # (typed: not None from here on)
            A = keys.shape[2]
            hidden = x.new_empty(T, B, S, A)  # σ_t, kept for the backward
            query = x.new_empty(B, A)
            query3, query_weight_t = query.unsqueeze(1), w_q.T
            flat_scores = scores.view(B * S)
            v_sum = v_a.sum()
            if lib is not None:  # one fused pass: σ_t and s_t + Σ v (the softmax ignores Σ v)
                v2 = 2 * v_a
        n = len(states)
        state_steps = [s.unbind(0) for s in states]
        cache_steps = [c.unbind(0) for c in cache]
        xp_steps = [xp.unbind(0) for xp in xps]
        for t in range(T):
            h_prev = state_steps[0][t]
            if spec.additive:
                torch.addmm(b_q, h_prev, query_weight_t, beta=2, alpha=2, out=query)
                sig = hidden[t]
                if lib is not None:
                    lib.sigmoid_scores(keys, query, v2, scores, sig, key_scale=2.0)
                else:
                    torch.add(query3, keys, alpha=2, out=sig).sigmoid_()
                    torch.mv(sig.view(B * S, A), v_a, out=flat_scores)
                    scores.mul_(2).sub_(v_sum)
            else:
                torch.bmm(h_prev.unsqueeze(1), keys_t, out=scores_row)
            scores.masked_fill_(spec.fill, float("-inf"))
            alpha = weights[t]
            torch.softmax(scores, -1, out=alpha)
            if spec.empty_rows is not None:
                alpha.masked_fill_(spec.empty_rows, 0.0)
            c = contexts[t]
            torch.bmm(alpha.unsqueeze(1), memory, out=c.unsqueeze(1))
            xp_t = tuple(xs[t] for xs in xp_steps)
            for buf, wt in zip(xp_t, w_c, strict=True):
                buf.addmm_(c, wt)
            prev = tuple(state_steps[k][t] for k in range(n))
            out = tuple(state_steps[k][t + 1] for k in range(n))
            kernel.step_into(xp_t, prev, out, tuple(cs[t] for cs in cache_steps), prep)
        ctx.spec, ctx.num_states = spec, n
        saved = [x, weight_x, weight_c, weight_hh, keys, memory, contexts, weights]
        saved += [*states, *cache]
        if spec.additive:
            saved += [w_q, v_a, hidden]
        # the inputs the differentiable backward reads besides those above (at the end)
        extra = [bias, bias_hn, query_weight, query_bias, v, *states0]
        ctx.num_extra = len(extra)
        ctx.save_for_backward(*saved, *extra)
        return states[0][1:], contexts, weights

    @staticmethod
    def backward(
        ctx: Any, d_hidden: Tensor | None, d_contexts: Tensor | None, d_weights: Tensor | None
    ):
        grads = (d_hidden, d_contexts, d_weights)
        if torch.is_grad_enabled() or batched_gradients(*grads):
            return _AttentionDecoder.differentiable_backward(ctx, *grads)
        return _AttentionDecoder.explicit_backward(ctx, *grads)

    @staticmethod
    def differentiable_backward(
        ctx: Any, d_hidden: Tensor | None, d_contexts: Tensor | None, d_weights: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        """create_graph=True or a batch of gradients under vmap: the steps run again in
        differentiable operations from the node's inputs (:func:`_replay`), and
        autograd differentiates them (the explicit backward has no graph of its own)."""
        saved = ctx.saved_tensors
        x, weight_x, weight_c, weight_hh, keys, memory = saved[:6]
        bias, bias_hn, query_weight, query_bias, v, *states0 = saved[len(saved) - ctx.num_extra :]
        inputs = (x, weight_x, weight_c, weight_hh, bias, bias_hn, keys, memory)
        inputs += (query_weight, query_bias, v, *states0)
        need = ctx.needs_input_grad[1:]
        wanted = [i for i, t in enumerate(inputs) if need[i] and t is not None and t.requires_grad]
        got = replayed_gradients(
            lambda args: _replay(ctx.spec, *args), inputs, wanted, (d_hidden, d_contexts, d_weights)
        )
        result: list[Tensor | None] = [None] * len(inputs)
        for i, g in zip(wanted, got, strict=True):
            result[i] = g
        return (None, *result)

    @staticmethod
    @once_differentiable
    def explicit_backward(
        ctx: Any, d_hidden: Tensor | None, d_contexts: Tensor | None, d_weights: Tensor | None
    ):
        """The hand-written reverse sweep (module docstring)."""
        # (one function, as the forward: the reverse sweep and the weight products that
        # follow it share the sweep's buffers)
        spec, n = ctx.spec, ctx.num_states
        kernel, T = spec.kernel, spec.T
        saved = list(ctx.saved_tensors)  # read once (torch.utils.checkpoint unpacks once)
        del saved[len(saved) - ctx.num_extra :]
        x, weight_x, weight_c, weight_hh, keys, memory, contexts, weights = saved[:8]
        states = tuple(saved[8 : 8 + n])
        rest = saved[8 + n :]
        if spec.additive:
            query_weight, v, hidden = rest[-3:]
            cache = tuple(rest[:-3])
        else:
            cache = tuple(rest)
        B, S, D = memory.shape
        H = weight_hh.shape[1]
        G = kernel.gates
        state_steps = [s.unbind(0) for s in states]
        bcache_steps = [c.unbind(0) for c in kernel.backward_cache(cache, states)]
        separate_hp = getattr(kernel, "reset", None) == "after"
        d_xp = x.new_empty(T, B, G * H)
        d_hp = x.new_empty(T, B, H) if separate_hp else d_xp
        d_c = x.new_empty(T, B, D)
        d_s = x.new_empty(T, B, S)
        d_alpha = x.new_empty(B, S)
        d_alpha_row = d_alpha.unsqueeze(1)  # (B, 1, S)
        # d_α_t = m d_c_t as a row times mᵀ: torch's batched product of a matrix and a
        # column vector is several times slower than that of a row vector and a matrix.
        memory_t = memory.transpose(1, 2).contiguous()  # (B, D, S)
        lib = spec.lib
        if spec.additive:
            # Per step, with σ_t (B, S, A) while it is in cache: u = 2σ − 1, so
            # ∂s/∂(W_q h + b_q) = (1 − u²) ⊙ v = 4 σ(1 − σ) ⊙ v and ∂s/∂v = 2σ − 1:
            # d_q_t = 4 v ⊙ Σ_j d_s_tj σ_tj(1 − σ_tj), ∂L/∂k_j = 4 v ⊙ Σ_t d_s_tj σ_tj(1 − σ_tj),
            # ∂L/∂v = 2 Σ d_s σ − Σ d_s.
            A = hidden.shape[3]
            d_q = x.new_empty(T, B, A)
            v4 = 4 * v
            s_sig = x.new_empty(T, B, A)  # Σ_j d_s_tj σ_tj
            if lib is None:  # the torch operations' buffers (the compiled pass needs none)
                s_dsig = x.new_empty(B, 1, A)  # Σ_j d_s_tj σ_tj(1 − σ_tj)
                dsig = x.new_empty(B, S, A)  # σ_t(1 − σ_t) (the saved σ stays as it is)
            acc = x.new_zeros(B, S, A) if ctx.needs_input_grad[7] else None
        wprep = kernel.prepare_backward(Weights(weight_x, weight_hh, None, None))  # type: ignore[arg-type]
        d_state = [x.new_zeros(B, H) for _ in range(n)]
        for t in range(T - 1, -1, -1):
            if d_hidden is not None:
                d_state[0] = d_state[0] + d_hidden[t]
            prev = tuple(state_steps[k][t] for k in range(n))
            new = tuple(state_steps[k][t + 1] for k in range(n))
            cache_t = tuple(c[t] for c in bcache_steps)
            d_prev = list(
                kernel.step_backward(tuple(d_state), prev, new, cache_t, d_xp[t], d_hp[t], wprep)
            )
            # c_t reached the step's input (W_c) and the features
            if d_contexts is not None:
                torch.addmm(d_contexts[t], d_xp[t], weight_c, out=d_c[t])
            else:
                torch.mm(d_xp[t], weight_c, out=d_c[t])
            torch.bmm(d_c[t].unsqueeze(1), memory_t, out=d_alpha_row)
            if d_weights is not None:
                d_alpha.add_(d_weights[t])
            d_s_t = d_s[t]
            d_s_t.copy_(torch._softmax_backward_data(d_alpha, weights[t], -1, d_alpha.dtype))
            # the query was h_{t−1}
            if spec.additive and lib is not None:  # the same sums in one pass
                lib.sigmoid_scores_backward(d_s_t, hidden[t], v4, s_sig[t], d_q[t], acc)
                d_prev[0].addmm_(d_q[t], query_weight)
            elif spec.additive:
                sig, d_s3 = hidden[t], d_s_t.unsqueeze(1)
                torch.bmm(d_s3, sig, out=s_sig[t].unsqueeze(1))
                torch.addcmul(sig, sig, sig, value=-1, out=dsig)  # σ − σ²
                torch.bmm(d_s3, dsig, out=s_dsig)
                d_q_t = torch.mul(s_dsig.squeeze(1), v4, out=d_q[t])
                if acc is not None:
                    acc.addcmul_(d_s_t.unsqueeze(2), dsig)
                d_prev[0].addmm_(d_q_t, query_weight)
            else:
                d_prev[0].unsqueeze(1).baddbmm_(d_s_t.unsqueeze(1), keys)
            d_state = d_prev
        # Every weight gradient: one product over all steps — on the library's own
        # product where it has one (torch's BLAS may take a path at half the machine's
        # rate, e.g. MKL on AMD CPUs), as the time loop's weight gradients do.
        mm = lib.matmul if lib is not None and native.own_matmul() else torch.mm
        h_prev = states[0][:-1].reshape(T * B, H)
        d_xp_flat = d_xp.view(T * B, G * H)
        need = ctx.needs_input_grad
        d_x = mm(d_xp_flat, weight_x) if need[1] else None
        d_weight_x = mm(d_xp_flat.T, x) if need[2] else None
        d_weight_c = mm(d_xp_flat.T, contexts.view(T * B, D)) if need[3] else None
        d_weight_hh = d_bias_hn = None
        if need[4] or need[6]:
            flat_cache = tuple(c.reshape(T * B, c.shape[-1]) for c in cache)
            d_hp_flat = d_hp.reshape(T * B, d_hp.shape[-1])
            d_weight_hh, d_bias_hn = kernel.recurrent_grads(
                d_xp_flat, d_hp_flat, h_prev, flat_cache, mm
            )
        d_bias = d_xp_flat.sum(0) if need[5] else None
        d_s_bst = d_s.permute(1, 2, 0)  # (B, S, T)
        d_memory = torch.bmm(weights.permute(1, 2, 0), d_c.transpose(0, 1)) if need[8] else None
        d_keys = d_query_weight = d_query_bias = d_v = None
        if spec.additive:
            if acc is not None:
                d_keys = acc.mul_(v4)
            d_q_flat = d_q.view(T * B, A)
            d_query_weight = mm(d_q_flat.T, h_prev) if need[9] else None
            d_query_bias = d_q_flat.sum(0) if need[10] else None
            d_v = s_sig.view(T * B, A).sum(0).mul_(2).sub_(d_s.sum()) if need[11] else None
        elif need[7]:
            d_keys = torch.bmm(d_s_bst, states[0][:-1].transpose(0, 1))  # Σ_t d_s_tj h_{t−1}
        d_states0 = tuple(d if need[12 + k] else None for k, d in enumerate(d_state))
        return (
            None,
            d_x,
            d_weight_x,
            d_weight_c,
            d_weight_hh,
            d_bias,
            d_bias_hn,
            d_keys,
            d_memory,
            d_query_weight,
            d_query_bias,
            d_v,
            *d_states0,
        )


def _replay(
    spec: _Spec,
    x: Tensor,
    weight_x: Tensor,
    weight_c: Tensor,
    weight_hh: Tensor,
    bias: Tensor,
    bias_hn: Tensor | None,
    keys: Tensor,
    memory: Tensor,
    query_weight: Tensor | None,
    query_bias: Tensor | None,
    v: Tensor | None,
    *states0: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """The node's function in plain differentiable operations, step by step: the cell's
    own ``step`` on ``[x_t; c_t]`` (``W_ih = [W_x | W_c]``), the same scores, softmax and
    contexts (``vᵀ tanh(W_q h + b_q + k_j)`` for additive attention)."""
    T, B = spec.T, memory.shape[0]
    xs = x.view(T, B, x.shape[-1])
    w = Weights(torch.cat([weight_x, weight_c], dim=1), weight_hh, bias, bias_hn)
    states = tuple(states0)
    hs, cs, alphas = [], [], []
    for t in range(T):
        h_prev = states[0]
        if spec.additive:
            assert query_weight is not None and query_bias is not None and v is not None
            q2 = torch.addmm(query_bias, h_prev, query_weight.T, beta=2, alpha=2)
            scores = torch_scores(q2, keys, v)  # vᵀ tanh(W_q h + b_q + k_j): (B, S)
        else:
            scores = torch.bmm(h_prev.unsqueeze(1), keys.transpose(1, 2)).squeeze(1)
        alpha = torch.softmax(scores.masked_fill(spec.fill, float("-inf")), -1)
        if spec.empty_rows is not None:
            alpha = alpha.masked_fill(spec.empty_rows, 0.0)
        c = torch.bmm(alpha.unsqueeze(1), memory).squeeze(1)
        states = spec.base.step(torch.cat([xs[t], c], dim=-1), states, w)
        hs.append(states[0])
        cs.append(c)
        alphas.append(alpha)
    return torch.stack(hs), torch.stack(cs), torch.stack(alphas)


@without_autocast
def attention_decoder(
    kernel: Kernel,
    x: Tensor,
    weight_x: Tensor,
    weight_c: Tensor,
    weights: Weights,
    attention: Any,
    keys: Tensor,
    memory: Tensor,
    source_mask: Tensor | None,
    states0: tuple[Tensor, ...],
) -> AttentionDecoderOutput:
    """Run the decoder over all teacher-forced steps (module docstring).

    Args:
        kernel: the decoder cell's kernel (``cell.kernel``).
        x: ``(T, B, I_x)`` the inputs known in advance (target embeddings, a fixed context).
        weight_x: ``(G·H, I_x)`` the columns of the cell's ``weight_ih`` reading ``x``.
        weight_c: ``(G·H, D)`` the columns reading the attention context.
        weights: the cell's weights (``weight_ih`` is not read: the two parts above are).
        attention: the :class:`~rnnkit.layers.attention.Attention` (its kind and parameters).
        keys: ``(B, S, ·)`` from ``attention.prepare(memory)``.  memory: ``(B, S, D)``.
        source_mask: ``(B, S)`` bool, True at real positions, or None (all real).
        states0: the initial state tensors, each ``(B, H)``.

    Returns:
        :class:`AttentionDecoderOutput` (time-major).
    """
    dtype = weights.weight_hh.dtype  # under autocast: the loop runs in the weights' dtype
    x, keys, memory = (t.to(dtype) for t in (x, keys, memory))
    states0 = tuple(s.to(dtype) for s in states0)
    low = dtype if computes_in_float32(weights.weight_hh) else None
    if low is not None:  # float16/bfloat16 on the CPU: in float32, rounded once at the end
        x, keys, memory, weight_x, weight_c = (
            t.float() for t in (x, keys, memory, weight_x, weight_c)
        )
        states0 = tuple(s.float() for s in states0)
        weights = Weights(*(float32(w) for w in weights))  # type: ignore[arg-type]
    T, B = x.shape[0], x.shape[1]
    S = memory.shape[1]
    if source_mask is None:
        source_mask = torch.ones(B, S, dtype=torch.bool, device=memory.device)
    source_mask = source_mask.to(device=memory.device, dtype=torch.bool)
    any_real = source_mask.any(dim=1, keepdim=True)  # (B, 1)
    fill = ~source_mask & any_real
    # asked of the mask's host copy, the one the encoder's layers read: no wait
    empty_rows = None if bool(host_mask(source_mask).any(1).all()) else ~any_real
    additive = attention.kind == "additive"
    # the gate math of each step in one compiled call where it can (bptt/dispatch.py)
    step_kernel, lib = python_step_kernel(kernel, x, memory, weights.weight_hh)
    spec = _Spec(step_kernel, additive, fill, empty_rows, T, lib, kernel)
    if additive:
        qw, qb, v = attention.query_proj.weight, attention.query_proj.bias, attention.v
        if low is not None:
            qw, qb, v = (float32(t) for t in (qw, qb, v))
    else:
        qw = qb = v = None
    hidden, context, alpha = _AttentionDecoder.apply(
        spec,
        x.reshape(T * B, x.shape[2]),
        weight_x,
        weight_c,
        weights.weight_hh,
        weights.bias,
        weights.bias_hn,
        keys.contiguous(),
        memory.contiguous(),
        qw,
        qb,
        v,
        *states0,
    )
    if low is not None:
        hidden, context, alpha = hidden.to(low), context.to(low), alpha.to(low)
    return AttentionDecoderOutput(hidden, context, alpha)
