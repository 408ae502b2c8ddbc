"""Graph passes: each module exposes one function ``(graph) -> bool`` (True: it changed the graph;
the variable passes marked ``session`` in the pipeline also take ``session=``).

const_fold  fold_constants             evaluate constant subgraphs, Shape/Size of static dims
dce         dce                        remove what no output needs
cse         cse                        merge duplicate nodes and constants
simplify    simplify                   algebraic identities (x*1, Transpose pairs, ...)
decompose   decompose                  composite ops into primitives
fold_bn     fold_batch_norm            BatchNormalization (per-channel Mul/Add) into the Conv before
variables   mark_read_only_variables   GE-style variable marks; freeze_read_only_variables;
            fold_var_is_initialized    VarIsInitialized answered when it cannot change
variable_prepare  prepare_variables    writes of variables in graph order, one VarRef each
variable_format   accelerate_variable_formats  a weight stored in the layout its readers want

``rewrite`` holds what they share (replace_value keeps graph output names). The order
they run in is ``geode.compiler.pipeline.PIPELINE``.
"""
