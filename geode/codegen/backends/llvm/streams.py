"""The copy behind a ``StreamStore``: staged values to a kernel output, with
non-temporal stores when the statement's flag holds.

``@geode.stream.<T>(dst, src, n, nt)`` copies ``n`` elements. With ``nt``: one masked
vector store up to the first address aligned to the target's streaming vector size,
whole vectors with aligned non-temporal stores (``vmovntps``: no read-for-ownership, the
lines bypass the caches), one masked vector store for the tail; an output not even
aligned to its element size takes the plain copy. The head and tail were scalar loops,
which LLVM turns into ``memcpy`` calls once the function is inlined: the call's
possibility made the register allocator spill the caller's live vectors on every chunk
(the reduce chain spilled the next row's eight partial sums per 128 elements, 8% of its
time; :data:`MASKED_EDGES` switches back for A/B; ``docs/performance.md``). Without
``nt``: ``llvm.memcpy``, then a write
prefetch of the next ``n`` elements' lines (the next chunk's stores then find their lines
fetched; the prefetch past the end never faults). The ``.scaled`` variant multiplies each
element by a factor on the way (softmax's ``e / sum`` straight from registers, as ``e * (1 /
sum)``), with whole-vector ordinary stores when not streaming; the ``.divided`` variant
divides each element by it instead (IEEE division, for a divisor whose reciprocal may
overflow: a subnormal one).
"""

from __future__ import annotations

from geode.codegen.backends.llvm import dtypes as D

__all__ = ["MASKED_EDGES", "stream_function"]

#: the streamed copy's head and tail as masked vector stores (else scalar loops, kept
#: for A/B measurements and the test that pins the choice)
MASKED_EDGES = True


def _copy_loop(
    lbl: str, lo: str, hi: str, ty: str, scale: str | None, after: str, op: str = "fmul"
) -> list[str]:
    """Scalar copy ``dst[i] = src[i] (op scale)`` for ``i`` in ``[lo, hi)``, then ``br after``
    (``op``: ``fmul`` or ``fdiv``)."""
    mul = [f"  %{lbl}.m = {op} {ty} %{lbl}.v, %s"] if scale else []
    val = f"%{lbl}.m" if scale else f"%{lbl}.v"
    return [
        f"  %{lbl}.go = icmp slt i64 {lo}, {hi}",
        f"  br i1 %{lbl}.go, label %{lbl}, label %{after}",
        f"{lbl}:",
        f"  %{lbl}.i = phi i64 [ {lo}, %{lbl}.pre ], [ %{lbl}.n, %{lbl} ]",
        f"  %{lbl}.sp = getelementptr {ty}, ptr %src, i64 %{lbl}.i",
        f"  %{lbl}.v = load {ty}, ptr %{lbl}.sp",
        *mul,
        f"  %{lbl}.dp = getelementptr {ty}, ptr %dst, i64 %{lbl}.i",
        f"  store {ty} {val}, ptr %{lbl}.dp",
        f"  %{lbl}.n = add nsw i64 %{lbl}.i, 1",
        f"  %{lbl}.again = icmp slt i64 %{lbl}.n, {hi}",
        f"  br i1 %{lbl}.again, label %{lbl}, label %{after}",
    ]


def _masked_copy(
    lbl: str,
    lo: str,
    count: str,
    ty: str,
    lanes: int,
    esz: int,
    scale: str | None,
    after: str,
    op: str = "fmul",
) -> list[str]:
    """``dst[lo + i] = src[lo + i] (op scale)`` for ``i`` in ``[0, count)``, ``count`` below
    ``lanes``, as one masked vector load and store (no loop: a scalar loop here LLVM
    turns into a ``memcpy`` call, whose possibility makes the register allocator spill the
    caller's live vectors on every chunk), then ``br after``."""
    vty = f"<{lanes} x {ty}>"
    sfx = _vector_suffix(ty, lanes)
    mul = [f"  %{lbl}.m = {op} {vty} %{lbl}.v, {scale}"] if scale else []
    val = f"%{lbl}.m" if scale else f"%{lbl}.v"
    return [
        f"  %{lbl}.go = icmp sgt i64 {count}, 0",
        f"  br i1 %{lbl}.go, label %{lbl}, label %{after}",
        f"{lbl}:",
        f"  %{lbl}.c = trunc i64 {count} to i{lanes}"
        if lanes < 64
        else f"  %{lbl}.c = add i64 {count}, 0",
        f"  %{lbl}.b = shl i{lanes} 1, %{lbl}.c",
        f"  %{lbl}.b1 = sub i{lanes} %{lbl}.b, 1",
        f"  %{lbl}.k = bitcast i{lanes} %{lbl}.b1 to <{lanes} x i1>",
        f"  %{lbl}.sp = getelementptr {ty}, ptr %src, i64 {lo}",
        f"  %{lbl}.v = call {vty} @llvm.masked.load.{sfx}.p0(ptr %{lbl}.sp, i32 {esz}, "
        f"<{lanes} x i1> %{lbl}.k, {vty} poison)",
        *mul,
        f"  %{lbl}.dp = getelementptr {ty}, ptr %dst, i64 {lo}",
        f"  call void @llvm.masked.store.{sfx}.p0({vty} {val}, ptr %{lbl}.dp, i32 {esz}, "
        f"<{lanes} x i1> %{lbl}.k)",
        f"  br label %{after}",
    ]


def _vector_suffix(ty: str, lanes: int) -> str:
    """The overload suffix of a ``<lanes x ty>`` intrinsic (``v16f32``, ``v64i8``)."""
    scalar = {"float": "f32", "double": "f64"}.get(ty, ty)
    return f"v{lanes}{scalar}"


def _vector_loop(
    lbl: str,
    head: str,
    nvec: str,
    ty: str,
    lanes: int,
    esz: int,
    store_tail: str,
    after: str,
    scaled: bool,
    op: str = "fmul",
) -> list[str]:
    vty = f"<{lanes} x {ty}>"
    mul = [f"  %{lbl}.m = {op} {vty} %{lbl}.v, %splat"] if scaled else []
    val = f"%{lbl}.m" if scaled else f"%{lbl}.v"
    return [
        f"  %{lbl}.go = icmp sgt i64 {nvec}, 0",
        f"  br i1 %{lbl}.go, label %{lbl}, label %{after}",
        f"{lbl}:",
        f"  %{lbl}.k = phi i64 [ 0, %{lbl}.pre ], [ %{lbl}.n, %{lbl} ]",
        f"  %{lbl}.o0 = mul nsw i64 %{lbl}.k, {lanes}",
        f"  %{lbl}.o = add nsw i64 {head}, %{lbl}.o0",
        f"  %{lbl}.sp = getelementptr {ty}, ptr %src, i64 %{lbl}.o",
        f"  %{lbl}.v = load {vty}, ptr %{lbl}.sp, align {esz}",
        *mul,
        f"  %{lbl}.dp = getelementptr {ty}, ptr %dst, i64 %{lbl}.o",
        f"  store {vty} {val}, ptr %{lbl}.dp{store_tail}",
        f"  %{lbl}.n = add nsw i64 %{lbl}.k, 1",
        f"  %{lbl}.again = icmp slt i64 %{lbl}.n, {nvec}",
        f"  br i1 %{lbl}.again, label %{lbl}, label %{after}",
    ]


def stream_function(
    dtype: str, scaled: bool, target, divide: bool = False
) -> tuple[str, str, list[str]]:
    """``(name, IR text, declarations)`` of the stream copy for ``dtype`` (float32/float64
    or an integer type; ``scaled``: floats only, each element multiplied by the factor, or
    divided by it with ``divide``)."""
    ty = D.memory_type(dtype)
    esz = max(1, D.bits(dtype) // 8)
    vb = target.stream_vector_bytes
    lanes = max(1, vb // esz)
    op = "fdiv" if divide else "fmul"
    vty, sfx = f"<{lanes} x {ty}>", _vector_suffix(ty, lanes)
    name = f"geode.stream.{dtype}" + ((".divided" if divide else ".scaled") if scaled else "")
    params = f"ptr noalias %dst, ptr noalias %src, i64 %n, i1 %nt{f', {ty} %s' if scaled else ''}"
    nt_tail = f", align {vb}, !nontemporal !{{i32 1}}"
    lines = [f'define internal void @"{name}"({params}) nounwind {{', "entry:"]
    if scaled:
        lines += [
            f"  %one = insertelement <{lanes} x {ty}> poison, {ty} %s, i64 0",
            f"  %splat = shufflevector <{lanes} x {ty}> %one, <{lanes} x {ty}> poison, "
            f"<{lanes} x i32> zeroinitializer",
        ]
    lines += ["  br i1 %nt, label %stream, label %plain", "stream:"]
    lines += [
        "  %addr = ptrtoint ptr %dst to i64",
        f"  %mis = urem i64 %addr, {vb}",
        f"  %gap0 = sub i64 {vb}, %mis",
        f"  %gap = urem i64 %gap0, {vb}",
        f"  %gr = urem i64 %gap, {esz}",
        "  %whole = icmp eq i64 %gr, 0",
        f"  %gq = udiv i64 %gap, {esz}",
        "  %hlt = icmp slt i64 %gq, %n",
        "  %head = select i1 %hlt, i64 %gq, i64 %n",
        "  br i1 %whole, label %a.pre, label %plain",
        "a.pre:",
    ]
    sc = "%s" if scaled else None
    vsc = "%splat" if scaled else None
    if MASKED_EDGES:
        lines += _masked_copy("a", "0", "%head", ty, lanes, esz, vsc, "b.pre0", op)
    else:
        lines += _copy_loop("a", "0", "%head", ty, sc, "b.pre0", op)
    lines += [
        "b.pre0:",
        "  %rest = sub i64 %n, %head",
        f"  %nvec = sdiv i64 %rest, {lanes}",
        "  br label %b.pre",
        "b.pre:",
    ]
    lines += _vector_loop("b", "%head", "%nvec", ty, lanes, esz, nt_tail, "c.pre0", scaled, op)
    lines += [
        "c.pre0:",
        f"  %done0 = mul nsw i64 %nvec, {lanes}",
        "  %tail = add nsw i64 %head, %done0",
        "  %left = sub nsw i64 %n, %tail",
        "  br label %c.pre",
        "c.pre:",
    ]
    if MASKED_EDGES:
        lines += _masked_copy("c", "%tail", "%left", ty, lanes, esz, vsc, "fin", op)
    else:
        lines += _copy_loop("c", "%tail", "%n", ty, sc, "fin", op)
    lines += ["plain:"]
    if scaled:
        lines += [f"  %pnvec = sdiv i64 %n, {lanes}", "  br label %d.pre", "d.pre:"]
        lines += _vector_loop(
            "d", "0", "%pnvec", ty, lanes, esz, f", align {esz}", "e.pre0", True, op
        )
        lines += [
            "e.pre0:",
            f"  %pdone = mul nsw i64 %pnvec, {lanes}",
            "  br label %e.pre",
            "e.pre:",
        ]
        lines += _copy_loop("e", "%pdone", "%n", ty, sc, "pf.pre0", op)
    else:
        lines += [
            f"  %bytes = mul i64 %n, {esz}",
            "  call void @llvm.memcpy.p0.p0.i64(ptr %dst, ptr %src, i64 %bytes, i1 false)",
            "  br label %pf.pre0",
        ]
    lines += [
        "pf.pre0:",
        f"  %nbytes = mul i64 %n, {esz}",
        "  %base = getelementptr i8, ptr %dst, i64 %nbytes",
        "  %nb63 = add i64 %nbytes, 63",
        "  %nlines = udiv i64 %nb63, 64",
        "  %pfgo = icmp sgt i64 %nlines, 0",
        "  br i1 %pfgo, label %pf, label %fin",
        "pf:",
        "  %pl = phi i64 [ 0, %pf.pre0 ], [ %pl.n, %pf ]",
        "  %plo = mul i64 %pl, 64",
        "  %pp = getelementptr i8, ptr %base, i64 %plo",
        "  call void @llvm.prefetch.p0(ptr %pp, i32 1, i32 3, i32 1)",
        "  %pl.n = add nsw i64 %pl, 1",
        "  %pagain = icmp slt i64 %pl.n, %nlines",
        "  br i1 %pagain, label %pf, label %fin",
        "fin:",
        "  ret void",
        "}",
    ]
    # the declarations it needs (duplicates of a module's own are merged by name)
    decls = [
        "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
        "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)",
        f"declare {vty} @llvm.masked.load.{sfx}.p0(ptr, i32 immarg, <{lanes} x i1>, {vty})",
        f"declare void @llvm.masked.store.{sfx}.p0({vty}, ptr, i32 immarg, <{lanes} x i1>)",
    ]
    return name, "\n".join(lines), decls
