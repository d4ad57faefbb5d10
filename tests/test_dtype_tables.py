"""One dtype vocabulary: every per-target table in the exporter (C types, Triton types, torch dtypes, item sizes)
is keyed by exactly the dtypes of formats/dtypes.py, so a dtype added to the format cannot be half supported."""

import pytest

from tcexport.formats.dtypes import DTYPE_INFO

pytest.importorskip("torch")


def test_exporter_tables_cover_the_format_dtypes():
    from tcexport.exporter.cpu.codegen import CTYPE, STORAGE_CTYPE
    from tcexport.exporter.cuda.exprs import POINTER, TL_TYPE
    from tcexport.exporter.lower.context import TORCH_DTYPES
    from tcexport.exporter.schedule.memory import ITEMSIZE

    names = set(DTYPE_INFO)
    for table_name, table in {"CTYPE": CTYPE, "STORAGE_CTYPE": STORAGE_CTYPE, "TL_TYPE": TL_TYPE,
                              "POINTER": POINTER, "ITEMSIZE": ITEMSIZE}.items():
        assert set(table) == names, table_name
    assert set(TORCH_DTYPES.values()) == names
    assert all(ITEMSIZE[n] == info.itemsize for n, info in DTYPE_INFO.items())
