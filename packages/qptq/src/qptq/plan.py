"""What a static PTQ run decides, as one value the stages fill in turn and the rewrite reads.

The stages of :class:`~qptq.static.PostTrainingQuantization`, each a plain function:

1. graph preparation (batch norms folded into their convs, always; ``auto``'s activation smoothing,
   :func:`qptq.smooth.smooth_graph`) and the targets (:meth:`qptq.config.TargetConfig.targets`);
2. calibration (:func:`qptq.sharded.calibrate_sharded`);
3. :func:`choose`: every algo's threshold per activation, ``auto``'s choices -> a :class:`Plan`;
4. AdaRound's weights (:func:`qptq.adaround.adaround_targets`) -> :attr:`Plan.rounded`;
5. the accuracy budget's search (:func:`qptq.budget.search`) -> :attr:`Plan.keep_float`;
6. the rewrite and bias correction (:mod:`qptq.rewrite`), on the graph and on every budget candidate;
7. the report (:mod:`qptq.report`), which only reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from qcore.deploy import Deployment, Targets
from qcore.graph import Graph
from qcore.thresholds import thresholds_all_algos

from .adaround import AdaRounded
from .auto import AUTO, AutoChoice, choose_thresholds
from .calibrate import Calibration
from .smooth import Smoothing


@dataclass
class Plan:
    """The targets, every candidate threshold, and what the stages chose; enough to rewrite any clone."""

    targets: Targets
    algo: str  # the run's algo: the key of :attr:`candidates` the rewrite takes
    grids: str  # the run's activation grids ("symmetric", "asymmetric", "unsigned")
    candidates: dict[str, dict[str, float]]  # activation -> algo -> threshold
    ranges: dict[str, tuple[float, float]]  # activation -> (min, max) seen during calibration
    auto: dict[str, AutoChoice] = field(default_factory=dict)
    smoothing: list[Smoothing] = field(default_factory=list)
    rounded: dict[int, AdaRounded] = field(default_factory=dict)  # AdaRound's weights, by position in targets
    keep_float: dict[int, str] = field(default_factory=dict)  # layers left float, by position, with the reason

    def chosen(self) -> dict[str, float]:
        """The threshold of :attr:`algo` for every activation."""
        return {name: algos[self.algo] for name, algos in self.candidates.items()}

    def grid(self, deployment: Deployment, name: str, threshold: float, grids: str | None = None
             ) -> tuple[float, float]:
        """The ``(threshold, offset)`` activation ``name`` deploys with (:meth:`Deployment.activation_grid`) on
        ``grids`` (default: ``auto``'s choice for it, else the run's); symmetric grids need no calibrated range
        (oneDNN's shared scales reach tensors not calibrated)."""
        choice = self.auto.get(name)
        grids = grids or (choice.grid if choice is not None and choice.grid else self.grids)
        if grids == "symmetric":
            return threshold, 0.0
        return deployment.activation_grid(grids, threshold, *self.ranges[name])

    def grid_of(self, deployment: Deployment, grids: str | None = None) -> Callable[[str, float], tuple[float, float]]:
        """:meth:`grid` as ``(name, threshold) -> (threshold, offset)`` (what :mod:`qptq.auto` scores)."""
        return lambda name, threshold: self.grid(deployment, name, threshold, grids)


def choose(graph: Graph, targets: Targets, calibration: Calibration, *, algo: str, grids: str, hist_percent: float,
           deployment: Deployment, smoothing: list[Smoothing]) -> Plan:
    """Every algo's threshold for every calibrated activation and, for ``algo="auto"``, the one whose readers'
    output error is lowest (:func:`qptq.auto.choose_thresholds`; where the run's grid is symmetric for signed
    tensors and the target reads zero points, the asymmetric grid per activation too)."""
    candidates = {name: thresholds_all_algos(obs, deployment.activation_bits, hist_percent)
                  for name, obs in calibration.observers.items()}
    ranges = {name: (obs.min, obs.max) for name, obs in calibration.observers.items()}
    plan = Plan(targets, algo, grids, candidates, ranges, smoothing=smoothing)
    if algo == AUTO:
        alternative = (plan.grid_of(deployment, "asymmetric")
                       if grids == "unsigned" and deployment.target.asymmetric_activations else None)
        plan.auto = choose_thresholds(graph, targets.ops, candidates, calibration.activation_samples,
                                      deployment.activation_bits, plan.grid_of(deployment), alternative)
    return plan
