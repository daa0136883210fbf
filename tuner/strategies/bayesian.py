"""Bayesian optimization: scikit-optimize's Gaussian process, acquisition on the lattice.

Per ``ask`` (stateless; the fitted model is cached by its training data only):

1. **Warm start**: with no trial of its own yet, the study first re-measures the best
   configuration of earlier jobs (same model signature and hardware).
2. **Initial design**: until ``n_initial_points`` trials are complete, the next point of a
   scrambled Sobol sequence (or LHS / random) seeded by ``seed``, skipping what is tried or
   excluded. Infeasible trials do not count, so the design keeps filling the space.
3. **Model**: skopt's GP (``cook_estimator("GP")``: constant x Matern(nu=2.5) kernel with one
   length scale per dimension, learned noise, normalised targets; the same estimator that
   ``skopt.Optimizer(base_estimator="GP")`` builds) fitted on the complete trials, on the log
   of their values when all are positive. skopt minimizes, so a maximized value is negated.
   **Per-trial noise**: a trial's stderr becomes the error variance of its target
   (``log(1 + (stderr/value)^2)`` on log values, the delta method bounded), scaled like the
   normalised targets and added to the kernel's diagonal (scikit-learn's per-sample ``alpha``)
   on top of the learned white noise, which stays the floor: a trial accepted as noisy pulls
   the model less than a precise one at the same point.
   Integer dimensions are skopt ``Integer``s (log-uniform for log parameters); a powers-of-two
   parameter is the integer *exponent*; categoricals are skopt ``Categorical``s of their
   indices. Proposals come from the space's own lattice, so they are plain Python values.
4. **Acquisition**: expected improvement (skopt's ``gaussian_ei``) over the best posterior
   mean at a tried configuration (not the best raw value, which a lucky noisy trial sets)
   times the probability of being feasible, maximized over the lattice of the space (every
   lattice configuration when there are at most ``max_candidates``, otherwise a seeded sample
   plus the neighbours of the best trials), minus everything tried or excluded, within a trust
   region around the three best trials by posterior mean (see ``_trust_region``). We do this
   instead of ``Optimizer.ask()`` because ``ask`` can neither mask configurations nor weight
   by feasibility; on these small integer spaces the lattice is the exact argmax anyway.
5. **Nothing left**: every candidate tried, the tried configuration with the best predicted
   value is measured again (see ``_remeasure``).

Infeasible trials (OOM, failed to start, SLO violated) are handled three ways: (a) never
proposed again; OOMs also exclude every configuration the OOM rule says needs more memory;
(b) told to the GP with a penalty, the worst complete value so far (a constant liar that marks
the region as bad without an extreme value that would wreck the GP's scale); (c) a feasibility
model: ``P(feasible | x) = (1 + sum_f k(x, x_f)) / (1 + sum_f k(x, x_f) + sum_i k(x, x_i))``
with a Gaussian kernel on lattice steps over feasible (f) and infeasible (i) trials, so that the
neighbourhood of an infeasible configuration is avoided unless it is very promising. Running
trials are told at the mean of the complete values (constant liar) so that parallel asks spread.
Failed trials are not proposed again and carry no value.
"""

from __future__ import annotations

import math
import secrets
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
from threadpoolctl import threadpool_limits

from tuner.objectives import Direction
from tuner.space import CategoricalParam, IntParam, ParamValue, SearchSpace
from tuner.strategies.base import (
    BaseStrategy,
    Observation,
    SpaceExhausted,
    best_estimate,
    config_key,
    excluded_rule,
    tried_keys,
)

AcqFunc: TypeAlias = Literal["EI", "PI", "LCB"]
InitialDesign: TypeAlias = Literal["sobol", "lhs", "random"]


class BayesianOptimization(BaseStrategy):
    name = "bayesian"

    def __init__(
        self,
        space: SearchSpace,
        *,
        direction: Direction = "maximize",
        seed: int | None = None,
        n_initial_points: int = 5,
        initial_design: InitialDesign = "sobol",
        acq_func: AcqFunc = "EI",
        xi: float = 0.01,
        kappa: float = 1.96,
        resolution: int = 32,
        max_candidates: int = 4096,
        feasibility_lengthscale: float = 1.0,
        log_values: bool = True,
        trust_radius: float = 0.25,
    ) -> None:
        super().__init__(space, direction=direction, seed=seed)
        if n_initial_points < 1:
            raise ValueError(f"n_initial_points must be >= 1, got {n_initial_points}")
        if initial_design not in ("sobol", "lhs", "random"):
            raise ValueError(f"unknown initial_design {initial_design!r} (sobol, lhs, random)")
        if acq_func not in ("EI", "PI", "LCB"):
            raise ValueError(f"unknown acq_func {acq_func!r} (EI, PI, LCB)")
        if resolution < 2 or max_candidates < 1 or feasibility_lengthscale <= 0:
            raise ValueError("resolution >= 2, max_candidates >= 1, feasibility_lengthscale > 0")
        self.n_initial_points = n_initial_points
        self.initial_design = initial_design
        self.acq_func = acq_func
        self.xi = xi
        self.kappa = kappa
        self.resolution = resolution
        self.max_candidates = max_candidates
        self.feasibility_lengthscale = feasibility_lengthscale
        self.log_values = log_values
        self.trust_radius = trust_radius
        # Without a seed the design still has to be one sequence for this object's lifetime.
        self._seed = seed if seed is not None else secrets.randbelow(2**31)
        # Parameters with a single value are constants: skopt refuses empty ranges.
        self._variable = [p for p in space.params if _is_variable(p)]
        self._variable_names = {p.name for p in self._variable}
        self._skopt_space = _skopt_space(self._variable) if self._variable else None
        self._cache: tuple[tuple[Any, ...], Any] | None = None
        self._design_cache: list[dict[str, ParamValue]] | None = None
        self._static_pool: _Pool | None = None

    # ------------------------------------------------------------------ encoding

    def _encode(self, config: Mapping[str, ParamValue]) -> list[Any]:
        point: list[Any] = []
        for param in self._variable:
            value = config[param.name]
            if isinstance(param, CategoricalParam):
                point.append(param.index(value))
            elif param.powers_of_two:
                point.append(int(value).bit_length() - 1)
            else:
                point.append(int(value))
        return point

    # ------------------------------------------------------------------ ask

    def _ask(
        self, history: Sequence[Observation], context: Mapping[str, float] | None
    ) -> Mapping[str, ParamValue]:
        # Never again: this study's own trials, and configurations that were infeasible on
        # this hardware in earlier jobs.
        tried = tried_keys(history) | {
            config_key(o.config) for o in history if o.prior and o.state == "infeasible"
        }
        dominated = excluded_rule(self.space, history)

        def allowed(config: Mapping[str, ParamValue]) -> bool:
            return config_key(config) not in tried and not dominated(config)

        own = [o for o in history if not o.prior]
        if not own:
            prior_best = best_estimate(history, self.direction, include_prior=True)
            if prior_best is not None and not dominated(prior_best.config):
                return dict(prior_best.config)

        if self._skopt_space is None:
            # Every parameter has a single value: there is one configuration.
            only = self.space.grid(None)[0]
            if allowed(only):
                return only
            raise SpaceExhausted("bayesian: the only configuration of the space was tried")

        complete = [o for o in history if o.state == "complete"]
        distinct = len({config_key(o.config) for o in complete})
        if distinct < max(2, self.n_initial_points):
            design = self._design_point(len(own), allowed)
            if design is not None:
                return design
            if distinct < 2:
                # The design is used up (tried or infeasible) and there is nothing to fit.
                return self._random_point(history, allowed)
        return self._model_point(history, complete, allowed)

    def _random_point(
        self,
        history: Sequence[Observation],
        allowed: Callable[[Mapping[str, ParamValue]], bool],
    ) -> dict[str, ParamValue]:
        left = [c for c in self._pool(history).configs if allowed(c)]
        if not left:
            raise SpaceExhausted("bayesian: every candidate configuration is tried or excluded")
        return left[int(self._rng(history).integers(len(left)))]

    def _design_point(
        self, start: int, allowed: Callable[[Mapping[str, ParamValue]], bool]
    ) -> dict[str, ParamValue] | None:
        for config in self._design()[start:]:
            if allowed(config):
                return config
        return None

    def _design(self) -> list[dict[str, ParamValue]]:
        # The design depends only on the seed and the space: computed once per object.
        if self._design_cache is None:
            # A power of two keeps Sobol's balance properties (and scipy quiet about it).
            count = 1 << max(4, (2 * self.n_initial_points - 1).bit_length())
            dims = len(self.space.params)
            from scipy.stats import qmc  # scipy.stats is slow to import; only BO needs it

            if self.initial_design == "sobol":
                unit = qmc.Sobol(dims, scramble=True, seed=self._seed).random(count)
            elif self.initial_design == "lhs":
                unit = qmc.LatinHypercube(dims, optimization="random-cd", seed=self._seed).random(
                    count
                )
            else:
                unit = np.random.default_rng(self._seed).random((count, dims))
            self._design_cache = [self.space.from_unit(row) for row in unit]
        return self._design_cache

    def _pool(self, history: Sequence[Observation]) -> _Pool:
        """Candidate configurations with their encodings; the whole lattice when it is small
        enough (then computed once), else a seeded sample plus the best trials' neighbours."""
        if self._static_pool is not None:
            return self._static_pool
        if self.space.grid_size(self.resolution) <= self.max_candidates:
            self._static_pool = self._make_pool(self.space.grid(self.resolution))
            return self._static_pool
        rng = self._rng(history, salt=1)
        configs = [self.space.sample(rng) for _ in range(self.max_candidates)]
        ranked = sorted(
            (o for o in history if o.state == "complete"),
            key=lambda o: -self._sign() * (o.value or 0.0),
        )
        for obs in ranked[:3]:
            configs.extend(self.space.neighbours(obs.config, self.resolution))
        unique = {config_key(c): c for c in configs}
        return self._make_pool(list(unique.values()))

    def _make_pool(self, configs: list[dict[str, ParamValue]]) -> _Pool:
        assert self._skopt_space is not None
        return _Pool(
            configs=configs,
            xt=np.asarray(self._skopt_space.transform([self._encode(c) for c in configs])),
            lattice=self.space.lattice_coordinates(configs, self.resolution),
            units=self._units(configs),
        )

    def _model_point(
        self,
        history: Sequence[Observation],
        complete: Sequence[Observation],
        allowed: Callable[[Mapping[str, ParamValue]], bool],
    ) -> dict[str, ParamValue]:
        assert self._skopt_space is not None
        pool = self._pool(history)
        index = np.asarray([i for i, c in enumerate(pool.configs) if allowed(c)], dtype=int)
        model = self._model(history, complete)
        # The incumbent is the best posterior mean at a tried point, not the best raw value:
        # with noisy trials the luckiest measurement would otherwise set the bar (plug-in EI,
        # Picheny et al. 2013) and centre the trust region.
        tried = self._skopt_space.transform([self._encode(o.config) for o in complete])
        fitted = np.asarray(model.predict(tried))
        index = self._trust_region(pool, index, complete, fitted)
        if index.size == 0:
            return self._remeasure(history, complete, model)
        y_opt = float(fitted.min())
        xt = pool.xt[index]
        from skopt.acquisition import gaussian_ei, gaussian_lcb, gaussian_pi

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self.acq_func == "EI":
                acq = gaussian_ei(xt, model, y_opt=y_opt, xi=self.xi)
            elif self.acq_func == "PI":
                acq = gaussian_pi(xt, model, y_opt=y_opt, xi=self.xi)
            else:
                # LCB is minimized; shift it to a positive score to maximize.
                lcb = gaussian_lcb(xt, model, kappa=self.kappa)
                acq = lcb.max() - lcb + 1e-12
        acq = np.asarray(acq, dtype=float) * self._feasibility(history, pool.lattice[index])
        if not np.any(acq > 0):
            # No expected improvement anywhere (a flat model): exploit the predicted best.
            acq = -np.asarray(model.predict(xt), dtype=float)
        return pool.configs[int(index[int(np.argmax(acq))])]

    def _model(self, history: Sequence[Observation], complete: Sequence[Observation]) -> Any:
        """The GP fitted on ``history`` (skopt's sign: lower is better)."""
        sign = self._sign()
        values = [o.value or 0.0 for o in complete]
        log = self.log_values and min(values) > 0
        if log:
            # Throughputs and goodputs vary multiplicatively: a GP on log values sees a
            # smoother surface with one noise level instead of noise that scales with the value.
            values = [math.log(v) for v in values]
        ys = [-sign * v for v in values]  # skopt minimizes
        noise = [_target_variance(o, log) for o in complete]
        xs = [self._encode(o.config) for o in complete]
        worst, mean = max(ys), float(np.mean(ys))
        penalised = [o for o in history if o.state == "infeasible"]
        running = [o for o in history if o.state == "running" and not o.prior]
        xs += [self._encode(o.config) for o in penalised + running]
        ys += [worst] * len(penalised) + [mean] * len(running)
        noise += [0.0] * (len(penalised) + len(running))
        return self._fit(xs, ys, noise)

    def posterior(
        self, history: Sequence[Observation], configs: Sequence[Mapping[str, ParamValue]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The model's mean and standard deviation at ``configs`` after ``history`` (at least
        two complete trials), in the objective's direction and on the model's scale: the log
        of the value when the model works on log values (for logs, tests and benchmarks)."""
        ordered = self._normalise(history)
        complete = [o for o in ordered if o.state == "complete"]
        if self._skopt_space is None or len(complete) < 2:
            raise ValueError("bayesian: the model needs two complete trials and a free parameter")
        with threadpool_limits(limits=1, user_api="blas"):  # as in ask: small matrices
            model = self._model(ordered, complete)
            points = self._skopt_space.transform([self._encode(c) for c in configs])
            mean, sd = model.predict(points, return_std=True)
        return -self._sign() * np.asarray(mean, dtype=float), np.asarray(sd, dtype=float)

    def _remeasure(
        self, history: Sequence[Observation], complete: Sequence[Observation], model: Any
    ) -> dict[str, ParamValue]:
        """Every candidate was tried: measure again the tried configuration with the best
        predicted value. On a small space with noisy measurements that is the most useful next
        trial (the GP averages the repeats), and a control loop keeps a good configuration
        running instead of stopping. Infeasible configurations are never repeated."""
        assert self._skopt_space is not None
        dominated = excluded_rule(self.space, history)
        bad = {config_key(o.config) for o in history if o.state == "infeasible"}
        options = {
            config_key(o.config): dict(o.config)
            for o in complete
            if config_key(o.config) not in bad and not dominated(o.config)
        }
        if not options:
            raise SpaceExhausted(
                f"bayesian: every configuration is tried or excluded and none completed "
                f"({len(tried_keys(history))} trials)"
            )
        configs = list(options.values())
        mu = np.asarray(
            model.predict(self._skopt_space.transform([self._encode(c) for c in configs])),
            dtype=float,
        )
        return configs[int(np.argmin(mu))]  # skopt's sign: lower is better

    def _trust_region(
        self,
        pool: _Pool,
        index: np.ndarray,
        complete: Sequence[Observation],
        fitted: np.ndarray,
    ) -> np.ndarray:
        """The candidates (indices into the pool) within ``trust_radius`` (max-norm on the unit
        cube of each parameter's scale; other categorical choices are outside) of one of the
        three best trials (by the model's posterior mean ``fitted``, skopt's sign: lower is
        better); all of them when none is that close.

        Expected improvement on a GP fitted to 5-15 points over-explores the boundary of the
        space, where its variance is largest; the boundary of a training space (batch 8 or
        1024, bucket 1 MB or 256 MB) is rarely where goodput peaks. A fixed trust region around
        the incumbents (a simplified TuRBO, Eriksson et al. 2019) made the 95%-of-optimum rate
        at 15 trials go from 7/20 to 13/20 seeds on our 3-D problems and never hurt on 2-D.
        """
        if self.trust_radius >= 1 or index.size == 0:
            return index
        ranked = sorted(range(len(complete)), key=lambda i: (fitted[i], complete[i].number))
        top = [complete[i] for i in ranked[:3]]
        centres = self._units([o.config for o in top])
        near = (
            np.abs(pool.units[index][:, None, :] - centres[None, :, :]).max(axis=2)
            <= self.trust_radius + 1e-9
        ).any(axis=1)
        return index[near] if near.any() else index

    def _units(self, configs: Sequence[Mapping[str, ParamValue]]) -> np.ndarray:
        columns = []
        for param in self.space.params:
            if isinstance(param, CategoricalParam):
                # The choice's index: different choices are >= 1 apart, outside any region.
                columns.append([float(param.index(c[param.name])) for c in configs])
            else:
                columns.append(list(param.units(np.asarray([c[param.name] for c in configs]))))
        return np.asarray(columns, dtype=float).T.reshape(len(configs), len(self.space.params))

    def _fit(self, xs: list[list[Any]], ys: list[float], noise: list[float]) -> Any:
        """skopt's GP on ``(xs, ys)``; ``noise``: each point's own error variance in the units
        of ``ys``, added to the kernel's diagonal on top of the learned white noise (which
        stays the floor), so that a noisy trial pulls the posterior less than a precise one."""
        assert self._skopt_space is not None
        key = (tuple(tuple(x) for x in xs), tuple(ys), tuple(noise))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        from skopt.utils import cook_estimator

        model = cook_estimator(
            "GP", space=self._skopt_space, random_state=self._seed, noise="gaussian"
        )
        # The GP normalises the targets (normalize_y) and adds alpha in those units.
        scale = float(np.std(ys)) or 1.0
        model.set_params(alpha=_DIAGONAL_FLOOR + np.asarray(noise) / scale**2)
        with warnings.catch_warnings():
            # Length scales at their bounds are expected with few, clustered points.
            warnings.simplefilter("ignore")
            model.fit(self._skopt_space.transform(xs), ys)
        self._cache = (key, model)
        return model

    def _feasibility(self, history: Sequence[Observation], lattice: np.ndarray) -> np.ndarray:
        infeasible = [o.config for o in history if o.state == "infeasible"]
        if not infeasible:
            return np.ones(len(lattice))
        feasible = [o.config for o in history if o.state == "complete"]
        scale = 2 * self.feasibility_lengthscale**2

        def mass(configs: Sequence[Mapping[str, ParamValue]]) -> np.ndarray:
            if not configs:
                return np.zeros(len(lattice))
            points = self.space.lattice_coordinates(configs, self.resolution)
            d2 = ((lattice[:, None, :] - points[None, :, :]) ** 2).sum(axis=2)
            return np.asarray(np.exp(-d2 / scale).sum(axis=1))

        good, bad = mass(feasible), mass(infeasible)
        return np.asarray((1 + good) / (1 + good + bad))


@dataclass(frozen=True, slots=True)
class _Pool:
    configs: list[dict[str, ParamValue]]
    xt: np.ndarray
    lattice: np.ndarray
    units: np.ndarray


_DIAGONAL_FLOOR = 1e-10
"""scikit-learn's default ``alpha``: keeps the kernel matrix positive definite."""


def _target_variance(obs: Observation, log: bool) -> float:
    """The error variance of a trial's GP target: ``stderr**2``, or on log values
    ``log(1 + (stderr / value)**2)`` (the log-normal variance; ``(stderr / value)**2`` to first
    order, the delta method, and bounded for a very noisy trial). 0 without a stderr."""
    stderr, value = obs.stderr or 0.0, obs.value or 0.0
    if not log:
        return stderr**2
    return math.log1p((stderr / value) ** 2)


def _is_variable(param: IntParam | CategoricalParam) -> bool:
    if isinstance(param, CategoricalParam):
        return len(param.choices) > 1
    return len(param.values(2)) > 1


def _skopt_space(params: Sequence[IntParam | CategoricalParam]) -> Any:
    """The skopt space the GP works in (every dimension normalised to [0, 1]): integers as
    ``Integer`` (log-uniform for log parameters), powers of two as the integer exponent,
    categoricals as ``Categorical`` of their indices (so any JSON scalar works as a choice).

    skopt and scikit-learn take seconds to import; they are imported here, when a Bayesian
    strategy is built, so that ``import tuner`` stays cheap for the API and the collectors.
    """
    from skopt.space import Categorical, Integer, Space
    from skopt.utils import normalize_dimensions

    dims: list[Any] = []
    for param in params:
        if isinstance(param, CategoricalParam):
            dims.append(Categorical(list(range(len(param.choices))), name=param.name))
        elif param.powers_of_two:
            powers = param.values()
            dims.append(
                Integer(int(math.log2(powers[0])), int(math.log2(powers[-1])), name=param.name)
            )
        elif param.log:
            dims.append(
                Integer(param.low, param.high, prior="log-uniform", base=2, name=param.name)
            )
        else:
            dims.append(Integer(param.low, param.high, name=param.name))
    return Space(normalize_dimensions(dims))
