"""Batched L2 logistic regressions in torch: many problems sharing feature matrices, solved together.

:class:`_Problems` holds (feature set x problem) logistic regressions whose per-fold standardisation
is folded into the weights (X is never copied per problem); :func:`_lbfgs` solves them all at once
with a batched L-BFGS preconditioned by Böhning's bound on the logistic Hessian (Böhning 1992,
"Multinomial logistic regression algorithm", Ann. Inst. Statist. Math. 44: ``H <= c (I - 11ᵀ/K) ⊗
XᵀX/n + λI`` with c = 1/2 for the softmax, 1/4 for a sigmoid), applied elementwise in the
eigenbasis of each feature set's covariance (:func:`feature_basis`: one factorisation per feature
set, shared by every fold, C and target). The preconditioner only changes how fast the optimiser
gets there: the optimum and the stopping rule (``max|grad| <= tol``, scikit-learn's) are those of
the plain objective.
"""

from __future__ import annotations


#: Most logits in one block of :meth:`_Problems.value_grad` (rows x problems x classes of one feature
#: set): bounds its working memory. On the development machine larger blocks were faster (one
#: evaluation of 14 feature sets x 15 problems, n = 2,000, d = 384: 50 ms at 2^14, 42 ms at 2^16,
#: 38 ms at 2^18, where a feature set's 2,000 rows make one block).
BLOCK_ELEMENTS = 2 ** 18


#: Curvature pairs each L-BFGS run keeps (scipy's and so scikit-learn's default is 10). Five took as
#: many evaluations, within 2%, on the planted benchmark (30,528 against 30,590) and on anisotropic,
#: preconditioned features (12,940 against 12,718), with the same results, and each iteration passes
#: over half the history: the solver 8% faster on one thread.
HISTORY = 5


def _torch():
    import torch  # deferred: the reference path does not need torch

    return torch


def _covariance(X1, b):
    """``X[b]ᵀ X[b] / n`` in float64, the trailing ones column left out."""
    X = X1[b, :, :-1]
    return (X.T @ X).double() / X1.shape[1]


def feature_basis(X1):
    """Eigendecomposition ``(Q: (B, d, d), lam: (B, d))`` of each feature set's covariance
    ``X[b]ᵀ X[b] / n`` (``X1: (B, n, d + 1)``, globally standardised, trailing ones column left out),
    computed in float64 and returned in ``X1``'s dtype: the preconditioner of :meth:`_Problems.precondition`
    for every fold of that feature set (each fold's covariance is close to it; the preconditioner only
    sets the optimiser's pace)."""
    torch = _torch()
    B, n, d1 = X1.shape
    Q = torch.empty(B, d1 - 1, d1 - 1, dtype=X1.dtype, device=X1.device)
    lam = torch.empty(B, d1 - 1, dtype=X1.dtype, device=X1.device)
    for b in range(B):  # one at a time: a (d, d) float64 workspace, not B of them
        values, vectors = torch.linalg.eigh(_covariance(X1, b))
        Q[b], lam[b] = vectors, values.clamp_min(0)
    return Q, lam


def feature_spectrum(X1):
    """The eigenvalues alone of :func:`feature_basis`, in float64 ``(B, d)`` (half the time of the
    full decomposition): enough to decide whether to precondition."""
    torch = _torch()
    return torch.stack([torch.linalg.eigvalsh(_covariance(X1, b)).clamp_min(0) for b in range(X1.shape[0])])


class _Problems:
    """Many independent L2 logistic regressions sharing feature matrices.

    Built from ``X1: (B, n, d + 1)`` feature sets with a trailing column of ones, training masks
    ``masks: (n, G)`` (0/1), 0/1 targets ``targets: (n, K, G)`` (one-hot classes for "softmax",
    labels for "sigmoid") and penalties ``inv_C: (B, G)``: problem ``(b, g)`` fits feature set b on
    the rows of column g. The ``P = B * G`` problems are laid out flat, ``p = b * G + g``, so that
    each one leaves the batch as soon as it has converged (:meth:`select`) without copying X: an
    evaluation multiplies each feature set once by the weights of its problems still running (one
    wide product per feature set). Standardisation with the training rows' mean ``mu`` and std ``sd``
    (``(P, d + 1)``) is folded into the weights: logits ``Z = X @ (W / sd) + (b - (mu / sd) . W)``,
    the intercept being the ones column's weight. Parameters ``theta: (P, 1, (d + 1) * K)``, a view
    of ``(P, 1, d + 1, K)``: rows ``:d`` weights in standardised units, row ``d`` the unpenalised
    intercept. Objective per problem (sklearn's scaling, so ``tol`` means the same):
    ``f = sum_i m_i loss_i / n_g + ||W||^2 / (2 C n_g)``. ``XT``: ``X1`` transposed, ``(B, d + 1, n)``
    contiguous, if the caller already has it (made here otherwise).
    """

    def __init__(self, X1, masks, targets, inv_C, kind: str, basis=None, XT=None):
        torch = _torch()
        B, n, d1 = X1.shape
        G = masks.shape[1]
        self.X1, self.kind, self.K, self.shape = X1, kind, targets.shape[1], (B, G)
        # X1 transposed, (B, d + 1, n): the logits' product reads it row-major (12% faster than X1ᵀ here)
        self.XT = X1.transpose(1, 2).contiguous() if XT is None else XT
        self.masks, self.targets = masks, targets
        self.Q, self.lam = basis if basis is not None else feature_basis(X1)
        self.curv = 0.5 if kind == "softmax" else 0.25  # Böhning's bound on the loss curvature
        n_g = masks.sum(0)  # (G,)
        mu = torch.stack([masks.T @ X1[b] for b in range(B)]) / n_g[:, None]
        ex2 = torch.stack([masks.T @ (X1[b] * X1[b]) for b in range(B)]) / n_g[:, None]
        var = (ex2 - mu * mu).clamp_min(0)
        # Features (globally standardised beforehand) that are constant on the training rows get scale 1,
        # like sklearn's StandardScaler; their weights stay ~0 since the training rows carry no gradient.
        tiny = 1e3 * torch.finfo(X1.dtype).eps
        sd = torch.where(var > tiny, var.sqrt(), torch.ones_like(var))
        sd[..., -1] = 1.0  # the ones column carries the intercept: not standardised
        mu_sd = mu / sd
        mu_sd[..., -1] = 0.0
        self.sd, self.mu_sd = sd.reshape(B * G, d1), mu_sd.reshape(B * G, d1)
        self.inv_sd = 1.0 / self.sd
        self.owner = torch.arange(B, device=X1.device).repeat_interleave(G)  # feature set of each problem
        self.col = torch.arange(G, device=X1.device).repeat(B)  # its column of masks and targets
        self.n_g = n_g.repeat(B)  # (P,)
        # The objective's linear part, sum_i w_i t_ik z_ik = sum_jk A_jk M_jk with M = X1ᵀ (w t): one
        # product per feature set here, so evaluations never touch the targets row by row.
        wt = (targets * (masks / n_g)[:, None, :]).transpose(1, 2).reshape(n, G * self.K)  # (n, G K)
        self.M = torch.stack([(X1[b].T @ wt).view(d1, G, self.K).transpose(0, 1) for b in range(B)]).reshape(
            B * G, d1, self.K)  # (P, d + 1, K)
        self._index()
        self.with_inv_C(inv_C, inplace=True)

    def _index(self) -> None:
        """Per-problem row weights, eigenvalues, and the runs of consecutive problems sharing a feature set
        (each product takes a feature set once, with all of its problems' weights)."""
        torch = _torch()
        self.w = (self.masks[:, self.col] / self.n_g).T.contiguous()  # (P, n): 1 / n_g on training rows
        self.lam_p = self.lam[self.owner]  # (P, d)
        values, counts = torch.unique_consecutive(self.owner, return_counts=True)
        ends = counts.cumsum(0).tolist()
        self.runs = list(zip(values.tolist(), [0] + ends[:-1], ends))

    def with_inv_C(self, inv_C, inplace: bool = False) -> "_Problems":
        """The same problems with penalties ``inv_C: (B, G)`` or ``(P,)`` (shares every other tensor)."""
        new = self if inplace else object.__new__(_Problems)
        if not inplace:
            new.__dict__.update(self.__dict__)
        new.inv_C = inv_C.reshape(-1)
        new.pen = (new.inv_C / self.n_g)[:, None]  # (P, 1)
        return new

    def select(self, rows, cols):
        """The problems ``rows`` (indices into P; ``cols`` is the single column 0 of the flat layout)."""
        new = object.__new__(_Problems)
        new.__dict__.update(self.__dict__)
        for name in ("owner", "col", "n_g", "sd", "inv_sd", "mu_sd", "inv_C", "pen", "M"):
            setattr(new, name, getattr(self, name)[rows])
        new._index()
        return new

    def _folded(self, theta):
        """``A: (P, d + 1, K)``: the weights acting on the (globally standardised) rows of ``X1``."""
        Wb = theta.view(theta.shape[0], -1, self.K)
        A = Wb * self.inv_sd[:, :, None]
        A[:, -1] -= (self.mu_sd[:, None, :] @ Wb).squeeze(1)
        return A

    def logits(self, theta):
        """``Z: (P, K, n)`` on every row, for ``theta: (P, 1, (d + 1) * K)`` (differentiable)."""
        A = self._folded(theta)
        d1, K, n = A.shape[1], self.K, self.X1.shape[1]
        parts = [(A[s:e].transpose(1, 2).reshape(-1, d1) @ self.XT[b]).view(e - s, K, n) for b, s, e in self.runs]
        return parts[0] if len(parts) == 1 else _torch().cat(parts, 0)

    def full_logits(self, theta):
        """``Z: (B, n, K, G)`` of all ``B * G`` problems as built (``theta: (B, G, D)``), a view of
        :meth:`logits`."""
        B, G = self.shape
        return self.logits(theta.reshape(B * G, 1, -1)).view(B, G, self.K, -1).permute(0, 3, 2, 1)

    def targets_pkn(self):
        """Each problem's 0/1 targets on every row, ``(P, K, n)`` (the layout of :meth:`logits`)."""
        return self.targets[:, :, self.col].permute(2, 1, 0)

    def _rotate(self, v, to_basis: bool):
        """Weights of ``v: (P, 1, (d + 1) * K)`` times ``Qᵀ`` (into the eigenbasis) or ``Q`` (back), each
        problem with its feature set's ``Q``; the intercept row is left as it is."""
        P, K, d = v.shape[0], self.K, self.X1.shape[2] - 1
        V = v.view(P, d + 1, K)
        out = _torch().empty_like(V)
        for b, s, e in self.runs:
            Q = self.Q[b].T if to_basis else self.Q[b]
            out[s:e, :d] = (Q @ V[s:e, :d].transpose(0, 1).reshape(d, -1)).view(d, e - s, K).transpose(0, 1)
        out[:, d] = V[:, d]
        return out.view(v.shape)

    def to_basis(self, theta):
        """Parameters in eigenbasis coordinates ``v`` (weights ``Qᵀ W``): an orthogonal change of
        variables, so the L2 term and the optimum are unchanged."""
        return self._rotate(theta, True)

    def from_basis(self, v):
        return self._rotate(v, False)

    def value_grad_basis(self, v, reduced: bool = False):
        """:meth:`value_grad` at eigenbasis coordinates ``v``: objective ``(P, 1)``, gradient in
        those coordinates and ``max|grad|`` in the original ones ``(P, 1)`` (the stopping rule)."""
        f, g = self.value_grad(self.from_basis(v), reduced)
        return f, self.to_basis(g), g.abs().amax(-1)

    def precondition(self, v):
        """``M^-1 v`` in eigenbasis coordinates: Böhning's bound ``M = curv · Σ_b + pen I`` on the
        weights (``Σ_b = Q diag(lam) Qᵀ``, so elementwise here) and ``curv`` on the intercept (the
        training columns are centred, so it does not couple to the weights)."""
        P, K, d = v.shape[0], self.K, self.X1.shape[2] - 1
        V = v.view(P, d + 1, K)
        out = _torch().empty_like(V)
        out[:, :d] = V[:, :d] / (self.curv * self.lam_p[:, :, None] + self.pen[:, :, None])
        out[:, d] = V[:, d] / self.curv
        return out.view(v.shape)

    def item_loss_and_prob(self, Z, targets=None):
        """Per-item loss (cross-entropy; summed binary cross-entropy for "sigmoid") over the class
        axis 1 of ``Z: (P, K, n)`` (:meth:`logits`), ``(P, n)``, and probabilities (``Z``'s shape), for
        0/1 ``targets`` broadcasting against ``Z`` (default: :meth:`targets_pkn`)."""
        torch = _torch()
        targets = self.targets_pkn() if targets is None else targets
        if self.kind == "softmax":
            m = Z.amax(1, keepdim=True)
            E = (Z - m).exp_()
            S = E.sum(1, keepdim=True)
            lse = (S.log() + m).squeeze(1)
            return lse - (Z * targets).sum(1), E.div_(S)
        loss = torch.nn.functional.softplus(Z).sub_(Z * targets).sum(1)
        return loss, torch.sigmoid(Z)

    def reducible(self) -> bool:
        """Whether :meth:`value_grad` may take ``reduced=True``: a softmax over three or more classes."""
        return self.kind == "softmax" and self.K >= 3

    def logit_blocks(self, A, Kc: int | None = None):
        """The logits of classes ``:Kc`` (default all) for weights ``A: (P, d + 1, K)`` (:meth:`_folded`),
        one feature set's problems and a block of rows at a time (at most :data:`BLOCK_ELEMENTS` logits):
        yields ``(b, s, e, r0, Z)``, ``Z: ((e - s) Kc, rows)`` for problems ``s:e`` of feature set ``b``
        on rows ``r0:r0 + rows``."""
        K = self.K
        Kc = K if Kc is None else Kc
        n, d1 = self.X1.shape[1], self.X1.shape[2]
        for b, s, e in self.runs:
            m = e - s
            At = A[s:e, :, :Kc].transpose(1, 2).reshape(m * Kc, d1)
            rows = min(n, max(64, BLOCK_ELEMENTS // (m * K)))
            for r0 in range(0, n, rows):
                yield b, s, e, r0, At @ self.XT[b, :, r0:r0 + rows]

    def value_grad(self, theta, reduced: bool = False):
        """Objective ``(P, 1)`` and its gradient ``(P, 1, (d + 1) * K)``.

        Each feature set's rows are taken a block at a time (at most :data:`BLOCK_ELEMENTS` logits), the
        logits of all of its problems laid out ``(problem, class, row)``: the softmax reduces over the
        class axis with the rows contiguous (vectorised), and one product gives the logits, another the
        block's share of the gradient. The objective's linear part needs no per-row work (``M``).

        ``reduced`` (softmax, K >= 3, see :meth:`reducible`): ``theta``'s weights and intercepts sum to
        zero over the classes, as the optimum's do (the softmax is unchanged by a shift common to all
        classes, and the L2 term is smallest at zero sum) and as every iterate from such a start does
        (each gradient sums to zero over the classes, ``sum_k (p_k - t_k) = 0``). Then the last class's
        logits are minus the sum of the others' and its loss gradient minus the sum of theirs: the
        products cover K - 1 classes (a fifth fewer operations at K = 5), with the same values."""
        torch = _torch()
        P, K = theta.shape[0], self.K
        n, d1 = self.X1.shape[1], self.X1.shape[2]
        A = self._folded(theta)  # (P, d + 1, K)
        softmax = self.kind == "softmax"
        red = reduced and self.reducible()
        Kc = K - 1 if red else K  # classes whose logits come from a product
        G = torch.empty(P, Kc, d1, dtype=theta.dtype, device=theta.device)
        lse = torch.empty(P, n, dtype=theta.dtype, device=theta.device)  # per-item log-partition (softplus)
        for b, s, e, r0, Z in self.logit_blocks(A, Kc):
            m, rows = e - s, Z.shape[1]
            acc = G[s:e].view(m * Kc, d1)
            Xb = self.X1[b, r0:r0 + rows]
            Z3 = Z.view(m, Kc, -1)
            wb = self.w[s:e, None, r0:r0 + rows]
            if softmax:  # (faster than torch.logsumexp plus a softmax here)
                mx = Z3.amax(1, keepdim=True)
                if red:
                    z_last = Z3.sum(1, keepdim=True).neg_()
                    mx = torch.maximum(mx, z_last)
                    S = Z3.sub_(mx).exp_().sum(1, keepdim=True).add_(z_last.sub_(mx).exp_())
                else:
                    S = Z3.sub_(mx).exp_().sum(1, keepdim=True)
                Z3.mul_(wb / S)
                lse[s:e, r0:r0 + rows] = S.log_().add_(mx).squeeze(1)
            else:
                lse[s:e, r0:r0 + rows] = torch.nn.functional.softplus(Z3).sum(1)
                Z3.sigmoid_().mul_(wb)
            # d f / d Z times the block's rows, less the linear part
            if r0 == 0:
                torch.mm(Z, Xb, out=acc)
            else:
                acc.addmm_(Z, Xb)
        # f = sum_i w_i lse_i - sum_i w_i sum_k t_ik z_ik + pen ||W||^2 / 2, the dots as batched products
        dot = _dot
        Wb = theta.view(P, d1, K)
        ww = dot(theta.view(P, -1), theta.view(P, -1)) - dot(Wb[:, -1], Wb[:, -1])  # the intercept is not penalised
        f = (dot(lse, self.w) - dot(A.view(P, -1), self.M.view(P, -1)) + 0.5 * self.pen[:, 0] * ww)[:, None]
        g = torch.empty_like(A)
        torch.sub(G.transpose(1, 2), self.M[:, :, :Kc], out=g[:, :, :Kc])  # (P, d + 1, K)
        if red:
            torch.sum(g[:, :, :Kc], 2, out=g[:, :, K - 1]).neg_()
        gc = g[:, -1:].clone()  # d f / d intercept
        g.mul_(self.inv_sd[:, :, None]).addcmul_(self.mu_sd[:, :, None], gc, value=-1)
        g[:, :-1].addcmul_(self.pen[:, :, None], Wb[:, :-1])
        return f, g.view(P, 1, -1)


def _dot(u, v):
    """``(u * v).sum(-1)`` for ``u`` and ``v`` of one shape, as one batched product (twice as fast on the
    CPU)."""
    D = u.shape[-1]
    return _torch().bmm(u.reshape(-1, 1, D), v.reshape(-1, 1, D).transpose(1, 2)).view(u.shape[:-1])


def _lbfgs(problems: _Problems, theta0, *, max_iter: int, tol: float, history: int = HISTORY, max_ls: int = 40,
           precondition: bool = True, memory: dict | None = None):
    """Batched L-BFGS, one independent run per problem (own history, step and stopping).

    Two-loop recursion (Nocedal & Wright 2006, alg. 7.4) on ``theta: (B, G, D)`` with the initial
    inverse Hessian ``M^-1`` of :meth:`_Problems.precondition` (``precondition=False``: the usual
    ``(sᵀy / yᵀy) I``), so the first step is Böhning's majorise-minimise step; backtracking
    Armijo line search (c1 = 1e-4) from step 1. A problem stops when ``max|grad| <= tol`` (lbfgs'
    ``gtol`` in sklearn), when its objective stops moving (relative change below 4 machine
    epsilons) or when no step decreases it by more than rounding. ``theta0: (B, G, D)`` is solved
    as ``B * G`` independent rows (the flat layout of :class:`_Problems`); stopped problems leave
    the batch once they are a quarter of it, and backtracking re-evaluates only the problems still
    searching. Returns ``theta`` and the number of iterations per
    problem ``(B, G)``.

    ``memory``: a dict the run leaves its curvature pairs in (``S``, ``Y``, ``pos``, ``pen``; zeros for
    problems that left the batch early, so no full-size copy is kept while it runs); given one left by
    a run on the same problems at other penalties (the next C of a path), the run starts from those
    pairs (taking them out of the dict) with ``Y`` corrected exactly for the change of the L2 term
    (``y += Δpen · s`` on the weights), so its quasi-Newton model starts informed instead of from a
    scaled identity.
    """
    torch = _torch()
    shape = theta0.shape
    theta = theta0.reshape(-1, 1, shape[-1]).clone()  # one row per problem: each leaves the batch on its own
    reduced = problems.reducible()
    if reduced:  # start on the classes' zero-sum plane, as the optimum (same loss, smaller L2 term)
        Wk = theta.view(theta.shape[0], -1, problems.K)
        Wk -= Wk.mean(2, keepdim=True)
    B, G = theta.shape[:2]
    eps = torch.finfo(theta.dtype).eps
    full = problems
    iters = torch.zeros(B, G, dtype=torch.long, device=theta.device)
    rows, cols = torch.arange(B, device=theta.device), torch.arange(G, device=theta.device)

    dot = _dot

    if precondition:  # iterate in the eigenbasis, where the preconditioner is elementwise
        theta = problems.to_basis(theta)

        def evaluate(t, p):
            return p.value_grad_basis(t, reduced)
    else:
        def evaluate(t, p):
            f_, g_ = p.value_grad(t, reduced)
            return f_, g_, g_.abs().amax(-1)
    out = theta.clone()
    f, g, gmax = evaluate(theta, problems)
    if precondition:
        gamma = torch.ones_like(f)
    else:
        gamma = torch.clamp(1.0 / dot(g, g).sqrt().clamp_min(1e-30), max=1.0)  # first step: at most unit length
    pos = 0
    if memory is not None and "S" in memory and memory["S"].shape[1:] == theta.shape:
        S, pos, Y_old, pen_old = memory.pop("S"), memory.pop("pos"), memory.pop("Y"), memory.pop("pen")
        weights = torch.ones(theta.shape[2], dtype=theta.dtype, device=theta.device).view(-1, problems.K)
        weights[-1] = 0.0  # the intercept is not penalised
        Yh = Y_old.add_((problems.pen - pen_old)[None, ..., None] * S * weights.view(-1))
        del Y_old
        sy, yy = dot(S, Yh), dot(Yh, Yh)
        valid = (sy > eps * yy) & (yy > 0)
        rho = torch.where(valid, 1.0 / torch.where(valid, sy, torch.ones_like(sy)), torch.zeros_like(sy))
        last = (pos - 1) % history
        gamma = torch.where(valid[last], sy[last] / torch.where(valid[last], yy[last], torch.ones_like(yy[last])),
                            gamma)
    else:
        S = torch.zeros((history,) + theta.shape, dtype=theta.dtype, device=theta.device)
        Yh = torch.zeros_like(S)
        rho = torch.zeros(history, B, G, dtype=theta.dtype, device=theta.device)
    pen_all = problems.pen.clone()
    done = gmax <= tol
    for it in range(max_iter):
        if bool(done.all()):
            break
        # Drop the problems that have stopped once they are a quarter of the batch (each drop copies the
        # optimiser's history, not X).
        row_keep, col_keep = ~done.all(1), ~done.all(0)
        if int((~row_keep).sum()) * 4 >= len(row_keep) or int((~col_keep).sum()) * 4 >= len(col_keep):
            out[rows[:, None], cols[None, :]] = theta
            kr, kc = row_keep.nonzero().squeeze(1), col_keep.nonzero().squeeze(1)
            rows, cols, problems = rows[kr], cols[kc], problems.select(kr, kc)

            def sub(t, lead=0):
                t = t[(slice(None),) * lead + (kr,)]
                return t if len(kc) == t.shape[lead + 1] else t[(slice(None),) * (lead + 1) + (kc,)]

            theta, f, g, gmax, gamma, done = sub(theta), sub(f), sub(g), sub(gmax), sub(gamma), sub(done)
            S, Yh, rho = sub(S, 1), sub(Yh, 1), sub(rho, 1)
        iters[rows[:, None], cols[None, :]] += (~done).long()
        # Two-loop recursion: r ~ H^{-1} g.
        q = g.clone()
        alpha = torch.zeros_like(rho)
        order = [(pos - 1 - j) % history for j in range(history)]
        for j in order:
            alpha[j] = rho[j] * dot(S[j], q)
            q.addcmul_(alpha[j][..., None], Yh[j], value=-1)
        r = (problems.precondition(q) if precondition else q).mul_(gamma[..., None])
        for j in reversed(order):
            beta = rho[j] * dot(Yh[j], r)
            r.addcmul_(S[j], (alpha[j] - beta)[..., None])
        direction = r.neg_()
        gd = dot(g, direction)
        bad = ~(gd < 0) & ~done  # not a descent direction (not expected for convex f): restart on -g
        if bool(bad.any()):
            direction = torch.where(bad[..., None], -g, direction)
            gd = torch.where(bad, -dot(g, g), gd)
            rho = torch.where(bad[None], torch.zeros_like(rho), rho)
        direction.masked_fill_(done[..., None], 0.0)
        gd.masked_fill_(done, 0.0)
        # Backtracking Armijo line search, per problem. The first trial (step 1) takes the whole batch;
        # each further one only the problems still searching (a sub-batch: X is shared, nothing is
        # copied), at the minimiser of the quadratic through f, f'(0) and the failed trial, kept within
        # [0.1, 0.5] of the failed step.
        step = torch.ones_like(f)
        trial = torch.addcmul(theta, step[..., None], direction)
        ft, gt, gmt = evaluate(trial, problems)
        accepted = done | (torch.isfinite(ft) & (ft <= f + 1e-4 * step * gd))
        fresh = accepted & ~done  # stopped problems keep their values (direction 0: trial = theta)
        new_theta = torch.where(accepted[..., None], trial, theta)
        new_g = torch.where(accepted[..., None], gt, g)
        new_f, new_gmax = torch.where(fresh, ft, f), torch.where(fresh, gmt, gmax)
        for _ in range(max_ls - 1):
            if bool(accepted.all()):
                break
            # A problem whose next trial could not lower f by more than rounding (its predicted decrease
            # below 8 epsilons of f) stops searching: it stays where it is and counts as stopped.
            a_next = 0.5 * step
            hopeless = ~accepted & (-gd * a_next <= 8 * eps * f.abs().clamp_min(1.0))
            searching = ~accepted & ~hopeless
            if not bool(searching.any()):
                break
            idx = searching.view(-1).nonzero().squeeze(1)  # one column (flat layout): rows are problems
            a, fa, f0, d0 = step[idx], ft[idx], f[idx], gd[idx]
            excess = fa - f0 - d0 * a  # > 0 when the Armijo test failed at a finite value
            a_q = torch.where(torch.isfinite(fa) & (excess > 0), -d0 * a * a / (2 * excess.clamp_min(1e-300)), 0.1 * a)
            a = torch.minimum(torch.maximum(a_q, 0.1 * a), 0.5 * a)
            trial = torch.addcmul(theta[idx], a[..., None], direction[idx])
            fs, gs, gms = evaluate(trial, problems.select(idx, cols[:1]))
            ok = torch.isfinite(fs) & (fs <= f0 + 1e-4 * a * d0)
            step[idx], ft[idx], accepted[idx] = a, fs, ok
            hit, rows_ok = idx[ok.view(-1)], ok.view(-1)
            new_theta[hit], new_g[hit] = trial[rows_ok], gs[rows_ok]
            new_f[hit], new_gmax[hit] = fs[rows_ok], gms[rows_ok]
        s, yv = torch.sub(new_theta, theta, out=S[pos]), torch.sub(new_g, g, out=Yh[pos])
        sy, yy = dot(s, yv), dot(yv, yv)
        valid = (sy > eps * yy) & (yy > 0)
        rho[pos] = torch.where(valid, 1.0 / torch.where(valid, sy, torch.ones_like(sy)), torch.zeros_like(sy))
        if precondition:  # scale M^-1 to the curvature just seen: sᵀy / yᵀ M^-1 y
            yy = dot(yv, problems.precondition(yv))
        gamma = torch.where(valid, sy / torch.where(valid, yy, torch.ones_like(yy)), gamma)
        pos = (pos + 1) % history
        flat = (f - new_f).abs() <= 4 * eps * torch.maximum(f.abs(), new_f.abs()).clamp_min(1.0)
        theta, f, g, gmax = new_theta, new_f, new_g, new_gmax
        done = done | ~accepted | (flat & (it > 0)) | (gmax <= tol)
    out[rows[:, None], cols[None, :]] = theta
    if memory is not None:  # problems that left the batch early leave no pairs (zeros: unused next time)
        if S.shape[1:3] == (B, G):  # nothing left the batch: hand over the pairs as they are
            S_all, Y_all = S, Yh
        else:
            S_all = torch.zeros((history, B, G) + theta.shape[2:], dtype=theta.dtype, device=theta.device)
            Y_all = torch.zeros_like(S_all)
            S_all[:, rows[:, None], cols[None, :]], Y_all[:, rows[:, None], cols[None, :]] = S, Yh
        del S, Yh
        memory.update(S=S_all, Y=Y_all, pos=pos, pen=pen_all)
    return (full.from_basis(out) if precondition else out).view(shape), iters.view(shape[:-1])


def _device_inner_scores(problems: _Problems, theta, eval_masks, select_by: str, multilabel: bool):
    """Higher-is-better inner-CV score ``(B, G)`` on rows ``eval_masks: (n, G)``, with the
    definitions of :func:`_inner_score` (``theta: (B, G, D)``, the problems as built). Each feature
    set's logits are taken a block of rows at a time (at most :data:`BLOCK_ELEMENTS`, as in
    :meth:`_Problems.value_grad`: :meth:`_Problems.logit_blocks`), so no ``(problem, class, row)`` tensor
    of all rows is made."""
    torch = _torch()
    B, G = problems.shape
    P, K = B * G, problems.K
    A = problems._folded(theta.reshape(P, 1, -1))  # (P, d + 1, K)
    E = eval_masks[:, problems.col].T  # (P, n)
    n_eval = E.sum(1)
    counts = torch.zeros(3 if multilabel and select_by != "log_loss" else 1, P, dtype=A.dtype, device=A.device)
    for _, s, e, r0, Z in problems.logit_blocks(A):
        Z = Z.view(e - s, K, -1)  # (m, K, rows)
        r1 = r0 + Z.shape[2]
        T = problems.targets[r0:r1][:, :, problems.col[s:e]].permute(2, 1, 0)
        Eb = E[s:e, r0:r1]
        if select_by == "log_loss":
            loss, _ = problems.item_loss_and_prob(Z, T)
            counts[0, s:e] += ((loss / K if multilabel else loss) * Eb).sum(1)  # multi-label: mean over labels
        elif problems.kind == "softmax":
            counts[0, s:e] += ((Z.argmax(1) == T.argmax(1)).to(Z.dtype) * Eb).sum(1)
        elif not multilabel:  # binary: one sigmoid column
            counts[0, s:e] += ((Z[:, 0] > 0) == (T[:, 0] > 0.5)).to(Z.dtype).mul_(Eb).sum(1)
        else:
            pred, truth, mb = Z > 0, T > 0.5, Eb[:, None, :]
            for i, hit in enumerate((pred & truth, pred & ~truth, ~pred & truth)):  # tp, fp, fn
                counts[i, s:e] += (hit * mb).sum((1, 2))
    if select_by == "log_loss":
        return (-counts[0] / n_eval).view(B, G)
    if not multilabel or problems.kind == "softmax":
        return (counts[0] / n_eval).view(B, G)
    tp, fp, fn = counts
    den = 2 * tp + fp + fn
    return torch.where(den > 0, 2 * tp / den.clamp_min(1), torch.zeros_like(den)).view(B, G)
