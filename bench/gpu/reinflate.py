#!/usr/bin/python3
"""Rebuilds a runnable ONNX file from a skeleton that bench/gpu/run brought
back (refused.tar.xz: the exports squish refused, their large initializers
emptied): each emptied initializer gets random values of its dims and type
(floats ~ N(0, 0.05), integers 0), so that the file imports and runs here
as it was exported there, with other weights.

    bench/gpu/reinflate.py SKELETON.onnx OUT.onnx
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper

MARK = "squish-skeleton: data dropped"


def reinflate(src, dst, seed=0):
    m = onnx.load(src)
    rng = np.random.default_rng(seed)
    n = 0
    for t in m.graph.initializer:
        if t.doc_string != MARK:
            continue
        dt = np.dtype(onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[t.data_type]) \
            if hasattr(onnx, "mapping") else onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
        shape = tuple(t.dims)
        if np.issubdtype(dt, np.floating):
            a = (rng.standard_normal(shape) * 0.05).astype(dt)
        else:
            a = np.zeros(shape, dtype=dt)
        t.CopyFrom(numpy_helper.from_array(a, t.name))
        n += 1
    onnx.save(m, dst)
    return n


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print("%d initializers refilled" % reinflate(sys.argv[1], sys.argv[2]))
