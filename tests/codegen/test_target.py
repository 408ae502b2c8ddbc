"""numba's CPU target as geode sets it up (geode.codegen.backends.target): the feature
string asked for (GEODE_VECTOR_WIDTH), when configure() leaves numba alone, the codegen
fingerprint and the kernel cache keyed on it.

configure() acts once per process, so the in-process tests patch numba's config, the
host features and the "target built" probe; what a fresh process really ends up with is
checked in subprocesses (started together: numba's import dominates their time).
"""

from __future__ import annotations

import pytest

# the numba backend's own tests: numba is an optional extra (CI installs it)
pytest.importorskip("numba", reason='needs numba, an optional extra: pip install "geode[numba]"')

import json
import os
import subprocess
import sys

import llvmlite.binding as llvm
from numba.core import config as nb_config

from geode.codegen import cache
from geode.codegen.backends import target
from geode.config import OptionError

AVX512_HOST = "+avx2,+avx512f,+fma"


# ---------------------------------------------------------------------------------
# wanted_features
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["auto", "512", "", "  ", " AUTO ", "512\n"])
def test_wide_vectors_on_avx512_hosts(setting: str) -> None:
    assert target.wanted_features(AVX512_HOST, setting) == AVX512_HOST + ",-prefer-256-bit"


def test_256_keeps_numbas_default() -> None:
    assert target.wanted_features(AVX512_HOST, "256") is None
    assert target.wanted_features(AVX512_HOST, " 256 ") is None


@pytest.mark.parametrize(
    "host",
    [
        "+avx2,+fma",
        "+avx2,-avx512f,+fma",
        "+avx2,+avx512fp16,+avx512f16",  # names starting with avx512f are other features
        "",
    ],
)
@pytest.mark.parametrize("setting", ["auto", "512"])
def test_no_avx512f_keeps_numbas_default(host: str, setting: str) -> None:
    assert target.wanted_features(host, setting) is None


def test_existing_prefer_256_bit_entries_are_replaced() -> None:
    host = "+prefer-256-bit,+avx512f,,+fma,-prefer-256-bit,"
    got = target.wanted_features(host, "auto")
    assert got == "+avx512f,+fma,-prefer-256-bit"
    assert got.count("prefer-256-bit") == 1 and ",," not in got


@pytest.mark.parametrize("bad", ["128", "1024", "wide", "avx512", "auto,512"])
def test_bad_vector_width_raises_naming_the_variable(bad: str) -> None:
    with pytest.raises(OptionError, match="GEODE_VECTOR_WIDTH") as info:
        target.wanted_features(AVX512_HOST, bad)
    assert bad.strip().lower() in str(info.value)
    assert target.ENV_VAR == "GEODE_VECTOR_WIDTH"


# ---------------------------------------------------------------------------------
# configure
# ---------------------------------------------------------------------------------


class _Features:
    def __init__(self, text: str):
        self.text = text

    def flatten(self) -> str:
        return self.text


@pytest.fixture
def fresh_target(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """As if numba's target were not built yet and nobody chose features, on an AVX-512
    host (everything is restored afterwards)."""
    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    monkeypatch.delenv(target.ENV_VAR, raising=False)
    monkeypatch.setattr(nb_config, "CPU_FEATURES", None)
    monkeypatch.setattr(target, "_target_built", lambda: False)
    monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: _Features(AVX512_HOST))
    return monkeypatch


def test_configure_sets_numbas_features(fresh_target: pytest.MonkeyPatch) -> None:
    assert target.configure() is True
    assert nb_config.CPU_FEATURES == AVX512_HOST + ",-prefer-256-bit"


@pytest.mark.parametrize("width", ["512", "auto"])
def test_configure_with_explicit_width(fresh_target: pytest.MonkeyPatch, width: str) -> None:
    fresh_target.setenv(target.ENV_VAR, width)
    assert target.configure() is True
    assert nb_config.CPU_FEATURES.endswith(",-prefer-256-bit")


def test_configure_respects_numba_cpu_features_env(fresh_target: pytest.MonkeyPatch) -> None:
    fresh_target.setenv("NUMBA_CPU_FEATURES", "+avx2,+fma")
    assert target.configure() is False
    assert nb_config.CPU_FEATURES is None


def test_configure_respects_features_already_chosen(fresh_target: pytest.MonkeyPatch) -> None:
    fresh_target.setattr(nb_config, "CPU_FEATURES", "+sse2")
    assert target.configure() is False
    assert nb_config.CPU_FEATURES == "+sse2"


def test_configure_leaves_a_built_target_alone(fresh_target: pytest.MonkeyPatch) -> None:
    fresh_target.setattr(target, "_target_built", lambda: True)
    assert target.configure() is False
    assert nb_config.CPU_FEATURES is None


def test_configure_detects_the_real_built_target(fresh_target: pytest.MonkeyPatch) -> None:
    fresh_target.undo()  # the real probe, config and host
    target.codegen_fingerprint()  # builds numba's CPU target (if nothing did before)
    assert target._target_built() is True
    fresh_target.delenv("NUMBA_CPU_FEATURES", raising=False)
    fresh_target.delenv(target.ENV_VAR, raising=False)
    fresh_target.setattr(nb_config, "CPU_FEATURES", None)
    fresh_target.setattr(llvm, "get_host_cpu_features", lambda: _Features(AVX512_HOST))
    assert target.configure() is False
    assert nb_config.CPU_FEATURES is None


def test_configure_keeps_default_when_not_wanted(fresh_target: pytest.MonkeyPatch) -> None:
    fresh_target.setenv(target.ENV_VAR, "256")
    assert target.configure() is False
    assert nb_config.CPU_FEATURES is None
    fresh_target.delenv(target.ENV_VAR)
    fresh_target.setattr(llvm, "get_host_cpu_features", lambda: _Features("+avx2,+fma"))
    assert target.configure() is False
    assert nb_config.CPU_FEATURES is None


def test_configure_survives_hosts_without_features(fresh_target: pytest.MonkeyPatch) -> None:
    def broken() -> _Features:
        raise RuntimeError("cannot report features")

    fresh_target.setattr(llvm, "get_host_cpu_features", broken)
    assert target.configure() is False
    assert nb_config.CPU_FEATURES is None


def test_configure_rejects_a_bad_width(fresh_target: pytest.MonkeyPatch) -> None:
    fresh_target.setenv(target.ENV_VAR, "128")
    with pytest.raises(OptionError, match="GEODE_VECTOR_WIDTH"):
        target.configure()
    assert nb_config.CPU_FEATURES is None


# ---------------------------------------------------------------------------------
# fingerprints
# ---------------------------------------------------------------------------------


def test_codegen_fingerprint_is_numbas_magic_tuple() -> None:
    from numba.core.registry import cpu_target

    fp = target.codegen_fingerprint()
    assert set(fp) == {"triple", "cpu_name", "cpu_features"}
    assert all(isinstance(v, str) and v for v in fp.values())
    triple, cpu, feats = cpu_target.target_context.codegen().magic_tuple()
    assert fp == {"triple": str(triple), "cpu_name": str(cpu), "cpu_features": str(feats)}
    if nb_config.CPU_FEATURES is not None:
        assert fp["cpu_features"] == nb_config.CPU_FEATURES


@pytest.fixture
def clear_env_fingerprint():
    cache.environment_fingerprint.cache_clear()
    yield
    cache.environment_fingerprint.cache_clear()


def test_environment_fingerprint_uses_the_codegen(clear_env_fingerprint) -> None:
    env = cache.environment_fingerprint()
    fp = target.codegen_fingerprint()
    for key in ("triple", "cpu_name", "cpu_features"):
        assert env[key] == fp[key], key
    assert {"numba", "llvmlite", "numpy", "python", "codegen_version"} <= set(env)


def test_cache_key_follows_the_codegen_features(
    clear_env_fingerprint, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = cache.cache_key("def k(): pass")
    fake = {**target.codegen_fingerprint(), "cpu_features": "+sse2,-prefer-256-bit"}
    monkeypatch.setattr(target, "codegen_fingerprint", lambda: dict(fake))
    cache.environment_fingerprint.cache_clear()
    assert cache.environment_fingerprint()["cpu_features"] == "+sse2,-prefer-256-bit"
    assert cache.cache_key("def k(): pass") != real


_PROBE = """
import json, llvmlite.binding as llvm
from geode.codegen.backends import numba as _numba_backend, target  # importing it configures
print(json.dumps({"host": llvm.get_host_cpu_features().flatten(), **target.codegen_fingerprint()}))
"""


def test_fresh_process_gets_the_wanted_features() -> None:
    """What numba's codegen uses in a new process importing geode's numba backend: the host features plus
    -prefer-256-bit on AVX-512 hosts (auto), numba's own choice with GEODE_VECTOR_WIDTH=256,
    and exactly NUMBA_CPU_FEATURES when the user set it."""
    host = llvm.get_host_cpu_features().flatten()
    user = ",".join(f for f in host.split(",") if f and not f.endswith("prefer-256-bit"))
    cases = {"auto": {}, "256": {target.ENV_VAR: "256"}, "user": {"NUMBA_CPU_FEATURES": user}}
    procs = {}
    for name, extra in cases.items():
        env = {
            k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_FEATURES", target.ENV_VAR)
        }
        env.update(extra)
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", _PROBE], env=env, stdout=subprocess.PIPE, text=True
        )
    out = {}
    for name, p in procs.items():
        stdout, _ = p.communicate(timeout=120)
        assert p.returncode == 0, name
        out[name] = json.loads(stdout)
    wanted = target.wanted_features(out["auto"]["host"], "auto")
    assert out["auto"]["cpu_features"] == (wanted or out["auto"]["host"])
    assert out["256"]["cpu_features"] == out["256"]["host"]
    assert out["user"]["cpu_features"] == user
    if wanted is not None:  # an AVX-512 host: the setting changes the codegen key
        assert out["auto"]["cpu_features"] != out["256"]["cpu_features"]
        assert out["auto"]["cpu_features"].endswith(",-prefer-256-bit")


_CALIBRATION_FIRST = """
import json, sys, tempfile
import llvmlite.binding as llvm
from geode.codegen import driver
with tempfile.TemporaryDirectory() as d:
    driver.device_spec(d)  # calibrates, with the LLVM backend's kernels
calibrated_without_numba = "numba" not in sys.modules
from geode.codegen.backends import numba as _numba_backend  # the numba backend, after it
from numba.core.registry import cpu_target
print(json.dumps({"host": llvm.get_host_cpu_features().flatten(),
                  "no_numba": calibrated_without_numba,
                  "cpu_features": cpu_target.target_context.codegen().magic_tuple()[2]}))
"""


def test_calibration_compiling_first_still_gets_the_wanted_features() -> None:
    """The device calibration runs before any geode kernel in a process without a cached
    device spec: it measures with the LLVM backend's kernels (no numba), and the numba
    backend used afterwards still builds numba's target with geode's features (else a
    cold process would fill the kernel cache under a key the warm processes never ask
    for)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_FEATURES", target.ENV_VAR)}
    p = subprocess.run(
        [sys.executable, "-c", _CALIBRATION_FIRST],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["no_numba"]
    wanted = target.wanted_features(out["host"], "auto")
    assert out["cpu_features"] == (wanted or out["host"])
