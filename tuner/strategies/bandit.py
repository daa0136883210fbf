"""The adaptive policy: a discounted, contextual Gaussian-process bandit with change detection.

Bayesian optimization assumes one fixed objective. A running job's objective moves: load
changes, other jobs contend for the network, the gradient noise scale grows as training goes
on. This policy is a non-stationary contextual bandit over the lattice of the space; it never
stops: it keeps re-measuring good arms, which is how it notices that the world changed.

- **Arms**: every lattice configuration at ``resolution`` points per integer parameter.
- **Reward model**: a small numpy GP (Matern 5/2, isotropic in lattice steps, length scale
  picked from ``lengthscales`` by marginal likelihood) in which trial ``i`` has weight ``w_i``
  and noise variance ``noise_i^2 / w_i`` (a weighted GP bandit, Deng et al. 2022): old or
  dissimilar evidence is not dropped but trusted less. Rewards are ``log(value + c)`` when the
  values are not negative (``c`` = 0, or 5% of the median when some are 0): throughput noise is
  multiplicative. ``noise_i`` is the trial's stderr plus a floor: the larger of ``noise_floor``
  and the noise seen between consecutive repeats of the same arm (robust median estimate),
  taken from the repeats since the latest change point once there are 3 of them (conditions
  that move the optimum change the noise too).
- **Weights**: ``discount ** age`` (age in trials, newest 0) for gradual drift; times a Gaussian
  similarity of relative context differences (``{"load": ...}`` on observations and on
  ``ask``), so evidence from other conditions counts less and conditions seen before are
  recalled; times ``forget x fade ** n`` for everything before the latest change point, ``n``
  the number of trials since it.
- **Change detection**: each trial is compared with the earlier measurements of the *same* arm
  (weighted mean); ``change_confirmations`` (2) deviations in a row in the same direction, each
  over ``change_z`` standard deviations (stderr and the floor above, widened by the
  prediction's own uncertainty), mark a change point at the first of them. One surprise alone
  is too often a straggler or a censored run: on the static problems of ``bench/tuning.py``
  a single surprise marked a change within 20 trials in up to 8 of 20 seeds, two in a row in
  at most 3. Unconfirmed surprises are held out of the prediction later repeats are judged
  against, so that one outlier does not make its ordinary successors look like a change.
  Recomputed from the history on every ask (nothing is stored), so a restart keeps it. Right
  after a change the old evidence, at weight ``forget`` (0.2), is the best guess of the new
  landscape's shape (a slower network rescales the objective and often moves its optimum only
  to a neighbour). With it nearly forgotten (1e-3), the next trials went where an almost
  empty model is most uncertain, the corners of the space: on the measured moves of
  ``bench/tuning.py`` the policy then needed a median of 5-6 trials to regain 95%, BO from
  scratch 4.5-14; with 0.2 it needs 3-7. It fades by ``fade`` (0.7) per new trial, so after
  ten trials (weight 0.006) the new regime's measurements decide alone. The change test
  itself compares a trial only with the measurements since the latest change point.
- **Choice**: the allowed arm with the highest expected improvement over the best posterior
  mean (``policy="ei"``), or the highest upper confidence bound ``mu + beta * sd``
  (``policy="ucb"``). Re-running an arm is allowed. Running trials, arms that failed in the last
  ``failed_cooldown`` trials and OOM-excluded arms are not proposed.

Infeasible trials other than OOM (an SLO violated under load) count as the worst reward seen,
discounted like any other, so the arm is retried once conditions change. OOM is a property of
the hardware, not of the load: OOM-dominated arms are excluded for good (see ``oom_rule``).

Why not a kernel-smoothing (Nadaraya-Watson) Thompson sampler: we tried it first. It cannot
extrapolate a trend, so after a change it re-probed the old good region arm by arm and needed a
median of 16 trials to regain 95% of a moved optimum where BO restarted from scratch needed 8;
this policy needs 4-7 (docs/tuner.md has the numbers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal, TypeAlias

import numpy as np

from tuner.objectives import Direction
from tuner.space import ParamValue, SearchSpace, SpaceError
from tuner.strategies.base import (
    BaseStrategy,
    ConfigKey,
    Observation,
    SpaceExhausted,
    config_key,
    oom_rule,
)

Policy: TypeAlias = Literal["ei", "ucb"]


class AdaptiveBandit(BaseStrategy):
    name = "bandit"

    def __init__(
        self,
        space: SearchSpace,
        *,
        direction: Direction = "maximize",
        seed: int | None = None,
        resolution: int = 8,
        policy: Policy = "ei",
        beta: float = 1.5,
        discount: float = 0.9,
        forget: float = 0.2,
        fade: float = 0.7,
        change_z: float = 3.0,
        change_confirmations: int = 2,
        noise_floor: float = 0.03,
        log_values: bool = True,
        context_scale: float = 0.25,
        lengthscales: Sequence[float] = (1.0, 2.0, 4.0),
        failed_cooldown: int = 5,
        memory: int = 200,
        max_arms: int = 4096,
    ) -> None:
        super().__init__(space, direction=direction, seed=seed)
        if policy not in ("ei", "ucb"):
            raise ValueError(f"unknown policy {policy!r} (ei, ucb)")
        if not 0 < discount <= 1:
            raise ValueError(f"discount must be in (0, 1], got {discount}")
        if not 0 <= forget <= 1:
            raise ValueError(f"forget must be in [0, 1], got {forget}")
        if not 0 < fade <= 1:
            raise ValueError(f"fade must be in (0, 1], got {fade}")
        if not lengthscales or min(lengthscales) <= 0:
            raise ValueError(f"lengthscales must be positive, got {lengthscales!r}")
        if min(change_z, context_scale, beta) <= 0 or noise_floor < 0:
            raise ValueError("change_z, context_scale and beta must be > 0, noise_floor >= 0")
        if change_confirmations < 1:
            raise ValueError(f"change_confirmations must be >= 1, got {change_confirmations}")
        if resolution < 2 or memory < 1 or failed_cooldown < 0:
            raise ValueError("resolution >= 2, memory >= 1 and failed_cooldown >= 0")
        size = space.grid_size(resolution)
        if size > max_arms:
            raise SpaceError(
                f"bandit: {size} arms at resolution {resolution} exceed max_arms {max_arms}; "
                "lower the resolution"
            )
        self.resolution = resolution
        self.policy: Policy = policy
        self.beta = beta
        self.discount = discount
        self.forget = forget
        self.fade = fade
        self.change_z = change_z
        self.change_confirmations = change_confirmations
        self.noise_floor = noise_floor
        self.log_values = log_values
        self.context_scale = context_scale
        self.lengthscales = tuple(float(x) for x in lengthscales)
        self.failed_cooldown = failed_cooldown
        self.memory = memory
        self._arms = space.grid(resolution)
        self._arm_keys = [config_key(a) for a in self._arms]
        self._arm_coords = space.lattice_coordinates(self._arms, resolution)

    # ------------------------------------------------------------------ ask

    def _ask(
        self, history: Sequence[Observation], context: Mapping[str, float] | None
    ) -> Mapping[str, ParamValue]:
        allowed = self._allowed(history)
        if not allowed.any():
            raise SpaceExhausted("bandit: every arm is excluded (OOM, running or failed)")
        evidence = self._evidence(history)
        if evidence is None:
            # Nothing to learn from yet: an untried allowed arm, at random (seeded).
            rng = self._rng(history)
            tried = {config_key(o.config) for o in history if not o.prior}
            fresh = [i for i in np.flatnonzero(allowed) if self._arm_keys[i] not in tried]
            pick = fresh or list(np.flatnonzero(allowed))
            return self._arms[int(pick[int(rng.integers(len(pick)))])]

        obs, y, stderr, relative, floor, changed = evidence
        coords = self.space.lattice_coordinates([o.config for o in obs], self.resolution)
        now = context if context is not None else dict(obs[-1].context)
        start = int(np.argmax(changed == 1.0))  # the first trial after the latest change
        if start:
            # Conditions that move the optimum move the noise too (a contended network is
            # slower and steadier): once the arms re-measured since the change say how
            # noisy they are now, that is the floor, not the mix of both regimes.
            since = _repeat_noise(obs[start:], y[start:], relative)
            if since > 0:
                floor = max(self.noise_floor, since)
        weights = self._weights(obs, now) * changed
        absolute_floor = floor * abs(float(np.average(y, weights=weights))) if relative else floor
        model = _WeightedGP.fit(coords, y, weights, stderr, absolute_floor, self.lengthscales)

        index = np.flatnonzero(allowed)
        mu, sd = model.predict(self._arm_coords[index])
        if self.policy == "ucb":
            score = mu + self.beta * sd
        else:
            score = _expected_improvement(mu, sd, float(mu.max()))
        return self._arms[int(index[int(np.argmax(score))])]

    def change_point(self, history: Sequence[Observation]) -> int | None:
        """The number of the first trial after the latest change the policy detects in
        ``history``, or ``None`` when it sees none (what ``ask`` acts on; for logs and
        benchmarks)."""
        evidence = self._evidence(history)
        if evidence is None:
            return None
        obs, *_, changed = evidence
        start = int(np.argmax(changed == 1.0))
        return obs[start].number if start else None

    def _evidence(
        self, history: Sequence[Observation]
    ) -> tuple[list[Observation], np.ndarray, np.ndarray, bool, float, np.ndarray] | None:
        """What the model learns from: the informative trials, their rewards and stderrs,
        whether the rewards are linear (noise relative to the level), the noise floor and the
        change multipliers; ``None`` when nothing is informative yet."""
        data, log_scale = self._rewards(history)
        if not data:
            return None
        obs = [o for o, _, _ in data]
        y = np.asarray([r for _, r, _ in data], dtype=float)
        stderr = np.asarray([e for _, _, e in data], dtype=float)
        relative = not log_scale  # linear values: noise proportional to the level
        floor = max(self.noise_floor, _repeat_noise(obs, y, relative))
        changed = self._change_weights(obs, y, stderr, floor, relative)
        return obs, y, stderr, relative, floor, changed

    def _allowed(self, history: Sequence[Observation]) -> np.ndarray:
        dominated = oom_rule(self.space, history)
        own = [o for o in history if not o.prior]
        recent = own[-self.failed_cooldown :] if self.failed_cooldown else []
        blocked = {config_key(o.config) for o in recent if o.state == "failed"}
        blocked |= {config_key(o.config) for o in own if o.state == "running"}
        return np.asarray(
            [
                key not in blocked and not dominated(arm)
                for arm, key in zip(self._arms, self._arm_keys, strict=True)
            ],
            dtype=bool,
        )

    def _log_offset(self, history: Sequence[Observation]) -> float | None:
        """``c`` of the log transform ``log(value + c)``, or ``None`` to stay linear.

        Throughputs and speeds vary, and are noisy, multiplicatively: on log values one noise
        level fits every arm, and a drop to a seventh stands out under 30% noise (on linear
        values with relative noise it would not). A zero (a run that never reached its target)
        gets an offset of 5% of the median positive value instead of minus infinity. Negative
        values stay linear."""
        values = [o.value or 0.0 for o in history if o.state == "complete"]
        if not self.log_values or not values or min(values) < 0 or max(values) <= 0:
            return None
        if min(values) > 0:
            return 0.0
        return 0.05 * float(np.median([v for v in values if v > 0]))

    def _rewards(
        self, history: Sequence[Observation]
    ) -> tuple[list[tuple[Observation, float, float]], bool]:
        """(observation, reward to maximize, its stderr) for the last ``memory`` informative
        trials, and whether the rewards are log values (stderr / value: the delta method)."""
        sign, offset = self._sign(), self._log_offset(history)

        def reward(obs: Observation) -> tuple[float, float]:
            value, stderr = obs.value or 0.0, obs.stderr or 0.0
            if offset is None:
                return sign * value, stderr
            return sign * math.log(value + offset), stderr / (value + offset)

        complete = [reward(o)[0] for o in history if o.state == "complete"]
        worst = min(complete) if complete else None
        data: list[tuple[Observation, float, float]] = []
        for obs in history:
            if obs.state == "complete":
                data.append((obs, *reward(obs)))
            elif obs.state == "infeasible" and not obs.is_oom and worst is not None:
                data.append((obs, worst, 0.0))
        return data[-self.memory :], offset is not None

    # ------------------------------------------------------------------ weights

    def _weights(self, obs: Sequence[Observation], context: Mapping[str, float]) -> np.ndarray:
        weights = self.discount ** np.arange(len(obs) - 1, -1, -1, dtype=float)
        if context:
            weights = weights * np.asarray([self._similarity(o.context, context) for o in obs])
        return np.asarray(weights)

    def _similarity(self, past: Mapping[str, float], now: Mapping[str, float]) -> float:
        shared = [k for k in now if k in past]
        if not shared:
            return 1.0
        # Relative differences, so loads in req/s and contention in % share one scale.
        d2 = sum(((past[k] - now[k]) / max(abs(past[k]), abs(now[k]), 1e-12)) ** 2 for k in shared)
        return math.exp(-d2 / (2 * self.context_scale**2))

    def _change_weights(
        self,
        obs: Sequence[Observation],
        y: np.ndarray,
        stderr: np.ndarray,
        floor: float,
        relative: bool,
    ) -> np.ndarray:
        """``forget`` for every trial before the latest change point, 1 after.

        Only repeated measurements of the same arm are compared: a neighbour differs by the
        slope of the landscape, which is not a change."""
        arm_ids: dict[ConfigKey, int] = {}
        ids = np.asarray([arm_ids.setdefault(config_key(o.config), len(arm_ids)) for o in obs])
        start = 0  # trials before `start` precede the latest change point
        run: list[int] = []  # consecutive surprises in one direction, not yet confirmed
        sign = 0.0
        # Surprises that no second one confirmed are outliers: they do not bias the prediction
        # that later repeats are judged against.
        outlier = np.zeros(len(obs), dtype=bool)
        for j in range(1, len(obs)):
            weights = self.discount ** np.arange(j - 1, -1, -1, dtype=float)
            weights[:start] = 0.0  # a surprise is judged against the current regime only
            weights *= (ids[:j] == ids[j]) & ~outlier[:j]
            strength = float(weights.sum())
            if strength < 0.5:
                continue  # this arm is not known well enough to call a surprise
            predicted = float(weights @ y[:j]) / strength
            noise = math.hypot(stderr[j], floor * (abs(predicted) if relative else 1.0))
            # The prediction is uncertain too, less so with more evidence behind it.
            noise *= math.sqrt(1.0 + 1.0 / strength)
            deviation = y[j] - predicted
            if not (noise > 0 and abs(deviation) > self.change_z * noise):
                run = []  # an unsurprising repeat: whatever came before was noise
                continue
            if not run or math.copysign(1.0, deviation) != sign:
                run, sign = [], math.copysign(1.0, deviation)
            run.append(j)
            outlier[j] = True
            if len(run) >= self.change_confirmations:
                outlier[run] = False  # the first measurements of the new regime
                # A heavy-tailed run (a straggler, a censored run) surprises once; a change
                # surprises again at the next comparable trial.
                start, run = run[0], []
        multipliers = np.ones(len(obs))
        # Right after a change the old regime's evidence is the best guess of the new
        # landscape's shape; it fades as the new regime's own trials come in.
        multipliers[:start] = self.forget * self.fade ** (len(obs) - start)
        return multipliers


def _repeat_noise(obs: Sequence[Observation], y: np.ndarray, relative: bool) -> float:
    """Noise of one measurement from consecutive repeats of the same arm,
    ``1.4826 * median(|difference|) / sqrt(2)``, with differences relative to the level when
    ``relative``. The median ignores the few pairs that straddle a real change; 0 with fewer
    than 3 pairs (the floor then decides)."""
    last: dict[ConfigKey, float] = {}
    diffs: list[float] = []
    for o, value in zip(obs, y, strict=True):
        key = config_key(o.config)
        if key in last:
            scale = (abs(value) + abs(last[key])) / 2 if relative else 1.0
            if scale > 0:
                diffs.append(abs(value - last[key]) / scale)
        last[key] = float(value)
    if len(diffs) < 3:
        return 0.0
    return 1.4826 * float(np.median(diffs)) / math.sqrt(2.0)


def _expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    z = (mu - best) / sd
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return np.asarray((mu - best) * cdf + sd * pdf)


def _matern52(a: np.ndarray, b: np.ndarray, lengthscale: float) -> np.ndarray:
    d = np.sqrt(np.maximum(((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2), 0.0))
    r = math.sqrt(5.0) * d / lengthscale
    return np.asarray((1.0 + r + r * r / 3.0) * np.exp(-r))


class _WeightedGP:
    """GP regression with per-trial noise ``var_i = (stderr_i^2 + floor^2) / w_i``.

    Prior mean: the weighted mean of the rewards; signal variance: their weighted variance
    (at least the noise floor); Matern 5/2 on lattice steps with the length scale of highest
    marginal likelihood among the candidates. A few hundred trials at most, so plain Cholesky.
    """

    def __init__(
        self,
        x: np.ndarray,
        mean: float,
        signal: float,
        lengthscale: float,
        chol: np.ndarray,
        alpha: np.ndarray,
    ) -> None:
        self.x, self.mean, self.signal, self.lengthscale = x, mean, signal, lengthscale
        self.chol, self.alpha = chol, alpha

    @classmethod
    def fit(
        cls,
        x: np.ndarray,
        y: np.ndarray,
        weights: np.ndarray,
        stderr: np.ndarray,
        noise_floor: float,
        lengthscales: Sequence[float],
    ) -> _WeightedGP:
        w = np.maximum(weights, 1e-12)
        mean = float((w * y).sum() / w.sum())
        floor = max(noise_floor, 1e-9)
        signal = max(float((w * (y - mean) ** 2).sum() / w.sum()), floor**2)
        noise = (stderr**2 + floor**2) / w
        centred = y - mean
        best: tuple[float, _WeightedGP] | None = None
        for lengthscale in lengthscales:
            k = signal * _matern52(x, x, lengthscale) + np.diag(noise)
            chol = np.linalg.cholesky(k)  # positive definite: the noise diagonal is > 0
            alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, centred))
            lml = -0.5 * float(centred @ alpha) - float(np.log(np.diag(chol)).sum())
            if best is None or lml > best[0]:
                best = (lml, cls(x, mean, signal, lengthscale, chol, alpha))
        assert best is not None  # lengthscales is never empty
        return best[1]

    def predict(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cross = self.signal * _matern52(at, self.x, self.lengthscale)
        mu = self.mean + cross @ self.alpha
        v = np.linalg.solve(self.chol, cross.T)
        var = np.maximum(self.signal - (v * v).sum(axis=0), 1e-12 * self.signal)
        return np.asarray(mu), np.sqrt(var)
