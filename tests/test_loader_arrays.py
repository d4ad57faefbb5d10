"""Input/output conversion: numpy passes, torch tensors go through .numpy() and come back through from_numpy."""

import numpy as np
import pytest

from tcexport.formats.errors import DtypeError
from tcexport.loader.arrays import convert_inputs, convert_outputs, to_numpy
from tcexport.loader.dtypes import dtype_name


def test_numpy_passes_through_without_copy():
    a = np.ones((2, 3), np.float32)
    assert to_numpy(a, "x") is a


def test_non_contiguous_is_made_contiguous_and_scalars_stay_0d():
    a = np.ones((4, 3), np.float32).T
    out = to_numpy(a, "x")
    assert out.flags.c_contiguous and np.array_equal(out, a)
    assert to_numpy(np.array(2.0), "t").shape == ()


def test_saved_weights_keep_0d_shapes(tmp_path):
    """save_weights of a scalar parameter (and the GPU loader's unit gradient of a scalar loss) keep shape ()."""
    from tcexport.loader.weights import read_safetensors, safetensors_bytes

    path = tmp_path / "w.safetensors"
    path.write_bytes(safetensors_bytes({"scale": np.array(2.5, np.float32), "w": np.ones((2, 3), np.float32).T}))
    back = read_safetensors(path)
    assert back["scale"].shape == () and float(back["scale"]) == 2.5 and back["w"].shape == (3, 2)


def test_array_protocol_and_rejection():
    class HasArray:
        def __array__(self, dtype=None, copy=None):
            return np.arange(3, dtype=np.int32)
    assert to_numpy(HasArray(), "x").dtype == np.int32
    with pytest.raises(DtypeError, match="input 'x'.*list"):
        to_numpy([1, 2, 3], "x")


def test_torch_round_trip():
    torch = pytest.importorskip("torch")
    t = torch.randn(3, 4, requires_grad=True)
    arrays, as_torch = convert_inputs([t, np.zeros(2)], ["x", "y"])
    assert as_torch and arrays[0].dtype == np.float32
    np.testing.assert_array_equal(arrays[0], t.detach().numpy())
    out = convert_outputs([arrays[0] * 2], as_torch)[0]
    assert isinstance(out, torch.Tensor) and torch.equal(out, t.detach() * 2)


def test_torch_zero_copy_and_transposed():
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    a = to_numpy(t, "x")
    a[0, 0] = 42
    assert t[0, 0] == 42   # shares memory
    tt = t.t()
    assert np.array_equal(to_numpy(tt, "x"), tt.numpy())


def test_torch_bfloat16_and_bool():
    torch = pytest.importorskip("torch")
    t = torch.tensor([1.0, 2.5], dtype=torch.bfloat16)
    a = to_numpy(t, "x")
    assert dtype_name(a.dtype) == "bfloat16"
    back = convert_outputs([a], True)[0]
    assert back.dtype == torch.bfloat16 and torch.equal(back, t)
    b = convert_outputs([to_numpy(torch.tensor([True, False]), "m")], True)[0]
    assert b.dtype == torch.bool


def test_numpy_only_calls_get_numpy_back():
    arrays, as_torch = convert_inputs([np.zeros(2)], ["x"])
    assert not as_torch and convert_outputs(arrays, as_torch)[0] is arrays[0]


def test_torch_off_cpu_is_a_target_error():
    torch = pytest.importorskip("torch")
    from tcexport.formats.errors import TargetError
    with pytest.raises(TargetError, match="input 'x' is on device meta"):
        convert_inputs([np.zeros(2), torch.empty(2, device="meta")], ["y", "x"])


def test_torch_grad_bf16_and_lazy_views_are_resolved():
    torch = pytest.importorskip("torch")
    g = torch.tensor([1.0, -2.0], dtype=torch.bfloat16, requires_grad=True)
    c = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj()   # conjugate bit set: numpy() refuses it
    n = torch._neg_view(torch.tensor([1 + 1j], dtype=torch.complex64))   # negative bit set
    arrays, as_torch = convert_inputs([g, c, n], ["g", "c", "n"])
    assert as_torch and dtype_name(arrays[0].dtype) == "bfloat16"
    assert torch.equal(convert_outputs([arrays[0]], True)[0], g.detach())
    np.testing.assert_array_equal(arrays[1], np.array([1 - 2j, 3 + 1j], np.complex64))
    np.testing.assert_array_equal(arrays[2], np.array([-1 - 1j], np.complex64))


def test_torch_outputs_keep_dtype_for_every_untagged_dtype():
    torch = pytest.importorskip("torch")
    for dt in (np.float32, np.float16, np.int64, np.int32, np.uint8, np.bool_):
        a = np.zeros(3, dt)
        out = convert_outputs([a], True)[0]
        assert out.numpy().dtype == a.dtype and out.data_ptr() == a.ctypes.data   # zero copy


def test_a_device_array_keeps_its_bfloat16_dtype_when_passed_back():
    """The loader's own device arrays (outputs, a session's KV cache) can only say "<u2" through
    __cuda_array_interface__; passed back as inputs they keep their dtype, or a bf16 cache fails its own guard."""
    from tcexport.loader.cuda_arrays import DeviceArray, describe

    meta = describe(DeviceArray.alias(None, 4096, (2, 3), "bfloat16", owner=None), "cache", None)
    assert dtype_name(meta.dtype) == "bfloat16" and meta.shape == (2, 3) and meta.nbytes == 12 and not meta.host
