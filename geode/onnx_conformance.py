"""The ONNX backend conformance suite for geode: its exclusion list, a runner and a report.

The suites are the ONNX project's own backend tests (``onnx.backend.test``):

* ``node``: one-op models, built in memory by onnx (about 1,900 cases, ~200 op types);
* ``simple``, ``pytorch-converted``, ``pytorch-operator``: small models shipped as files;
* ``light``: the nine bundled "light" zoo models (ResNet-50, DenseNet-121, Inception v1
  and v2, ShuffleNet, SqueezeNet, VGG-19, AlexNet, ZFNet-512), whose outputs on the
  runner's deterministic inputs ship with onnx. The downloadable ``real`` models are
  not run.

Every case is compiled through the full pipeline with geode's default options (fusion
and AI Core kernels on). :data:`EXCLUSIONS` is the one list of cases geode does not run,
each pattern with its reason, and :data:`TOLERANCES` the cases run at a wider tolerance
than onnx's, each with its reason; ``tests/test_onnx_backend.py`` and the report both
read them.

Regenerate the report (``docs/onnx_conformance.md``) with::

    python -m geode.onnx_conformance            # all suites
    python -m geode.onnx_conformance --suite node --filter '^test_conv'   # a look, no file
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import os
import re
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: suites in report order
SUITES: tuple[str, ...] = ("node", "simple", "pytorch-converted", "pytorch-operator", "light")

_SEQ = "Sequence and Optional types: geode imports and computes on tensors only"
_BF16 = (
    "bfloat16 arithmetic: geode carries bfloat16 tensors (Cast, quantization, data movement) "
    "but computes in no bfloat16 op"
)

#: The one exclusion list: (regular expression searched in the test name, as the onnx
#: runner names it, e.g. ``test_abs_cpu``; reason). Reasons starting with "codegen bug:"
#: are bugs in geode's code generation, kept here until they are fixed. The patterns are
#: anchored: each names the cases it means and nothing else.
EXCLUSIONS: list[tuple[str, str]] = [
    # domains geode does not implement
    (r"^test_ai_onnx_ml_", "ai.onnx.ml domain (classical ML: trees, encoders) is not supported"),
    (
        r"^test_(adagrad|adam|momentum|nesterov_momentum)(_multiple)?_cpu$",
        "ai.onnx.preview.training optimizers are training-only",
    ),
    (r"^test_gradient_of_", "ai.onnx.preview.training Gradient is training-only"),
    (
        r"^test_flexattention",
        "FlexAttention is in the experimental ai.onnx.preview domain (score/prob modifier "
        "subgraphs); not implemented",
    ),
    # ops out of scope
    (
        r"^test_image_decoder_",
        "ImageDecoder decodes JPEG/PNG/BMP/WebP/TIFF bytes: image codecs are out of scope",
    ),
    (
        r"^test_bernoulli(_double|_seed)?(_expanded)?_cpu$",
        "random number generation (Bernoulli, RandomUniformLike) is not implemented; its "
        "values could not match the reference's generator anyway",
    ),
    # types geode does not compute in
    (r"^test_(sequence_|split_to_sequence_|optional_)", _SEQ),
    (r"^test_(identity_opt|identity_sequence|if_opt|if_seq|loop13_seq|loop16_seq_none)_cpu$", _SEQ),
    (r"^test_attention_(3d|4d)_[a-z_]*bf16(_expanded)?_cpu$", _BF16),
    (r"^test_celu_bfloat16(_expanded)?_cpu$", _BF16),
    (r"^test_einsum_(batch_matmul|sum|transpose)_bfloat16_cpu$", _BF16),
    (r"^test_(onehot_with_bfloat16_values|range_bfloat16_type_positive_delta)_cpu$", _BF16),
    (r"^test_(reversesequence_bfloat16|unique_bfloat16_sorted_without_axis)_cpu$", _BF16),
    # opsets outside the importer's range
    (r"^test_not_[234]d_cpu$", "opset 1 model: geode imports ai.onnx opsets 6 to 28"),
    (
        r"^test_scan_sum_cpu$",
        "Scan-8 (the batched form with sequence_lens) is not supported; Scan-9+ is",
    ),
]

#: Cases that run with a wider tolerance than onnx gives them: test name -> (rtol, atol,
#: reason). They run and count as passed when they pass at this tolerance.
TOLERANCES: dict[str, tuple[float, float, str]] = {
    name: (
        2e-3,
        1e-3,
        "float16 softmax attention: geode evaluates float16 ops in float32 and rounds once per "
        "op; the expected values round every intermediate in float16; 2 of 192 outputs differ "
        "by 1-2 float16 ulps (5e-4), above rtol 1e-3",
    )
    for name in ("test_attention_4d_causal_fp16", "test_attention_4d_causal_fp16_expanded")
}

#: the nine bundled light models (onnx's ``real`` tests whose models ship with onnx)
LIGHT_MODELS: tuple[str, ...] = (
    "test_bvlc_alexnet",
    "test_densenet121",
    "test_inception_v1",
    "test_inception_v2",
    "test_resnet50",
    "test_shufflenet",
    "test_squeezenet",
    "test_vgg19",
    "test_zfnet512",
)

#: the smallest number of node cases that must run (not be skipped) in the test module,
#: so that the suite can never pass by loading nothing
MIN_NODE_CASES_RUN = 1500


def _default_report() -> str:
    """docs/onnx_conformance.md of the source tree geode runs from (else under the cwd)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.exists(os.path.join(root, "pyproject.toml")):
        return os.path.join(root, "docs", "onnx_conformance.md")
    return os.path.join("docs", "onnx_conformance.md")


DEFAULT_REPORT = _default_report()


def exclusion_reason(test_name: str) -> str | None:
    """The reason a test (``test_xxx`` or ``test_xxx_cpu``) is excluded, or None."""
    name = test_name if test_name.endswith("_cpu") else f"{test_name}_cpu"
    for pattern, reason in EXCLUSIONS:
        if re.search(pattern, name):
            return reason
    return None


# -- loading cases -----------------------------------------------------------------------
@dataclass
class Case:
    """One conformance case: a model and its input/expected-output data sets."""

    suite: str
    name: str
    rtol: float
    atol: float
    _test: Any = None  #: the onnx TestCase
    _model: Any = None
    _data: list[tuple[list[Any], list[Any]]] | None = None

    @property
    def model(self) -> Any:
        """The ModelProto (loaded on first use)."""
        if self._model is None:
            self._load()
        return self._model

    @property
    def data_sets(self) -> list[tuple[list[Any], list[Any]]]:
        """``[(inputs, expected_outputs), ...]``."""
        if self._data is None:
            self._load()
        assert self._data is not None
        return self._data

    def op_types(self) -> list[str]:
        """The op types of the model's main graph (``domain:op`` outside ai.onnx), sorted."""
        ops = set()
        for n in self.model.graph.node:
            dom = "" if n.domain in ("", "ai.onnx") else n.domain + ":"
            ops.add(dom + n.op_type)
        return sorted(ops)

    def _load(self) -> None:
        import onnx

        t = self._test
        if self.suite == "node":
            self._model = t.model
            self._data = [
                ([_as_array(x) for x in ins], [_as_array(x) for x in outs])
                for ins, outs in t.data_sets
            ]
            return
        if self.suite == "light":
            from onnx.backend.test.runner import Runner

            path = _light_path(t.url)
            model = onnx.load(path)
            inits = {i.name for i in model.graph.initializer}
            inputs = [
                Runner.generate_dummy_data(vi, seed=0, name=t.model_name, random=False)
                for vi in model.graph.input
                if vi.name not in inits
            ]
            prefix = os.path.splitext(path)[0]
            outputs = []
            for i in range(len(model.graph.output)):
                outputs.append(_read_proto(f"{prefix}_output_{i}.pb", model.graph.output[i].type))
            self._model, self._data = model, [(inputs, outputs)]
            return
        model = onnx.load(os.path.join(t.model_dir, "model.onnx"))
        data = []
        for d in sorted(glob.glob(os.path.join(t.model_dir, "test_data_set*"))):
            n_in = len(glob.glob(os.path.join(d, "input_*.pb")))
            n_out = len(glob.glob(os.path.join(d, "output_*.pb")))
            ins = [
                _read_proto(os.path.join(d, f"input_{i}.pb"), model.graph.input[i].type)
                for i in range(n_in)
            ]
            outs = [
                _read_proto(os.path.join(d, f"output_{i}.pb"), model.graph.output[i].type)
                for i in range(n_out)
            ]
            data.append((ins, outs))
        self._model, self._data = model, data


def _as_array(x: Any) -> Any:
    import onnx
    from onnx import numpy_helper

    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    return x


def _read_proto(path: str, type_proto: Any) -> Any:
    import onnx
    from onnx import numpy_helper

    with open(path, "rb") as f:
        content = f.read()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(content)
        return numpy_helper.to_list(seq)
    if type_proto.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(content)
        return numpy_helper.to_optional(opt)
    t = onnx.TensorProto()
    t.ParseFromString(content)
    return numpy_helper.to_array(t)


def _light_path(url: str) -> str:
    import onnx

    root = os.path.dirname(os.path.dirname(os.path.abspath(onnx.__file__)))
    return os.path.normpath(os.path.join(root, url))


def is_light(test: Any) -> bool:
    """Whether an onnx ``real`` TestCase is one of the bundled light models."""
    return bool(test.url) and test.url.startswith("onnx/backend/test/data/light/")


def load_cases(suite: str) -> list[Case]:
    """The cases of one suite, sorted by name."""
    from onnx.backend.test.loader import load_model_tests

    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; suites are {SUITES}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnx's case generators warn about their own casts
        with np.errstate(all="ignore"):
            tests = load_model_tests(kind="real" if suite == "light" else suite)
    if suite == "light":
        tests = [t for t in tests if is_light(t)]
    cases = [Case(suite, t.name, t.rtol, t.atol, _test=t) for t in tests]
    return sorted(cases, key=lambda c: c.name)


# -- running -----------------------------------------------------------------------------
@dataclass
class Result:
    """The outcome of one case."""

    suite: str
    name: str
    ops: list[str]
    status: str  #: "passed", "failed" or "excluded"
    detail: str = ""  #: exclusion reason or failure message
    seconds: float = 0.0
    codegen_warnings: list[str] = field(default_factory=list)
    aicore_kernels: int = 0
    stage: str = ""  #: "import", "compile", "run" or "compare" for failures


def _first_line(text: str, limit: int = 240) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit] + "..."


def assert_outputs(expected: Sequence[Any], got: Sequence[Any], rtol: float, atol: float) -> None:
    """The onnx runner's comparison (shape, dtype, allclose) of outputs with references."""
    from onnx.backend.test.runner import Runner

    Runner.assert_similar_outputs(list(expected), list(got), rtol=rtol, atol=atol)


def run_case(case: Case, **options: Any) -> Result:
    """Compile ``case``'s model with geode's backend and check every data set."""
    from geode.codegen.driver import CodegenWarning
    from geode.onnx_backend import GeodeBackend

    reason = exclusion_reason(case.name)
    if reason is not None:
        ops = _safe_ops(case)
        return Result(case.suite, case.name, ops, "excluded", reason)
    rtol, atol = case.rtol, case.atol
    if case.name in TOLERANCES:
        rtol, atol = TOLERANCES[case.name][:2]
    t0 = time.perf_counter()
    stage = "load"
    ops: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CodegenWarning)
        try:
            model = case.model
            ops = case.op_types()
            stage = "compile"
            rep = GeodeBackend.prepare(model, "CPU", **options)
            n_aicore = sum(1 for k in rep.model.kernels if k.engine == "aicore")
            for inputs, expected in case.data_sets:
                stage = "run"
                got = rep.run(inputs)
                stage = "compare"
                assert_outputs(expected, got, rtol, atol)
        except Exception as exc:  # noqa: BLE001 - a failing case is a result, not a crash
            msg = f"{type(exc).__name__}: {_first_line(str(exc))}"
            if isinstance(exc, AssertionError):
                msg = "AssertionError: " + " ".join(str(exc).split())[:300]
            return Result(
                case.suite,
                case.name,
                ops,
                "failed",
                msg,
                time.perf_counter() - t0,
                _codegen(caught, CodegenWarning),
                stage=stage,
            )
    return Result(
        case.suite,
        case.name,
        ops,
        "passed",
        "",
        time.perf_counter() - t0,
        _codegen(caught, CodegenWarning),
        n_aicore,
    )


def _safe_ops(case: Case) -> list[str]:
    try:
        return case.op_types()
    except Exception:  # noqa: BLE001
        return []


def _codegen(caught: Iterable[warnings.WarningMessage], cls: type) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, cls)]


def run_suites(
    suites: Sequence[str] = SUITES,
    name_filter: str | None = None,
    progress: bool = False,
    **options: Any,
) -> list[Result]:
    """Run the given suites (cases whose names match ``name_filter`` only, when given)."""
    results: list[Result] = []
    for suite in suites:
        cases = load_cases(suite)
        if name_filter:
            cases = [c for c in cases if re.search(name_filter, c.name)]
        for i, case in enumerate(cases):
            if progress:
                print(f"[{suite} {i + 1}/{len(cases)}] {case.name}", file=sys.stderr, flush=True)
            with np.errstate(all="ignore"):
                r = run_case(case, **options)
            results.append(r)
            if progress and r.status == "failed":
                print(f"    FAILED ({r.stage}): {r.detail}", file=sys.stderr, flush=True)
    return results


# -- the report --------------------------------------------------------------------------
def _counts(results: Iterable[Result]) -> collections.Counter:
    return collections.Counter(r.status for r in results)


def _pct(n: int, d: int) -> str:
    return f"{100.0 * n / d:.1f}%" if d else "n/a"


def format_report(
    results: Sequence[Result], seconds: float | None = None, command: str = ""
) -> str:
    """The conformance report as Markdown."""
    by_suite: dict[str, list[Result]] = collections.defaultdict(list)
    for r in results:
        by_suite[r.suite].append(r)
    lines = ["# ONNX backend conformance", ""]
    lines.append(
        "Generated by `python -m geode.onnx_conformance`; do not edit by hand. Every case is "
        "compiled through the full pipeline with geode's default options (fusion and AI Core "
        "kernels on) and compared with onnx's reference outputs at the case's own tolerances. "
        "Excluded cases are listed, with their reasons, in `geode/onnx_conformance.py` "
        "(`EXCLUSIONS`); they count as not passed."
    )
    lines.append("")
    import onnx

    lines.append(
        f"- onnx {onnx.__version__}, numpy {np.__version__}, Python {sys.version.split()[0]}"
    )
    if command:
        lines.append(f"- command: `{command}`")
    if seconds is not None:
        lines.append(f"- run time: {seconds:.0f} s (one process; kernel cache as found)")
    lines.append("")
    lines.append("## Summary")
    lines.append("")
    lines.append("| suite | cases | passed | failed | excluded | pass rate | codegen fallbacks |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    for suite in SUITES:
        rs = by_suite.get(suite)
        if not rs:
            continue
        c = _counts(rs)
        fallbacks = sum(len(r.codegen_warnings) for r in rs)
        lines.append(
            f"| {suite} | {len(rs)} | {c['passed']} | {c['failed']} | {c['excluded']} | "
            f"{_pct(c['passed'], len(rs))} | {fallbacks} |"
        )
    lines.append("")
    lines.append(
        "Pass rate = passed / cases (excluded cases count as not passed). Codegen fallbacks: "
        "fused groups that failed to compile and ran on the AICPU engine instead "
        "(`CodegenWarning`)."
    )
    if TOLERANCES:
        lines += ["", "## Tolerance overrides", ""]
        lines.append("These cases run (and count) at a wider tolerance than onnx gives them:")
        lines.append("")
        lines.append("| case | rtol | atol | reason |")
        lines.append("|---|---:|---:|---|")
        for name, (rtol, atol, why) in sorted(TOLERANCES.items()):
            lines.append(f"| `{name}` | {rtol:g} | {atol:g} | {_md(why)} |")
    for suite in SUITES:
        rs = by_suite.get(suite)
        if not rs:
            continue
        lines.append("")
        if suite == "node":
            lines += _node_table(rs)
        else:
            lines += _model_table(suite, rs)
    warned = [r for r in results if r.codegen_warnings]
    if warned:
        lines += ["", "## Codegen fallbacks", ""]
        for r in warned:
            for w in r.codegen_warnings:
                lines.append(f"- `{r.name}` ({r.suite}): {_md(w)}")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _node_table(rs: Sequence[Result]) -> list[str]:
    lines = ["## Node tests by op type", ""]
    lines.append(
        "A case counts under every op type of its graph's main nodes (so op rows add up to more "
        "than the number of cases)."
    )
    lines.append("")
    lines.append("| op | cases | passed | failed | excluded |")
    lines.append("|---|---:|---:|---:|---:|")
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rs:
        for op in r.ops or ["(unknown)"]:
            per_op[op][r.status] += 1
    for op in sorted(per_op):
        c = per_op[op]
        n = sum(c.values())
        lines.append(f"| {op} | {n} | {c['passed']} | {c['failed']} | {c['excluded']} |")
    lines += ["", "### Failed node cases", ""]
    failed = [r for r in rs if r.status == "failed"]
    if not failed:
        lines.append("(none)")
    for r in failed:
        lines.append(f"- `{r.name}` ({r.stage}): {_md(r.detail)}")
    lines += ["", "### Excluded node cases", ""]
    excluded = [r for r in rs if r.status == "excluded"]
    by_reason: dict[str, list[str]] = collections.defaultdict(list)
    for r in excluded:
        by_reason[r.detail].append(r.name)
    if not excluded:
        lines.append("(none)")
    for reason, names in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"- {_md(reason)} ({len(names)}): " + ", ".join(f"`{n}`" for n in names))
    return lines


def _model_table(suite: str, rs: Sequence[Result]) -> list[str]:
    lines = [f"## {suite}", ""]
    lines.append("| case | result | time (s) | AI Core kernels | detail |")
    lines.append("|---|---|---:|---:|---|")
    for r in rs:
        lines.append(
            f"| `{r.name}` | {r.status} | {r.seconds:.2f} | {r.aicore_kernels} | {_md(r.detail)} |"
        )
    return lines


def node_pass_rate(results: Sequence[Result]) -> float:
    """Passed node cases / all node cases."""
    rs = [r for r in results if r.suite == "node"]
    return sum(r.status == "passed" for r in rs) / len(rs) if rs else 0.0


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suites and write the report (``--help`` for options)."""
    p = argparse.ArgumentParser(
        prog="python -m geode.onnx_conformance", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--suite", action="append", choices=SUITES, help="run only this suite (repeatable)"
    )
    p.add_argument("--filter", help="run only cases whose name matches this regular expression")
    p.add_argument(
        "--output",
        default=None,
        help="report path (default: docs/onnx_conformance.md in the source tree); with --suite "
        "or --filter the default is '-': a summary of the failures on stdout",
    )
    p.add_argument("--quiet", action="store_true", help="no per-case progress on stderr")
    args = p.parse_args(argv)
    suites = tuple(args.suite) if args.suite else SUITES
    partial = bool(args.suite or args.filter)
    t0 = time.perf_counter()
    with _quiet():
        results = run_suites(suites, args.filter, progress=not args.quiet)
    seconds = time.perf_counter() - t0
    command = "python -m geode.onnx_conformance" + (
        " " + " ".join(argv or sys.argv[1:]) if partial else ""
    )
    text = format_report(results, seconds, command)
    out = args.output if args.output is not None else ("-" if partial else DEFAULT_REPORT)
    if out == "-":
        failed = [r for r in results if r.status == "failed"]
        for r in failed:
            print(f"FAILED {r.suite} {r.name} ({r.stage}): {r.detail}")
        c = _counts(results)
        print(
            f"{len(results)} cases: {c['passed']} passed, {c['failed']} failed, {c['excluded']} excluded"
        )
    else:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
        c = _counts(results)
        print(
            f"wrote {out}: {len(results)} cases, {c['passed']} passed, {c['failed']} failed, "
            f"{c['excluded']} excluded; node pass rate {100 * node_pass_rate(results):.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
