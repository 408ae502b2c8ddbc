"""Tiny kernels JIT-compiled with llvmlite for the native runtime's tests and benchmark.

Every ``*_entry`` function has the kernel ABI of :func:`geode.runtime.native.call`:
``i32 entry(ptr ptrs, ptr recs, ptr ints)``. The chunk functions run on the pool through
``geode_parallel_for``, resolved by address from :func:`geode.runtime.native.symbols`.
"""

from __future__ import annotations

import ctypes
import platform
from functools import cache

import llvmlite.binding as llvm

from geode.runtime.native import symbols

IR = r"""
declare void @geode_parallel_for(ptr, ptr, i64, i64)
declare void @geode_parallel_steps(ptr, ptr, i64, i64, i64)
declare i64 @geode_num_threads()
declare i32 @usleep(i32)
declare i64 @pthread_self()
declare i32 @clock_gettime(i32, ptr)

define i32 @trivial_entry(ptr %ptrs, ptr %recs, ptr %ints) {
  ret i32 0
}

; a C function of 3 pointers and 2 int64s doing nothing (the ctypes reference)
define i32 @trivial5(ptr %a, ptr %b, ptr %c, i64 %i, i64 %j) {
  ret i32 0
}

; a stepped job's chunk: ctx = {out, nsteps, sleep_at, sleep_us}; out holds runs[nsteps * n]
; (each (step, chunk) counted), done[nsteps] (chunks returned per step), bad[1] (chunks that
; started before every chunk of the previous step had returned), n_seen[1] (calls whose
; nchunks was not n ... never), tids[nsteps * n]; the chunk s * n + c == sleep_at first
; sleeps sleep_us microseconds (a worker descheduled inside a chunk)
define void @step_chunk(ptr %ctx, i64 %s, i64 %c, i64 %n) {
entry:
  %out = load ptr, ptr %ctx
  %p1 = getelementptr { ptr, i64, i64, i64 }, ptr %ctx, i32 0, i32 1
  %nsteps = load i64, ptr %p1
  %p2 = getelementptr { ptr, i64, i64, i64 }, ptr %ctx, i32 0, i32 2
  %sleep_at = load i64, ptr %p2
  %p3 = getelementptr { ptr, i64, i64, i64 }, ptr %ctx, i32 0, i32 3
  %sleep_us = load i64, ptr %p3
  %total = mul i64 %nsteps, %n
  %done0 = getelementptr i64, ptr %out, i64 %total
  %badi = add i64 %total, %nsteps
  %bad = getelementptr i64, ptr %out, i64 %badi
  %tid0i = add i64 %badi, 2
  %tids = getelementptr i64, ptr %out, i64 %tid0i
  %sn = mul i64 %s, %n
  %me = add i64 %sn, %c
  %has_prev = icmp sgt i64 %s, 0
  br i1 %has_prev, label %check, label %work
check:
  %prev = sub i64 %s, 1
  %pdp = getelementptr i64, ptr %done0, i64 %prev
  %pd = load atomic i64, ptr %pdp seq_cst, align 8
  %ok = icmp eq i64 %pd, %n
  br i1 %ok, label %work, label %flag
flag:
  %f = atomicrmw add ptr %bad, i64 1 seq_cst
  br label %work
work:
  %sleepy = icmp eq i64 %me, %sleep_at
  br i1 %sleepy, label %nap, label %count
nap:
  %us = trunc i64 %sleep_us to i32
  %r = call i32 @usleep(i32 %us)
  br label %count
count:
  %rp = getelementptr i64, ptr %out, i64 %me
  %a = atomicrmw add ptr %rp, i64 1 seq_cst
  %tid = call i64 @pthread_self()
  %tp = getelementptr i64, ptr %tids, i64 %me
  store i64 %tid, ptr %tp
  %dp = getelementptr i64, ptr %done0, i64 %s
  %d = atomicrmw add ptr %dp, i64 1 seq_cst
  ret void
}

; ptrs = (out,) (see step_chunk), ints = (nsteps, nchunks, nthreads, sleep_at, sleep_us)
define i32 @steps_entry(ptr %ptrs, ptr %recs, ptr %ints) {
  %out = load ptr, ptr %ptrs
  %nsteps = load i64, ptr %ints
  %p1 = getelementptr i64, ptr %ints, i64 1
  %n = load i64, ptr %p1
  %p2 = getelementptr i64, ptr %ints, i64 2
  %t = load i64, ptr %p2
  %p3 = getelementptr i64, ptr %ints, i64 3
  %at = load i64, ptr %p3
  %p4 = getelementptr i64, ptr %ints, i64 4
  %us = load i64, ptr %p4
  %ctx = alloca { ptr, i64, i64, i64 }
  store ptr %out, ptr %ctx
  %c1 = getelementptr { ptr, i64, i64, i64 }, ptr %ctx, i32 0, i32 1
  store i64 %nsteps, ptr %c1
  %c2 = getelementptr { ptr, i64, i64, i64 }, ptr %ctx, i32 0, i32 2
  store i64 %at, ptr %c2
  %c3 = getelementptr { ptr, i64, i64, i64 }, ptr %ctx, i32 0, i32 3
  store i64 %us, ptr %c3
  call void @geode_parallel_steps(ptr @step_chunk, ptr %ctx, i64 %nsteps, i64 %n, i64 %t)
  ret i32 0
}

; returns ints[0]
define i32 @status_entry(ptr %ptrs, ptr %recs, ptr %ints) {
  %v = load i64, ptr %ints
  %s = trunc i64 %v to i32
  ret i32 %s
}

; sleeps ints[0] microseconds
define i32 @sleep_entry(ptr %ptrs, ptr %recs, ptr %ints) {
  %v = load i64, ptr %ints
  %us = trunc i64 %v to i32
  %r = call i32 @usleep(i32 %us)
  ret i32 0
}

define void @copy_words(ptr %dst, ptr %src, i64 %n) {
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%next, %body]
  %done = icmp sge i64 %i, %n
  br i1 %done, label %exit, label %body
body:
  %s = getelementptr i64, ptr %src, i64 %i
  %v = load i64, ptr %s
  %d = getelementptr i64, ptr %dst, i64 %i
  store i64 %v, ptr %d
  %next = add i64 %i, 1
  br label %head
exit:
  ret void
}

; ints = (narrays, nrec, nints, ...); writes into the last array (int64):
; recs[0:nrec], then the narrays data pointers, then the nints ints
define i32 @dump_entry(ptr %ptrs, ptr %recs, ptr %ints) {
  %na = load i64, ptr %ints
  %p1 = getelementptr i64, ptr %ints, i64 1
  %nrec = load i64, ptr %p1
  %p2 = getelementptr i64, ptr %ints, i64 2
  %ni = load i64, ptr %p2
  %last = sub i64 %na, 1
  %op = getelementptr ptr, ptr %ptrs, i64 %last
  %out = load ptr, ptr %op
  call void @copy_words(ptr %out, ptr %recs, i64 %nrec)
  %o2 = getelementptr i64, ptr %out, i64 %nrec
  call void @copy_words(ptr %o2, ptr %ptrs, i64 %na)
  %off3 = add i64 %nrec, %na
  %o3 = getelementptr i64, ptr %out, i64 %off3
  call void @copy_words(ptr %o3, ptr %ints, i64 %ni)
  ret i32 0
}

; counts[c] += 1 and counts[nchunks] += 1 (so counts[nchunks] ends at nchunks)
define void @count_chunk(ptr %counts, i64 %c, i64 %n) {
  %p = getelementptr i64, ptr %counts, i64 %c
  %a = atomicrmw add ptr %p, i64 1 seq_cst
  %q = getelementptr i64, ptr %counts, i64 %n
  %b = atomicrmw add ptr %q, i64 1 seq_cst
  ret void
}

; ptrs = (counts,), ints = (nchunks, nthreads)
define i32 @count_entry(ptr %ptrs, ptr %recs, ptr %ints) {
  %counts = load ptr, ptr %ptrs
  %n = load i64, ptr %ints
  %tp = getelementptr i64, ptr %ints, i64 1
  %t = load i64, ptr %tp
  call void @geode_parallel_for(ptr @count_chunk, ptr %counts, i64 %n, i64 %t)
  ret i32 0
}

; ctx = {counts, first}: counts[first + i] += 1
define void @inner_chunk(ptr %ctx, i64 %i, i64 %m) {
  %counts = load ptr, ptr %ctx
  %fp = getelementptr { ptr, i64 }, ptr %ctx, i32 0, i32 1
  %first = load i64, ptr %fp
  %idx = add i64 %first, %i
  %p = getelementptr i64, ptr %counts, i64 %idx
  %a = atomicrmw add ptr %p, i64 1 seq_cst
  ret void
}

; ctx = {counts, m}: runs inner_chunk over counts[c*m : (c+1)*m] through the pool (nested)
define void @outer_chunk(ptr %ctx, i64 %c, i64 %n) {
  %counts = load ptr, ptr %ctx
  %mp = getelementptr { ptr, i64 }, ptr %ctx, i32 0, i32 1
  %m = load i64, ptr %mp
  %first = mul i64 %c, %m
  %inner = alloca { ptr, i64 }
  store ptr %counts, ptr %inner
  %ip = getelementptr { ptr, i64 }, ptr %inner, i32 0, i32 1
  store i64 %first, ptr %ip
  call void @geode_parallel_for(ptr @inner_chunk, ptr %inner, i64 %m, i64 0)
  ret void
}

; ptrs = (counts[n*m],), ints = (n, m, nthreads)
define i32 @nested_entry(ptr %ptrs, ptr %recs, ptr %ints) {
  %counts = load ptr, ptr %ptrs
  %n = load i64, ptr %ints
  %mp = getelementptr i64, ptr %ints, i64 1
  %m = load i64, ptr %mp
  %tp = getelementptr i64, ptr %ints, i64 2
  %t = load i64, ptr %tp
  %ctx = alloca { ptr, i64 }
  store ptr %counts, ptr %ctx
  %cm = getelementptr { ptr, i64 }, ptr %ctx, i32 0, i32 1
  store i64 %m, ptr %cm
  call void @geode_parallel_for(ptr @outer_chunk, ptr %ctx, i64 %n, i64 %t)
  ret i32 0
}

; ctx = {out, us}: sleeps us microseconds, then out[c] = pthread_self()
define void @tid_chunk(ptr %ctx, i64 %c, i64 %n) {
  %out = load ptr, ptr %ctx
  %up = getelementptr { ptr, i64 }, ptr %ctx, i32 0, i32 1
  %us64 = load i64, ptr %up
  %us = trunc i64 %us64 to i32
  %r = call i32 @usleep(i32 %us)
  %tid = call i64 @pthread_self()
  %p = getelementptr i64, ptr %out, i64 %c
  store i64 %tid, ptr %p
  ret void
}

; ptrs = (out[n],), ints = (n, nthreads, sleep_us)
define i32 @tid_entry(ptr %ptrs, ptr %recs, ptr %ints) {
  %out = load ptr, ptr %ptrs
  %n = load i64, ptr %ints
  %tp = getelementptr i64, ptr %ints, i64 1
  %t = load i64, ptr %tp
  %up = getelementptr i64, ptr %ints, i64 2
  %us = load i64, ptr %up
  %ctx = alloca { ptr, i64 }
  store ptr %out, ptr %ctx
  %cu = getelementptr { ptr, i64 }, ptr %ctx, i32 0, i32 1
  store i64 %us, ptr %cu
  call void @geode_parallel_for(ptr @tid_chunk, ptr %ctx, i64 %n, i64 %t)
  ret i32 0
}

; ptrs = (out[1],): out[0] = geode_num_threads()
define i32 @num_threads_entry(ptr %ptrs, ptr %recs, ptr %ints) {
  %out = load ptr, ptr %ptrs
  %n = call i64 @geode_num_threads()
  store i64 %n, ptr %out
  ret i32 0
}

define void @empty_chunk(ptr %ctx, i64 %c, i64 %n) {
  ret void
}

define i64 @now_ns() {
  %ts = alloca { i64, i64 }
  %r = call i32 @clock_gettime(i32 1, ptr %ts)
  %s = load i64, ptr %ts
  %np = getelementptr { i64, i64 }, ptr %ts, i32 0, i32 1
  %ns = load i64, ptr %np
  %s9 = mul i64 %s, 1000000000
  %t = add i64 %s9, %ns
  ret i64 %t
}

; busy-waits ctx (an i64) nanoseconds
define void @busy_chunk(ptr %ctx, i64 %c, i64 %n) {
entry:
  %ns = ptrtoint ptr %ctx to i64
  %t0 = call i64 @now_ns()
  %until = add i64 %t0, %ns
  br label %loop
loop:
  %t = call i64 @now_ns()
  %more = icmp slt i64 %t, %until
  br i1 %more, label %loop, label %exit
exit:
  ret void
}

; ptrs = (out[reps],), ints = (reps, nchunks, chunk_ns): out[i] = ns taken by launch i of
; busy_chunk (chunk_ns of work per chunk)
define i32 @work_bench_entry(ptr %ptrs, ptr %recs, ptr %ints) {
entry:
  %out = load ptr, ptr %ptrs
  %reps = load i64, ptr %ints
  %np = getelementptr i64, ptr %ints, i64 1
  %n = load i64, ptr %np
  %wp = getelementptr i64, ptr %ints, i64 2
  %w = load i64, ptr %wp
  %ctx = inttoptr i64 %w to ptr
  br label %head
head:
  %i = phi i64 [0, %entry], [%next, %body]
  %done = icmp sge i64 %i, %reps
  br i1 %done, label %exit, label %body
body:
  %t0 = call i64 @now_ns()
  call void @geode_parallel_for(ptr @busy_chunk, ptr %ctx, i64 %n, i64 0)
  %t1 = call i64 @now_ns()
  %dt = sub i64 %t1, %t0
  %op = getelementptr i64, ptr %out, i64 %i
  store i64 %dt, ptr %op
  %next = add i64 %i, 1
  br label %head
exit:
  ret i32 0
}

; busy-waits ctx (an i64) nanoseconds: a step's chunk
define void @busy_step(ptr %ctx, i64 %s, i64 %c, i64 %n) {
  call void @busy_chunk(ptr %ctx, i64 %c, i64 %n)
  ret void
}

; ptrs = (out[2],), ints = (nsteps, nchunks, chunk_ns): nsteps steps of nchunks chunks of
; chunk_ns busy work; out[0] = ns as a launch per step, out[1] = ns as one stepped launch
define i32 @steps_bench_entry(ptr %ptrs, ptr %recs, ptr %ints) {
entry:
  %out = load ptr, ptr %ptrs
  %steps = load i64, ptr %ints
  %np = getelementptr i64, ptr %ints, i64 1
  %n = load i64, ptr %np
  %wp = getelementptr i64, ptr %ints, i64 2
  %w = load i64, ptr %wp
  %ctx = inttoptr i64 %w to ptr
  %t0 = call i64 @now_ns()
  br label %head
head:
  %i = phi i64 [0, %entry], [%next, %body]
  %done = icmp sge i64 %i, %steps
  br i1 %done, label %stepped, label %body
body:
  call void @geode_parallel_for(ptr @busy_chunk, ptr %ctx, i64 %n, i64 0)
  %next = add i64 %i, 1
  br label %head
stepped:
  %t1 = call i64 @now_ns()
  call void @geode_parallel_steps(ptr @busy_step, ptr %ctx, i64 %steps, i64 %n, i64 0)
  %t2 = call i64 @now_ns()
  %d1 = sub i64 %t1, %t0
  store i64 %d1, ptr %out
  %d2 = sub i64 %t2, %t1
  %o2 = getelementptr i64, ptr %out, i64 1
  store i64 %d2, ptr %o2
  ret i32 0
}

; ptrs = (out[reps],), ints = (reps, nchunks): out[i] = ns taken by launch i of empty_chunk
define i32 @launch_bench_entry(ptr %ptrs, ptr %recs, ptr %ints) {
entry:
  %out = load ptr, ptr %ptrs
  %reps = load i64, ptr %ints
  %np = getelementptr i64, ptr %ints, i64 1
  %n = load i64, ptr %np
  br label %head
head:
  %i = phi i64 [0, %entry], [%next, %body]
  %done = icmp sge i64 %i, %reps
  br i1 %done, label %exit, label %body
body:
  %t0 = call i64 @now_ns()
  call void @geode_parallel_for(ptr @empty_chunk, ptr null, i64 %n, i64 0)
  %t1 = call i64 @now_ns()
  %dt = sub i64 %t1, %t0
  %op = getelementptr i64, ptr %out, i64 %i
  store i64 %dt, ptr %op
  %next = add i64 %i, 1
  br label %head
exit:
  ret i32 0
}
"""

MXCSR_IR = r"""
declare void @llvm.x86.sse.ldmxcsr(ptr)
declare void @llvm.x86.sse.stmxcsr(ptr)
declare void @geode_parallel_for(ptr, ptr, i64, i64)
declare i32 @usleep(i32)
declare i64 @pthread_self()

; out[2c] = MXCSR seen by the chunk, out[2c+1] = its thread; then sleeps 2 ms
define void @csr_chunk(ptr %out, i64 %c, i64 %n) {
  %slot = alloca i32
  call void @llvm.x86.sse.stmxcsr(ptr %slot)
  %csr = load i32, ptr %slot
  %w = zext i32 %csr to i64
  %i2 = mul i64 %c, 2
  %p = getelementptr i64, ptr %out, i64 %i2
  store i64 %w, ptr %p
  %tid = call i64 @pthread_self()
  %i3 = add i64 %i2, 1
  %q = getelementptr i64, ptr %out, i64 %i3
  store i64 %tid, ptr %q
  %r = call i32 @usleep(i32 2000)
  ret void
}

; ptrs = (out[2n],), ints = (n, mxcsr): runs csr_chunk with MXCSR = ints[1], then restores it
define i32 @csr_entry(ptr %ptrs, ptr %recs, ptr %ints) {
  %out = load ptr, ptr %ptrs
  %n = load i64, ptr %ints
  %p1 = getelementptr i64, ptr %ints, i64 1
  %want64 = load i64, ptr %p1
  %want = trunc i64 %want64 to i32
  %saved = alloca i32
  call void @llvm.x86.sse.stmxcsr(ptr %saved)
  %ws = alloca i32
  store i32 %want, ptr %ws
  call void @llvm.x86.sse.ldmxcsr(ptr %ws)
  call void @geode_parallel_for(ptr @csr_chunk, ptr %out, i64 %n, i64 0)
  call void @llvm.x86.sse.ldmxcsr(ptr %saved)
  ret i32 0
}
"""

IS_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _libc_address(name: str) -> int:
    """Address of a libc function of this process."""
    return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value


class Kernels:
    """A JIT-compiled module (MCJIT); ``addr(name)`` gives a function's address."""

    def __init__(self, ir: str):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        for name, addr in symbols().items():
            llvm.add_symbol(name, addr)
        for name in ("usleep", "pthread_self", "clock_gettime"):
            llvm.add_symbol(name, _libc_address(name))
        mod = llvm.parse_assembly(ir)
        mod.verify()
        machine = llvm.Target.from_default_triple().create_target_machine(opt=2)
        self._engine = llvm.create_mcjit_compiler(mod, machine)
        self._engine.finalize_object()

    def addr(self, name: str) -> int:
        """The address of the compiled function ``name``."""
        address = self._engine.get_function_address(name)
        assert address, name
        return address


@cache
def kernels() -> Kernels:
    """The test kernels of :data:`IR`, compiled once per process."""
    return Kernels(IR)


@cache
def mxcsr_kernels() -> Kernels:
    """The MXCSR kernels of :data:`MXCSR_IR` (x86 only), compiled once per process."""
    return Kernels(MXCSR_IR)
