"""RankMI: a mutual-information maximising ranking loss (Kemertas et al., CVPR 2020).

Implements eq. 6 of the paper in its softplus form, the statistics network of eqs. 7, 10 and 14,
the Newton estimate of the threshold beta (V(beta) = 0) and the embedding step of Algorithm 1
(margin filtering around beta, then distance-weighted negative sampling, Wu et al. 2017: one
negative per positive pair of the batch, kept or not, among the anchor's margin-violating
negatives).
See docs/losses.md, section "RankMI".

Statistics network on a scalar distance d:
    Vt(d) = Linear(1,H) -> LeakyReLU(0.1) -> [Linear(H,H) -> LeakyReLU(0.1)] x layers -> Linear(H,1)
    V(d) = Vt(d) - d                      (eq. 10: the residual makes V decreasing at the start)
    T(d) = log 2 - softplus(-V(d))        (eq. 7)
Eq. 6, L = -mean T(d+) - mean log(2 - exp(T(d-))), is computed exactly and stably as
    L = [mean softplus(-V(d+)) - log 2] + [mean softplus(V(d-)) - log 2]
where an empty set of distances contributes 0 to its bracket.

How the trainer runs Algorithm 1 (this module owns the statistics network, the trainer owns
the alternation, the critic optimiser and the checkpoint)::

    loss = build_loss("rankmi", margin=0.2, beta0=1.0, critic_steps=1)
    critic_optimizer = loss.critic_optimizer()          # Adam lr 1e-3, weight decay 1e-4
    loss.update_beta()                                   # Algorithm 1, line 2
    for t, (images, labels) in enumerate(batches):       # t counts batches over the whole run
        emb = model(images)
        if loss.is_critic_step(t):                       # t mod (k+1) != 0: lines 9-15
            critic_optimizer.zero_grad()
            loss.critic_loss(emb, labels).backward()     # all pairs, embeddings detached
            critic_optimizer.step()
            loss.update_beta()                           # Newton, warm-started (line 14)
        else:                                            # lines 17-26
            optimizer.zero_grad()
            loss(emb, labels).backward()                 # critic frozen: no grad to loss params
            optimizer.step()

For the critic steps the embedding network can run under ``torch.no_grad()``. Save
``loss.state_dict()`` (critic weights, beta and the sampling generator) and the critic
optimiser's state in ``last.pt``; restoring both makes a resumed run identical.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from nearsight.training.losses._pairs import float32_loss, label_masks, pairwise_distances
from nearsight.training.losses.registry import LossConfigError

LOG2 = math.log(2.0)
BETA_MIN = 0.0
BETA_MAX = 2.0  # distances between unit vectors lie in [0, 2]
NEWTON_MAX_STEPS = 20
NEWTON_TOLERANCE = 1e-6
# |V'(beta)| below this counts as flat: a Newton step would jump arbitrarily far.
NEWTON_MIN_SLOPE = 1e-10
# |V(beta)| at most this: Newton's estimate is a root of V (else V has no root it could reach
# in [0, 2], and beta stayed clamped at an end or where V is flat)
ROOT_TOLERANCE = 1e-5
LEAKY_SLOPE = 0.1
# 1 - d^2/4 is clamped at this so that d = 2 (antipodal points) gives a finite log weight.
SPHERE_EPS = 1e-8


def statistics_network(hidden: int = 128, layers: int = 2) -> nn.Sequential:
    """Vt of eq. 14: Linear(1,H) -> LeakyReLU(0.1) -> [Linear(H,H) -> LeakyReLU(0.1)] x layers
    -> Linear(H,1), weights Xavier-uniform (the paper), biases PyTorch's default
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)). Zero biases would make Vt positively homogeneous
    (Vt(d) = d Vt(1)), so V(d) = d (Vt(1) - 1) would have its only root at 0 and the first
    embedding step would see beta = 0."""
    modules: list[nn.Module] = [nn.Linear(1, hidden), nn.LeakyReLU(LEAKY_SLOPE)]
    for _ in range(layers):
        modules += [nn.Linear(hidden, hidden), nn.LeakyReLU(LEAKY_SLOPE)]
    modules.append(nn.Linear(hidden, 1))
    network = nn.Sequential(*modules)
    for module in network:
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
    return network


def distance_weighted_sample(
    distances: torch.Tensor,
    candidates: torch.Tensor,
    anchors: torch.Tensor,
    dim: int,
    cutoff: float = 0.5,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Distance-weighted sampling (Wu et al. 2017): one negative for each entry of ``anchors``.

    On the unit sphere in R^dim a pair distance has density
    q(d) ∝ d^(dim-2) (1 - d^2/4)^((dim-3)/2); a candidate j of anchor a is drawn with
    probability ∝ 1/q(max(d_aj, cutoff)) among the true entries of ``candidates[a]``.
    Computed in float64 log space on the CPU (so a CPU ``generator`` makes it reproducible on
    any device), one ``torch.multinomial`` over the whole [len(anchors), N] weight matrix.

    Returns ``(negatives, has_negative)``: the drawn column per anchor entry (arbitrary where
    the anchor has no candidate) and whether the anchor had any candidate.
    """
    device = distances.device
    d = distances.detach().to("cpu", torch.float64).clamp(min=cutoff)
    mask = candidates.to("cpu")
    anchors_cpu = anchors.to("cpu")
    log_q = (dim - 2.0) * torch.log(d) + (dim - 3.0) / 2.0 * torch.log(
        (1.0 - d * d / 4.0).clamp(min=SPHERE_EPS)
    )
    log_weights = (-log_q).masked_fill(~mask, -math.inf)[anchors_cpu]
    has_negative = mask[anchors_cpu].any(dim=1)
    # rows without a candidate get uniform logits so multinomial is valid; their draw is unused
    log_weights = torch.where(has_negative[:, None], log_weights, torch.zeros_like(log_weights))
    if log_weights.shape[0] == 0:
        negatives = torch.zeros(0, dtype=torch.long)
    else:
        probabilities = torch.softmax(log_weights, dim=1)
        negatives = torch.multinomial(probabilities, 1, replacement=True, generator=generator)
        negatives = negatives.squeeze(1)
    return negatives.to(device), has_negative.to(device)


class RankMILoss(nn.Module):
    """RankMI (Kemertas et al. 2020), eq. 6 with Algorithm 1's critic and embedding steps.

    ``parameters()`` are exactly the statistics network's; ``beta`` (a float) is the current
    threshold, kept in a buffer so that ``state_dict()`` restores it. See the module docstring
    for the way a trainer alternates ``critic_loss``/``update_beta`` and ``forward``.

    Parameters: ``margin`` alpha (0.2), ``beta0`` initial threshold (1.0), ``hidden`` H (128),
    ``layers`` L (2), ``critic_steps`` k (1, critic steps per embedding step), ``dws_cutoff``
    (0.5, distances clipped below at this for the sampling weights), ``seed`` (0, for the
    negative sampling generator).
    """

    # the statistics network trains on its own batches with its own optimiser
    # (nearsight/training/loss_roles.py)
    parameter_role = "critic"
    # why the trainer does not compile this loss into the step (nearsight/training/compiled.py)
    compile_note = (
        "its embedding step keeps the pairs that violate the margin around beta (boolean "
        "masks: data-dependent shapes) and draws negatives on the CPU with its own generator"
    )

    beta_state: torch.Tensor  # a buffer: the current beta (float64)

    def __init__(
        self,
        margin: float = 0.2,
        beta0: float = 1.0,
        hidden: int = 128,
        layers: int = 2,
        critic_steps: int = 1,
        dws_cutoff: float = 0.5,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if margin < 0:
            raise LossConfigError(f"rankmi: margin must be >= 0, got {margin}")
        if not BETA_MIN <= beta0 <= BETA_MAX:
            raise LossConfigError(f"rankmi: beta0 must lie in [0, 2], got {beta0}")
        if hidden < 1 or layers < 0:
            raise LossConfigError(
                f"rankmi: need hidden >= 1 and layers >= 0, got {hidden}, {layers}"
            )
        if critic_steps < 1:
            raise LossConfigError(f"rankmi: critic_steps must be >= 1, got {critic_steps}")
        if dws_cutoff <= 0:
            raise LossConfigError(f"rankmi: dws_cutoff must be > 0, got {dws_cutoff}")
        self.margin = float(margin)
        self.critic_steps = int(critic_steps)
        self.dws_cutoff = float(dws_cutoff)
        self.critic = statistics_network(hidden, layers)
        self.register_buffer("beta_state", torch.tensor(float(beta0), dtype=torch.float64))
        # beta_state's value on the host: reading the buffer on CUDA would stop the device in
        # every embedding step (beta_state is what a checkpoint keeps)
        self._beta = float(beta0)
        # whether any update_beta has found a root of V: until one has, beta stays beta0
        self.beta_rooted = False
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(int(seed))
        self.last_newton_steps = 0

    # ------------------------------------------------------------------ state
    @property
    def beta(self) -> float:
        """The current threshold: the root of V found by the last ``update_beta``."""
        return self._beta

    def logged_scalars(self) -> dict[str, float]:
        return {"rankmi_beta": self.beta}

    def get_extra_state(self) -> dict[str, torch.Tensor]:
        # the negative-sampling generator, so that a resumed run draws the same negatives
        return {
            "generator_state": self.generator.get_state(),
            "beta_rooted": torch.tensor(self.beta_rooted),
        }

    def set_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["generator_state"])
        self._beta = float(self.beta_state)  # loaded just before the extra state
        # a checkpoint from before the flag: its beta came from Newton already
        self.beta_rooted = bool(state.get("beta_rooted", True))

    def critic_optimizer(self, lr: float = 1e-3, weight_decay: float = 1e-4) -> torch.optim.Adam:
        """Adam over the statistics network (the paper: lr 1e-3, weight decay 1e-4)."""
        return torch.optim.Adam(self.critic.parameters(), lr=lr, weight_decay=weight_decay)

    def is_critic_step(self, step: int) -> bool:
        """Algorithm 1, line 8: batch ``step`` (counted from 0) updates the critic when
        step mod (k+1) != 0, otherwise the embedding network."""
        return step % (self.critic_steps + 1) != 0

    # ------------------------------------------------------------------ critic
    def potential(self, distances: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        """V(d) = Vt(d) - d elementwise; ``frozen`` evaluates the critic with detached weights
        (gradient reaches ``distances`` but never the critic)."""
        dtype = next(self.critic.parameters()).dtype
        inputs = distances.to(dtype).unsqueeze(-1)
        if frozen:
            params = {name: p.detach() for name, p in self.critic.named_parameters()}
            outputs = functional_call(self.critic, params, (inputs,))
        else:
            outputs = self.critic(inputs)
        return outputs.squeeze(-1) - inputs.squeeze(-1)

    def _divergence(self, v_positive: torch.Tensor, v_negative: torch.Tensor) -> torch.Tensor:
        """Eq. 6 in softplus form; an empty side contributes 0."""
        total = v_positive.new_zeros(())
        if v_positive.numel():
            total = total + F.softplus(-v_positive).mean() - LOG2
        if v_negative.numel():
            total = total + F.softplus(v_negative).mean() - LOG2
        return total

    @float32_loss
    def critic_loss(self, emb: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Eq. 6 over ALL positive and negative pairs of the batch, embeddings detached: the
        loss of the statistics network's step (Algorithm 1, lines 10-13)."""
        distances = pairwise_distances(emb.detach())
        positive_mask, negative_mask = label_masks(labels.to(emb.device))
        # d is symmetric: the unordered pairs (upper triangle) have the same means, at half cost
        upper = torch.ones_like(positive_mask).triu(diagonal=1)
        v_positive = self.potential(distances[positive_mask & upper])
        v_negative = self.potential(distances[negative_mask & upper])
        # keep the result attached to the critic even when the batch has no pair at all
        anchor = sum(p.sum() for p in self.critic.parameters()) * 0.0
        return self._divergence(v_positive, v_negative) + anchor

    @torch.no_grad()
    def _newton(self, beta: float) -> tuple[float, int]:
        params = {name: p.detach().to(torch.float64) for name, p in self.critic.named_parameters()}
        device = next(self.critic.parameters()).device

        def value_and_slope(x: float) -> tuple[float, float]:
            with torch.enable_grad():
                point = torch.tensor([[x]], dtype=torch.float64, device=device, requires_grad=True)
                value = functional_call(self.critic, params, (point,)).squeeze() - point.squeeze()
                (slope,) = torch.autograd.grad(value, point)
            return float(value), float(slope)

        steps = 0
        while steps < NEWTON_MAX_STEPS:
            steps += 1
            value, slope = value_and_slope(beta)
            if value == 0.0 or not math.isfinite(value):
                break
            if not math.isfinite(slope) or abs(slope) < NEWTON_MIN_SLOPE:
                break  # flat: no safe step, keep the current estimate
            new_beta = min(max(beta - value / slope, BETA_MIN), BETA_MAX)
            converged = abs(new_beta - beta) < NEWTON_TOLERANCE
            beta = new_beta
            if converged:
                break
        return beta, steps

    def update_beta(self) -> float:
        """Re-estimate beta, the root of V (T(beta) = 0), by Newton's method with V' from
        autograd, warm-started from the current beta: at most 20 steps, stopping when a step is
        below 1e-6, each iterate clamped into [0, 2]; a flat V (|V'| ~ 0) stops it where it is.
        Evaluated in float64. Until some call has found a root (|V| <= ROOT_TOLERANCE), a call
        that finds none keeps beta at beta0; after that, the clamped estimate stands. Returns
        the new beta; ``last_newton_steps`` says how many evaluations it took."""
        beta, steps = self._newton(self.beta)
        self.last_newton_steps = steps
        if abs(self._potential64(beta)) <= ROOT_TOLERANCE:
            self.beta_rooted = True
        elif not self.beta_rooted:
            # a fresh statistics network often has no root in [0, 2]; clamping would give
            # beta = 0, and the first embedding step would keep no negative at all. Algorithm
            # 1 starts from beta0 (line 2) and updates the embedding first (t = 0): beta0
            # stands until the critic has a root (docs/reproducing.md, "RankMI's first step").
            return self.beta
        self.beta_state.fill_(beta)
        self._beta = beta  # a Python float: the float64 buffer's value, exactly
        return beta

    @torch.no_grad()
    def _potential64(self, x: float) -> float:
        """V(x) in float64, as Newton evaluates it."""
        params = {name: p.detach().to(torch.float64) for name, p in self.critic.named_parameters()}
        device = next(self.critic.parameters()).device
        point = torch.tensor([[x]], dtype=torch.float64, device=device)
        return float(functional_call(self.critic, params, (point,)).squeeze() - x)

    # ------------------------------------------------------------------ embedding step
    def select_pairs(
        self, distances: torch.Tensor, labels: torch.Tensor, dim: int
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """Algorithm 1, lines 19-21: ``((anchors, positives), (anchors', negatives))``.

        Positive ordered pairs are kept when d+ > beta - alpha and, independently, negatives
        when d- < beta + alpha; then one negative per positive (anchor, positive) pair of the
        batch, kept or not, is drawn by distance-weighted sampling among that anchor's kept
        negatives. So an anchor whose positives were all dropped still pushes its violating
        negatives away; an anchor with no kept negative gets none."""
        beta = self.beta
        d = distances.detach()
        positive_mask, negative_mask = label_masks(labels.to(d.device))
        kept_positive = positive_mask & (d > beta - self.margin)
        kept_negative = negative_mask & (d < beta + self.margin)
        anchors, positives = kept_positive.nonzero(as_tuple=True)
        # one draw per positive pair (kept or not): the anchor's share of negatives follows
        # its number of positives, as in Algorithm 1, whatever the positive filter dropped
        draw_anchors = positive_mask.nonzero(as_tuple=True)[0]
        negatives, has_negative = distance_weighted_sample(
            d, kept_negative, draw_anchors, dim, self.dws_cutoff, self.generator
        )
        return (anchors, positives), (draw_anchors[has_negative], negatives[has_negative])

    @float32_loss
    def forward(self, emb: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The embedding step (Algorithm 1, lines 18-23): eq. 6 over the margin-violating
        positives and the distance-weighted negatives, the critic frozen."""
        distances = pairwise_distances(emb)
        (anchors, positives), (neg_anchors, negatives) = self.select_pairs(
            distances, labels, emb.shape[1]
        )
        v_positive = self.potential(distances[anchors, positives], frozen=True)
        v_negative = self.potential(distances[neg_anchors, negatives], frozen=True)
        # keep the result attached to the embeddings even when nothing was kept
        return self._divergence(v_positive, v_negative).to(emb.dtype) + emb.sum() * 0.0
