"""geode.codegen.backends.llvm.linker: libllvmlite's C functions called directly say what
llvmlite's binding says (host triple, CPU, features, LLVM version), link object code into
callable functions, resolve imports by address, unload, and raise CodegenError for object
code LLVM cannot link and for a missing export."""

from __future__ import annotations

import ctypes
import gc

import llvmlite.binding as llvm
import pytest

from geode.codegen.backends.llvm import jit, linker
from geode.codegen.backends.llvm.target import host
from geode.errors import CodegenError

ADD = """
define i64 @lk_add(i64 %a, i64 %b) {
  %s = add i64 %a, %b
  ret i64 %s
}
"""

CALLS = """
declare i64 @lk_ext(i64)
define i64 @lk_twice(i64 %a) {
  %x = call i64 @lk_ext(i64 %a)
  %y = call i64 @lk_ext(i64 %x)
  ret i64 %y
}
"""


def test_host_and_version_match_llvmlite():
    jit.initialize()
    triple, cpu, features = linker.host_cpu()
    assert triple == llvm.get_process_triple()
    assert cpu == llvm.get_host_cpu_name()
    assert features == llvm.get_host_cpu_features().flatten()
    assert linker.llvm_version() == llvm.llvm_version_info


def test_link_calls_and_unloads():
    obj = jit.compile_ir(ADD, host(), 2)
    lib = linker.link([obj], "lk_test_add", ["lk_add"], {})
    add = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(lib["lk_add"])
    assert add(40, 2) == 42
    lib.close()
    lib.close()  # a second close does nothing
    dropped = linker.link([obj], "lk_test_add_dropped", ["lk_add"], {})
    del dropped
    gc.collect()
    assert linker._dead  # the finalizer only queues it (it may run under any lock)
    linker.link([obj], "lk_test_add_next", ["lk_add"], {}).close()
    assert not linker._dead  # unloaded by the next link


def test_link_resolves_imports_by_address():
    ext = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(lambda v: v * 3)
    addr = ctypes.cast(ext, ctypes.c_void_p).value
    obj = jit.compile_ir(CALLS, host(), 2)
    lib = linker.link([obj], "lk_test_calls", ["lk_twice"], {"lk_ext": addr})
    twice = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(lib["lk_twice"])
    assert twice(5) == 45


def test_several_objects_in_one_library():
    a = jit.compile_ir(ADD.replace("lk_add", "lk_add2"), host(), 2)
    b = jit.compile_ir(CALLS.replace("lk_ext", "lk_add3").replace("lk_twice", "lk_t2"), host(), 2)
    c = jit.compile_ir("define i64 @lk_add3(i64 %a) {\n %s = add i64 %a, 1\n ret i64 %s\n}", host())
    lib = linker.link([a, b, c], "lk_test_several", ["lk_add2", "lk_t2"], {})
    t2 = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(lib["lk_t2"])
    assert t2(1) == 3


def test_bad_object_code_is_a_codegen_error():
    with pytest.raises(CodegenError, match="linking compiled code failed"):
        linker.link([b"\x7fELF not really an object"], "lk_test_bad", ["f"], {})


def test_missing_export_is_a_codegen_error():
    obj = jit.compile_ir(ADD.replace("lk_add", "lk_add4"), host(), 2)
    with pytest.raises(CodegenError):
        linker.link([obj], "lk_test_missing", ["no_such_symbol"], {})


def test_load_objects_links_one_library():
    ext = jit.compile_ir(ADD.replace("lk_add", "lk_add5"), host(), 2)
    caller = CALLS.replace("lk_ext(i64 %a)", "lk_add5(i64 %a, i64 %a)")
    caller = caller.replace("lk_ext(i64 %x)", "lk_add5(i64 %x, i64 %x)")
    caller = caller.replace("declare i64 @lk_ext(i64)", "declare i64 @lk_add5(i64, i64)")
    obj = jit.compile_ir(caller.replace("lk_twice", "lk_quad"), host(), 2)
    a, b = jit.load_objects([(ext, "lk_add5", False, ()), (obj, "lk_quad", False, ("lk_add5",))])
    assert a.tracker is b.tracker and b.imports == ("lk_add5",) and b.obj == obj
    quad = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(b["lk_quad"])
    assert quad(3) == 12


def test_load_objects_refuses_duplicates_and_forward_calls():
    obj = jit.compile_ir(ADD.replace("lk_add", "lk_add6"), host(), 2)
    with pytest.raises(CodegenError, match="export one symbol"):
        jit.load_objects([(obj, "lk_add6", False, ()), (obj, "lk_add6", False, ())])
    with pytest.raises(CodegenError, match="not linked before it"):
        jit.load_objects([(obj, "lk_add6", False, ("lk_later",))])
