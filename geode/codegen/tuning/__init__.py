"""Schedule tuning: each kernel's schedule space searched, candidates measured.

* ``space.py``: the knobs (the default schedules' choices, streaming, interleave,
  unroll, rfactor runs) and the schedule a setting of them gives;
* ``measure.py``: a scheduled kernel compiled and bound to fixed arguments, its outputs
  checked against the default's, its time measured;
* ``predict.py``: predictors that rank candidates before they are measured (the SOL
  model over a scheduled kernel; any callable of the kernel plugs in);
* ``search.py``: the search over one kernel's space from its default schedule.

``geode.tune`` (:mod:`geode.tuner`) drives them over a model's kernels and writes the
tuning database (:mod:`geode.codegen.tuning_db`).
"""
