"""Codegen: a fused group in, a native kernel out (lower, schedule, emit).

Importing the package installs its backend target's fingerprint in the kernel cache's
keys (:func:`geode.codegen.cache.set_target_fingerprint`): the cache is used by the
backends, so it does not import them.
"""

from geode.codegen import cache as _cache


def _target_fingerprint() -> dict[str, str]:
    from geode.codegen.backends.target import codegen_fingerprint

    return codegen_fingerprint()


_cache.set_target_fingerprint(_target_fingerprint)
