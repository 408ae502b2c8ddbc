"""Checking one case: build, compile natively, run both engines, compare.

:func:`check_case` builds the case's graph, compiles it with geode (default options:
fusion, the LLVM backend) in the given session, and runs every run's feeds through
the compiled model and through the reference interpreter
(:func:`geode.compiler.interpret.run_reference`, numpy kernels with ONNX semantics).
The :class:`Outcome` is

* ``pass``: every run matched, or was refused cleanly: by both engines with a
  GeodeError, or by the compiled model's stated input constraints (an InputError
  ``inputs break constraint ...``: symbolic dims geode assumes non-empty under a
  Slice, say), which are counted apart (``constrained``);
* ``rejected``: geode refused the graph cleanly (a GeodeError while building or
  compiling, or in every run from both engines);
* ``undefined``: a run hits behaviour ONNX leaves undefined (a float cast to an
  integer out of its range, ``0 ** -1`` on integers, an integer to a float power out
  of its range), so no answer is wrong;
* ``invalid``: the case is no fair test (only the shrinker makes such candidates);
* ``fail``: anything else: a non-GeodeError exception anywhere, one engine raising
  where the other computes, or outputs that differ beyond the tolerance policy
  (:mod:`geode.fuzz.compare`) and not explained as rounding noise
  (:mod:`geode.fuzz.noise`). Its ``kind`` says which, for deduplication and for
  the shrinker, which keeps a candidate only if it fails the same way.
"""

from __future__ import annotations

import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geode.codegen.driver import CodegenWarning
from geode.compiler.interpret import run_reference
from geode.compiler.ir import Graph
from geode.errors import GeodeError, InputError
from geode.fuzz import compare, noise, oplib
from geode.fuzz.build import SpecError, build_graph
from geode.fuzz.spec import Case


@dataclass
class Outcome:
    """The verdict on one case (see the module docstring)."""

    status: str
    kind: str = ""
    message: str = ""
    stage: str = ""
    fallbacks: int = 0
    #: why groups fell back to the AICPU engine (the CodegenWarnings' first lines)
    fallback_reasons: list[str] = field(default_factory=list)
    noisy: int = 0
    #: runs the compiled model refused by its own input constraints (symbolic dims it
    #: assumes non-empty, say) where the reference computed: clean refusals, counted
    constrained: int = 0
    kernels: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """Whether the case found a bug."""
        return self.status == "fail"


def _crash(stage: str, exc: BaseException) -> Outcome:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-6))
    return Outcome(
        "fail",
        f"crash:{stage}:{type(exc).__name__}",
        f"{type(exc).__name__} while {stage}: {exc}\n{tb}",
        stage,
    )


def undefined_behaviour(case: Case, values: dict[str, np.ndarray]) -> str | None:
    """Why a run of ``case`` (``values``: every reference value by name) leaves ONNX's
    defined behaviour, or None."""
    for node in case.nodes:
        args = [values.get(a) for a in node.args]
        out = values.get(node.out)
        if out is None or any(a is None for a, n in zip(args, node.args) if n):
            continue
        if node.op == "Cast" and args[0].dtype.kind == "f" and out.dtype.kind in "iu":
            x = args[0].astype(np.float64)
            info = np.iinfo(out.dtype)
            with np.errstate(invalid="ignore"):
                ok = np.isfinite(x) & (x > info.min - 1.0) & (x < info.max + 1.0)
            if not ok.all():
                return f"{node.out}: Cast of {args[0].dtype} out of {out.dtype}'s range"
        if node.op == "Pow" and args[0].dtype.kind in "iu":
            why = _undefined_int_pow(args[0], args[1])
            if why:
                return f"{node.out}: {why}"
    return None


def _undefined_int_pow(base: np.ndarray, exponent: np.ndarray) -> str | None:
    """Why an integer Pow is undefined: 0 to a negative power, or (a float exponent:
    computed in double, then truncated) a power that is NaN or out of range."""
    with np.errstate(all="ignore"):
        b, e = np.broadcast_arrays(base, exponent)
        if ((b == 0) & (e < 0)).any():
            return "integer 0 to a negative power"
        if e.dtype.kind == "f":
            p = np.power(b.astype(np.float64), e.astype(np.float64))
            info = np.iinfo(base.dtype)
            ok = np.isfinite(p) & (p > info.min - 1.0) & (p < info.max + 1.0)
            if not ok.all():
                return "integer to a float power out of range"
    return None


class Checker:
    """Checks cases in one geode session (compile options fixed for the run)."""

    def __init__(self, session: Any, compile_options: dict[str, Any] | None = None):
        self.session = session
        self.options = dict(compile_options or {})

    def check(self, case: Case) -> Outcome:
        """Build, compile, run and compare ``case`` (never raises). numpy's warnings
        about IEEE results (overflow, invalid values) are silenced: NaN and Inf are
        inputs here on purpose."""
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            return self._check(case)

    def _check(self, case: Case) -> Outcome:
        try:
            graph = build_graph(case)
        except SpecError as exc:
            return Outcome("invalid", message=str(exc), stage="build")
        except GeodeError as exc:
            return Outcome("rejected", message=f"{type(exc).__name__}: {exc}", stage="build")
        except Exception as exc:  # noqa: BLE001 - the fuzzer's job is to catch these
            return _crash("build", exc)
        dtype_of = {v.name: str(v.dtype) for v in graph.values.values()}
        bad = oplib.inexact_discontinuities(case, dtype_of)
        if bad:
            return Outcome("invalid", message=f"inexact floats into {bad}", stage="build")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", CodegenWarning)
                model = self.session.compile(graph, **self.options)
        except GeodeError as exc:
            return Outcome("rejected", message=f"{type(exc).__name__}: {exc}", stage="compile")
        except Exception as exc:  # noqa: BLE001
            return _crash("compile", exc)
        reasons = [
            str(w.message).splitlines()[0] for w in caught if issubclass(w.category, CodegenWarning)
        ]
        kernels: dict[str, int] = {}
        for k in model.kernels:
            kernels[k.engine] = kernels.get(k.engine, 0) + 1
        outcome = self._runs(case, graph, model)
        outcome.fallbacks, outcome.fallback_reasons = len(reasons), reasons
        outcome.kernels = kernels
        return outcome

    def _runs(self, case: Case, graph: Graph, model: Any) -> Outcome:
        refused = constrained = noisy = 0
        for run, feeds in enumerate(case.feeds):
            result = self._run(case, graph, model, run, feeds)
            if isinstance(result, Outcome):
                if result.status != "pass":
                    return result
                noisy += result.noisy
            elif result == "constraint":
                constrained += 1
            else:
                refused += 1
        if refused + constrained == len(case.feeds):
            why = "by both engines" if not constrained else "(compiled: by its input constraints)"
            out = Outcome("rejected", message=f"every run refused {why}", stage="run")
        else:
            out = Outcome("pass", noisy=noisy)
        out.constrained = constrained
        return out

    def _run(
        self, case: Case, graph: Graph, model: Any, run: int, feeds: dict[str, np.ndarray]
    ) -> Outcome | str:
        """One run: an Outcome, ``"refused"`` when both engines raised a GeodeError, or
        ``"constraint"`` when the compiled model refused the inputs by a constraint it
        states (``inputs break constraint ...``, an InputError)."""
        ref_error = got_error = None
        try:
            want = run_reference(graph, feeds, keep_all=True)
        except GeodeError as exc:
            ref_error, want = exc, {}
        except Exception as exc:  # noqa: BLE001
            return _crash(f"reference run {run}", exc)
        if ref_error is None:
            why = undefined_behaviour(case, {**_constants(graph), **feeds, **want})
            if why is not None:
                return Outcome("undefined", message=f"run {run}: {why}", stage="run")
        try:
            got = model.run(feeds)
        except GeodeError as exc:
            got_error, got = exc, {}
        except Exception as exc:  # noqa: BLE001
            return _crash(f"compiled run {run}", exc)
        if ref_error is not None and got_error is not None:
            return "refused"
        if ref_error is not None:
            return Outcome(
                "fail",
                f"error-mismatch:reference-raised:{type(ref_error).__name__}",
                f"run {run}: the reference raised {type(ref_error).__name__}: {ref_error}; "
                "the compiled model returned a result",
                "run",
            )
        if isinstance(got_error, InputError) and "inputs break constraint" in str(got_error):
            return "constraint"  # a symbolic-dim contract geode states and checks: clean
        if got_error is not None:
            return Outcome(
                "fail",
                f"error-mismatch:compiled-raised:{type(got_error).__name__}",
                f"run {run}: the compiled model raised {type(got_error).__name__}: {got_error}; "
                "the reference computed a result",
                "run",
            )
        return self._compare(case, feeds, {**_constants(graph), **want}, got, run)

    def _compare(self, case: Case, feeds: dict, want: dict, got: dict, run: int) -> Outcome:
        values = {**feeds, **want}
        noisy = 0
        for name in case.outputs:
            if name not in got:
                return Outcome("fail", "missing-output", f"run {run}: no output {name!r}", "run")
            nodes = case.ancestors(name)
            ancestors = [values[n.out] for n in nodes if n.out in values]
            ancestors += [feeds[a] for n in nodes for a in n.args if a in feeds]
            if name in feeds:
                ancestors.append(feeds[name])
            cls = oplib.rounding_class(case, name)
            scale = compare.finite_scale(ancestors)
            precision = compare.least_precise([*ancestors, want[name]])
            miss = compare.compare_output(name, got[name], want[name], cls, scale, precision)
            if miss is None:
                continue
            if miss.mask is not None and want[name].dtype.kind == "f" and cls != "exact":
                rtol = compare.RTOL[precision or str(want[name].dtype)][cls]
                if noise.order_dependent(case, values, name) or self._noise(
                    case, name, got[name], want[name], miss.mask, run, rtol
                ):
                    noisy += 1
                    continue
            return Outcome("fail", f"mismatch:{miss.kind}", f"run {run}: {miss.message}", "compare")
        return Outcome("pass", noisy=noisy)

    def _noise(
        self,
        case: Case,
        name: str,
        got: np.ndarray,
        want: np.ndarray,
        mask: np.ndarray,
        run: int,
        rtol: float,
    ) -> bool:
        """Whether the mismatch of output ``name`` is rounding noise (:mod:`geode.fuzz.noise`)."""
        runs = noise.perturbed_runs(case, case.feeds[run], [case.seed, case.index, run])
        perturbed = [r[name] for r in runs if name in r]
        wide = noise.wide_run(case, run)
        return noise.explained(
            got, want, mask, perturbed, None if wide is None else wide.get(name), rtol
        )


def _constants(graph: Graph) -> dict[str, np.ndarray]:
    """The graph's constants by name (a case's Const nodes)."""
    return {v.name: np.asarray(v.data) for v in graph.constants() if v.data is not None}
