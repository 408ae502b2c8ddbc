import threading

import numpy as np
import pytest

from geode.errors import GeodeError
from geode.runtime.var_manager import (
    VarKey,
    VarKind,
    VarManager,
    VarManagerError,
    VarManagerPool,
)


@pytest.fixture
def vm():
    m = VarManager(session_id=1)
    yield m
    m.release()


def test_varkey_fields(vm):
    key = vm.register_constant("w", np.ones((2, 3), np.float32), format="NCHW")
    assert key == VarKey("w", "NCHW", "float32")
    assert key in vm and "w" in vm
    assert vm.kind(key) is VarKind.CONSTANT
    assert vm.lookup("w") == key
    assert vm.keys() == [key]


def test_constant_copied_and_read_only(vm):
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    key = vm.register_constant("c", src)
    src[0, 0] = 100.0  # the manager holds its own copy
    got = vm.get(key)
    assert got.shape == (2, 3) and got.dtype == np.float32
    np.testing.assert_array_equal(got, np.arange(6, dtype=np.float32).reshape(2, 3))
    assert not got.flags.writeable
    with pytest.raises(ValueError):
        got[0, 0] = 1.0
    with pytest.raises(VarManagerError, match="read-only"):
        vm.assign(key, np.zeros((2, 3), np.float32))


def test_identical_constants_dedup(vm):
    a = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    k1 = vm.register_constant("a", a)
    k2 = vm.register_constant("b", a.copy())
    assert k1 != k2
    assert vm.logic_address(k1) == vm.logic_address(k2)
    assert vm.nbytes == a.nbytes
    assert vm.dedup_saved_bytes == a.nbytes
    assert vm.info(k1).shared_with == (k2,)
    np.testing.assert_array_equal(vm.get(k2), a)
    text = vm.describe()
    assert "a[ND,float32]" in text and "shared-with" in text


def test_same_bytes_different_dtype_or_shape_not_dedup(vm):
    raw = np.arange(8, dtype=np.int32)
    k1 = vm.register_constant("i32", raw)
    k2 = vm.register_constant("f32", raw.view(np.float32))
    k3 = vm.register_constant("i32_2x4", raw.reshape(2, 4))
    addrs = {vm.logic_address(k) for k in (k1, k2, k3)}
    assert len(addrs) == 3
    assert vm.dedup_saved_bytes == 0
    assert vm.nbytes == 3 * raw.nbytes


def test_different_contents_not_dedup(vm):
    k1 = vm.register_constant("x", np.zeros(4, np.float32))
    k2 = vm.register_constant("y", np.ones(4, np.float32))
    assert vm.logic_address(k1) != vm.logic_address(k2)


def test_reregister_constant(vm):
    a = np.arange(4, dtype=np.int64)
    k = vm.register_constant("c", a)
    assert vm.register_constant("c", a.copy()) == k
    assert len(vm) == 1
    with pytest.raises(VarManagerError, match="different contents"):
        vm.register_constant("c", a + 1)
    with pytest.raises(VarManagerError, match="shape"):
        vm.register_constant("c", a.reshape(2, 2))
    with pytest.raises(VarManagerError, match="'c'"):
        vm.register_constant("c", a.astype(np.int32))
    with pytest.raises(VarManagerError, match="constant"):
        vm.register_variable("c", a)
    assert issubclass(VarManagerError, GeodeError)


def test_variables_not_dedup_and_assignable(vm):
    init = np.zeros((3, 4), np.float32)
    v1 = vm.register_variable("v1", init)
    v2 = vm.register_variable("v2", init)
    c = vm.register_constant("c", init)
    assert len({vm.logic_address(k) for k in (v1, v2, c)}) == 3
    assert vm.kind(v1) is VarKind.VARIABLE
    vm.assign(v1, np.full((3, 4), 2.0, np.float32))
    np.testing.assert_array_equal(vm.get(v1), 2.0)
    np.testing.assert_array_equal(vm.get(v2), 0.0)
    np.testing.assert_array_equal(vm.get(c), 0.0)
    view = vm.get(v2)
    assert view.flags.writeable
    view += 5.0  # writes through to session memory
    np.testing.assert_array_equal(vm.get(v2), 5.0)


def test_reregister_variable_keeps_current_value(vm):
    init = np.zeros(3, np.float32)
    k = vm.register_variable("v", init)
    vm.assign(k, np.ones(3, np.float32))
    assert vm.register_variable("v", init) == k
    np.testing.assert_array_equal(vm.get(k), 1.0)
    with pytest.raises(VarManagerError, match="initial value"):
        vm.register_variable("v", np.full(3, 7, np.float32))


def test_assign_errors_name_variable(vm):
    k = vm.register_variable("weights", np.zeros((2, 2), np.float32))
    with pytest.raises(VarManagerError, match=r"'weights'.*float32.*float64"):
        vm.assign(k, np.zeros((2, 2), np.float64))
    with pytest.raises(VarManagerError, match=r"'weights'.*\(2, 2\).*\(4,\)"):
        vm.assign(k, np.zeros(4, np.float32))


def test_unknown_key_error(vm):
    missing = VarKey("ghost", "ND", "float32")
    with pytest.raises(VarManagerError, match="ghost"):
        vm.get(missing)
    with pytest.raises(VarManagerError, match="ghost"):
        vm.logic_address("ghost")
    assert missing not in vm


def test_file_constant_lazy_single_load(vm):
    calls = []
    data = np.arange(12, dtype=np.float32).reshape(3, 4)

    def loader():
        calls.append(1)
        return data

    k = vm.register_file_constant("fc", loader, "float32", (3, 4), source=("w.bin", 0))
    addr = vm.logic_address(k)  # address reserved before loading
    assert calls == []
    assert vm.kind(k) is VarKind.FILE_CONSTANT
    assert "pending" in vm.describe()
    got = vm.get(k)
    assert calls == [1]
    np.testing.assert_array_equal(got, data)
    assert not got.flags.writeable
    vm.get(k)
    vm.get(k)
    assert calls == [1]
    assert vm.logic_address(k) == addr


def test_file_constant_dedup_by_source(vm):
    calls = []

    def make_loader(value):
        def loader():
            calls.append(value)
            return np.full(8, value, np.int32)

        return loader

    k1 = vm.register_file_constant("a", make_loader(1), np.int32, [8], source=("w.bin", 64))
    k2 = vm.register_file_constant("b", make_loader(1), np.int32, [8], source=("w.bin", 64))
    k3 = vm.register_file_constant("c", make_loader(2), np.int32, [8], source=("w.bin", 128))
    assert vm.logic_address(k1) == vm.logic_address(k2) != vm.logic_address(k3)
    np.testing.assert_array_equal(vm.get(k2), 1)
    np.testing.assert_array_equal(vm.get(k1), 1)
    np.testing.assert_array_equal(vm.get(k3), 2)
    assert sorted(calls) == [1, 2]
    assert vm.dedup_saved_bytes == 8 * 4


def test_file_constant_without_source_not_dedup(vm):
    k1 = vm.register_file_constant("a", lambda: np.zeros(2, np.float32), "float32", (2,))
    k2 = vm.register_file_constant("b", lambda: np.zeros(2, np.float32), "float32", (2,))
    assert vm.logic_address(k1) != vm.logic_address(k2)


def test_file_constant_wrong_shape_or_dtype(vm):
    k = vm.register_file_constant(
        "emb", lambda: np.zeros((4, 4), np.float32), "float32", (4, 8), source=("emb.bin", 0)
    )
    with pytest.raises(VarManagerError, match=r"'emb'.*emb\.bin.*\(4, 8\).*\(4, 4\)"):
        vm.get(k)
    k2 = vm.register_file_constant(
        "emb2", lambda: np.zeros(4, np.float64), "float32", (4,), source=("e2.bin", 0)
    )
    with pytest.raises(VarManagerError, match=r"'emb2'.*e2\.bin.*float64"):
        vm.get(k2)


def test_file_constant_loader_failure_then_retry(vm):
    state = {"fail": True}

    def loader():
        if state["fail"]:
            raise OSError("disk on fire")
        return np.ones(3, np.float32)

    k = vm.register_file_constant("f", loader, "float32", (3,), source=("x.bin", 0))
    with pytest.raises(VarManagerError, match=r"'f'.*x\.bin.*disk on fire"):
        vm.get(k)
    state["fail"] = False
    np.testing.assert_array_equal(vm.get(k), 1.0)


def test_file_constant_concurrent_first_get_loads_once(vm):
    calls = []
    lock = threading.Lock()

    def loader():
        with lock:
            calls.append(1)
        return np.ones(1000, np.float32)

    k = vm.register_file_constant("f", loader, "float32", (1000,))
    results = []
    threads = [threading.Thread(target=lambda: results.append(vm.get(k).sum())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1]
    assert results == [1000.0] * 8


def test_large_tensor_gets_own_region():
    m = VarManager(2, region_size=1024, alignment=64)
    small = m.register_constant("small", np.zeros(10, np.float32))
    big = m.register_constant("big", np.arange(1000, dtype=np.float32))
    small2 = m.register_constant("small2", np.ones(10, np.float32))
    assert m.num_regions == 2
    # the second small tensor still fits in the first region, right after the first
    assert m.logic_address(small2) == m.logic_address(small) + 64
    assert m.logic_address(big) >= m.logic_base + 1024
    np.testing.assert_array_equal(m.get(big), np.arange(1000, dtype=np.float32))
    # filling the first region opens a new one
    for i in range(20):
        m.register_variable(f"v{i}", np.full(10, i, np.float32))
    assert m.num_regions > 2
    for i in range(20):
        np.testing.assert_array_equal(m.get(f"v{i}"), i)


def test_addresses_aligned_and_distinct():
    m = VarManager(3, region_size=4096, alignment=128)
    rng = np.random.default_rng(1)
    keys = []
    for i in range(40):
        n = int(rng.integers(0, 300))
        if i % 2:
            keys.append(m.register_variable(f"v{i}", rng.standard_normal(n)))
        else:
            keys.append(m.register_constant(f"c{i}", rng.integers(0, 9, n).astype(np.int8)))
    addrs = [m.logic_address(k) for k in keys]
    assert all(a % 128 == 0 for a in addrs)
    assert len(set(addrs)) == len(addrs)
    # storage ranges do not overlap
    spans = sorted((m.logic_address(k), m.info(k).nbytes) for k in keys)
    for (a0, n0), (a1, _) in zip(spans, spans[1:]):
        assert a0 + max(n0, 1) <= a1
    # physical pointers are aligned too
    for k in keys:
        assert m.get(k).ctypes.data % 128 == 0
    m.release()


def test_zero_size_and_scalar_tensors(vm):
    e = vm.register_constant("empty", np.zeros((0, 3), np.float32))
    s = vm.register_variable("scalar", np.float64(2.5))
    assert vm.get(e).shape == (0, 3)
    assert vm.get(s).shape == () and vm.get(s)[()] == 2.5
    vm.assign(s, np.array(4.0))
    assert vm.get(s)[()] == 4.0
    assert vm.logic_address(e) != vm.logic_address(s)


def test_non_contiguous_and_non_native_input(vm):
    a = np.arange(12, dtype=">i4").reshape(3, 4).T
    k = vm.register_constant("t", a)
    assert k.dtype == "int32"
    got = vm.get(k)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, a)


def test_owners_and_memory_of(vm):
    a = np.arange(4, dtype=np.int32)
    k1 = vm.register_constant("a", a)
    k2 = vm.register_constant("b", a)
    addr = vm.logic_address(k1)
    assert vm.owners(addr) == [k1, k2]
    assert vm.owners(addr + 4) == [k1, k2]
    raw = vm.memory_of(addr + 4)
    assert raw.dtype == np.uint8 and raw.size == 12
    np.testing.assert_array_equal(raw.view(np.int32), [1, 2, 3])
    assert vm.owners(vm.logic_base - 8) == []
    with pytest.raises(VarManagerError, match="not inside"):
        vm.memory_of(addr + (1 << 30))


def test_object_dtype_rejected(vm):
    with pytest.raises(VarManagerError, match="'o'"):
        vm.register_constant("o", np.array([object()], dtype=object))


def test_release():
    m = VarManager(9)
    k = m.register_constant("c", np.ones(4))
    held = m.get(k)
    m.release()
    assert m.released
    np.testing.assert_array_equal(held, 1.0)  # still valid memory
    with pytest.raises(VarManagerError, match="released"):
        m.get(k)
    with pytest.raises(VarManagerError, match="released"):
        m.register_constant("d", np.ones(2))


def test_bad_construction():
    with pytest.raises(VarManagerError):
        VarManager(0, alignment=48)
    with pytest.raises(VarManagerError):
        VarManager(0, region_size=0)
    with pytest.raises(VarManagerError):
        VarManager(0, logic_base=100, alignment=64)


def test_pool_per_session():
    pool = VarManagerPool.instance()
    assert VarManagerPool.instance() is pool
    sid_a, sid_b = 90001, 90002
    try:
        a = pool.get(sid_a)
        b = pool.get(sid_b, region_size=4096)
        assert pool.get(sid_a) is a
        assert a is not b and a.session_id == sid_a and b.region_size == 4096
        assert {sid_a, sid_b} <= set(pool.sessions())
        ka = a.register_constant("w", np.ones(2))
        assert ka not in b
        assert pool.destroy(sid_a)
        assert a.released and sid_a not in pool.sessions()
        assert not pool.destroy(sid_a)
        assert pool.get(sid_a) is not a  # a fresh manager
    finally:
        pool.destroy(sid_a)
        pool.destroy(sid_b)


def test_thread_safety_smoke():
    m = VarManager(4, region_size=8192)
    shared = np.arange(64, dtype=np.float32)
    errors = []
    keys: dict[str, VarKey] = {}
    klock = threading.Lock()
    barrier = threading.Barrier(8)

    def work(t):
        try:
            barrier.wait()
            for i in range(50):
                kc = m.register_constant(f"c{t}_{i}", shared)
                kd = m.register_constant(f"d{t}_{i}", np.full(16, t * 1000 + i, np.int64))
                kv = m.register_variable(f"v{t}_{i}", np.full(8, i, np.float32))
                m.register_constant("common", shared)  # same name, same data: same key
                with klock:
                    keys.update({kc.name: kc, kd.name: kd, kv.name: kv})
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(m) == 8 * 50 * 3 + 1
    # all constants with the shared contents live at one address
    shared_addr = {m.logic_address(k) for n, k in keys.items() if n.startswith("c")}
    shared_addr.add(m.logic_address("common"))
    assert len(shared_addr) == 1
    for name, k in keys.items():
        t, i = (int(x) for x in name[1:].split("_"))
        if name.startswith("d"):
            np.testing.assert_array_equal(m.get(k), t * 1000 + i)
        elif name.startswith("v"):
            np.testing.assert_array_equal(m.get(k), i)
    addrs = [m.logic_address(k) for n, k in keys.items() if not n.startswith("c")]
    assert len(set(addrs)) == len(addrs)
    m.release()


# -- formats, declared variables, user-layout access -------------------------------------
def test_var_format_conversions_and_shapes():
    from geode.runtime import var_format

    fmt = var_format.transposed([1, 0])
    assert fmt == "TRANSPOSED(1,0)" and var_format.permutation(fmt) == (1, 0)
    assert var_format.transposed([0, 1]) == var_format.ND
    assert var_format.permutation("NCHW") is None  # a label: stored as the user sees it
    assert var_format.storage_shape((2, 3, 4), "TRANSPOSED(2,0,1)") == (4, 2, 3)
    assert var_format.user_shape((4, 2, 3), "TRANSPOSED(2,0,1)") == (2, 3, 4)
    a = np.arange(24).reshape(2, 3, 4)
    before = var_format.conversions()
    s = var_format.to_storage(a, "TRANSPOSED(2,0,1)")
    assert s.flags.c_contiguous and s.shape == (4, 2, 3)
    np.testing.assert_array_equal(var_format.from_storage(s, "TRANSPOSED(2,0,1)"), a)
    assert var_format.to_storage(a, "ND") is a
    assert var_format.conversions() == before + 2
    for bad, match in [("TRANSPOSED(1,1)", "not a permutation"), ("TRANSPOSED(x)", "malformed")]:
        with pytest.raises(GeodeError, match=match):
            var_format.permutation(bad)
    with pytest.raises(GeodeError, match="rank 3"):
        var_format.to_storage(a, "TRANSPOSED(1,0)")


def test_declared_variable_is_uninitialized_until_assigned(vm):
    key = vm.declare_variable("d", "float32", (2, 3))
    assert not vm.is_initialized(key) and not vm.info(key).initialized
    assert "uninitialized" in vm.describe()
    with pytest.raises(VarManagerError, match="'d' is read before it has a value"):
        vm.get(key)
    with pytest.raises(VarManagerError, match="'d' is read before"):
        vm.get_value("d")
    assert vm.declare_variable("d", "float32", (2, 3)) == key  # declaring again agrees
    with pytest.raises(VarManagerError, match="shape"):
        vm.declare_variable("d", "float32", (3, 2))
    vm.assign(key, np.ones((2, 3), np.float32))
    assert vm.is_initialized(key)
    np.testing.assert_array_equal(vm.get(key), 1.0)
    assert vm.variables() == [key]
    assert vm.snapshot()[0].name == "d"


def test_declared_variable_takes_a_later_initial_value(vm):
    vm.declare_variable("d", "float32", (2,))
    vm.register_variable("d", np.full(2, 4.0, np.float32))  # a graph with an initial value
    np.testing.assert_array_equal(vm.get("d"), 4.0)
    vm.assign("d", np.zeros(2, np.float32))
    vm.register_variable("d", np.full(2, 4.0, np.float32))  # same initial value: kept
    np.testing.assert_array_equal(vm.get("d"), 0.0)
    with pytest.raises(VarManagerError, match="different initial value"):
        vm.register_variable("d", np.full(2, 5.0, np.float32))


def test_user_layout_access_converts_a_transposed_variable(vm):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    key = vm.register_variable("w", w.T.copy(), "TRANSPOSED(1,0)")
    assert vm.info(key).shape == (3, 2) and vm.user_shape(key) == (2, 3)
    np.testing.assert_array_equal(vm.get_value(key), w)
    vm.set_value(key, w * 2)
    np.testing.assert_array_equal(vm.get(key), (w * 2).T)
    with pytest.raises(VarManagerError, match=r"expected shape \(2, 3\), got \(3, 2\)"):
        vm.set_value(key, w.T)
    with pytest.raises(VarManagerError, match="expected dtype float32"):
        vm.set_value(key, w.astype(np.float64))
    plain = vm.register_variable("p", np.ones(2, np.float32))
    got = vm.get_value(plain)
    got[:] = 7  # a copy, not the session's memory
    np.testing.assert_array_equal(vm.get(plain), 1.0)
    with pytest.raises(GeodeError, match="rank 1"):
        vm.register_variable("bad", np.ones(2, np.float32), "TRANSPOSED(1,0)")


# -- holds: a model's tensors leave the session with the model ------------------------------


def test_release_keys_forgets_a_tensor_after_its_last_hold():
    m = VarManager(5, region_size=1024)
    w = m.register_constant("a/w", np.arange(8, dtype=np.float32))
    assert m.register_constant("a/w", np.arange(8, dtype=np.float32)) == w  # a second hold
    assert m.release_keys([w]) == 0 and w in m
    assert m.release_keys([w]) == 1 and w not in m and len(m) == 0
    assert m.nbytes == 0 and m.num_regions == 0, "the region outlived its tensors"
    assert m.release_keys([w, VarKey("never", "ND", "float32")]) == 0  # unknown: ignored
    with pytest.raises(VarManagerError):
        m.hold(w)
    # a name forgotten can be registered again, with other contents
    w2 = m.register_constant("a/w", np.ones(3, np.float32))
    np.testing.assert_array_equal(m.get(w2), 1.0)


def test_variables_stay_when_their_models_go():
    """Variables are the session's state (graphs write them, checkpoints save them):
    released holds never forget them."""
    m = VarManager(7, region_size=1024)
    v = m.register_variable("v", np.zeros(4, np.float32))
    m.hold(v)
    m.assign(v, np.full(4, 3.0, np.float32))
    assert m.release_keys([v, v]) == 0 and v in m
    np.testing.assert_array_equal(m.get(v), 3.0)


def test_shared_storage_stays_while_any_key_holds_it():
    m = VarManager(6)
    data = np.arange(16, dtype=np.float32)
    a = m.register_constant("a/w", data)
    b = m.register_constant("b/w", data.copy())
    assert m.logic_address(a) == m.logic_address(b) and m.dedup_saved_bytes == data.nbytes
    m.release_keys([a])
    np.testing.assert_array_equal(m.get(b), data)
    assert m.nbytes == data.nbytes
    m.release_keys([b])
    assert m.nbytes == 0
    # the content index forgot the block: a new constant of those bytes gets new storage
    c = m.register_constant("c/w", data)
    np.testing.assert_array_equal(m.get(c), data)


def test_released_space_at_the_end_of_a_region_is_reused():
    m = VarManager(7, region_size=4096, alignment=64)
    keep = m.register_constant("keep", np.zeros(4, np.float32))
    tmp = m.register_constant("tmp", np.ones(100, np.float32))
    end = m.logic_address(tmp)
    m.release_keys([tmp])
    again = m.register_constant("again", np.full(100, 2.0, np.float32))
    assert m.logic_address(again) == end and m.num_regions == 1
    np.testing.assert_array_equal(m.get(keep), 0.0)
    np.testing.assert_array_equal(m.get(again), 2.0)


def test_a_models_constants_leave_the_session_with_the_model():
    import gc

    import geode

    g = geode.Graph("weights")
    x = g.input("x", [256])
    g.output(x * g.constant(np.arange(256, dtype=np.float32), name="w") + 1.0, names=["y"])
    with geode.Session() as sess:
        vm = sess.var_manager
        m1 = sess.compile(g)
        m2 = sess.compile(g)
        assert len([k for k in vm if k.name.endswith("/w")]) == 2
        before = vm.nbytes
        assert before >= 1024
        del m1
        gc.collect()
        assert len([k for k in vm if k.name.endswith("/w")]) == 1
        np.testing.assert_array_equal(m2(x=np.zeros(256, np.float32))["y"], 1.0)
        del m2
        gc.collect()
        assert len(vm) == 0 and vm.nbytes == 0 and vm.num_regions == 0


def test_a_release_inside_a_locked_section_waits_for_the_next_use():
    """The session releases a model's holds from a finalizer, which the garbage
    collector may run inside any allocation, even one the manager makes while it holds
    its lock: then the holds are dropped on the next use, not mid-operation."""
    m = VarManager(8)
    w = m.register_constant("a/w", np.ones(4, np.float32))
    with m._locked():  # as if the collector ran the finalizer here
        assert m.release_keys([w]) == 0
        assert w in m  # still there within the section
    assert w not in m and len(m) == 0  # dropped on the next use
