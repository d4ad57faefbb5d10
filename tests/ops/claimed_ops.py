"""The ops the lowering claims, as data: OpInfo names (``name`` or ``name.variant``) from torch's op_db, and the
dtypes each is tested in. Every claimed op is exported through the whole pipeline by test_opinfo.py; known gaps
are listed in expected_failures.py, never dropped from here.

The 16-bit floats (HALF) are claimed wherever their code differs from float32's: elementwise math, casts,
reductions and norms, GEMMs (computed in float32), convolution, pooling, indexing and joining. Pure views are
index arithmetic that never looks at the dtype, so they are not run again in float16 / bfloat16 (CI time).
"""

FLOAT = ("float32", "float64")
FLOAT_INT = FLOAT + ("int64",)
FLOAT_INT_BOOL = FLOAT_INT + ("bool",)
HALF = ("float16", "bfloat16")  # stored in 16 bits, computed in float32 (exporter/ir/loops.py HALF_DTYPES)
FLOAT_H = FLOAT + HALF
FLOAT_INT_H = FLOAT_INT + HALF
FLOAT_INT_BOOL_H = FLOAT_INT_BOOL + HALF

# op name -> dtypes its samples are generated in (op_db's own dtype support is intersected with this)
CLAIMED: dict[str, tuple] = {
    # elementwise
    "add": FLOAT_INT_H, "sub": FLOAT_INT_H, "mul": FLOAT_INT_BOOL_H, "div.no_rounding_mode": FLOAT_H,
    "div.trunc_rounding": FLOAT_INT_H, "div.floor_rounding": FLOAT_INT_H, "true_divide": FLOAT_H,
    "exp": FLOAT_H, "exp2": FLOAT_H, "expm1": FLOAT_H, "log": FLOAT_H, "log1p": FLOAT_H, "log2": FLOAT_H,
    "sqrt": FLOAT_H, "rsqrt": FLOAT_H, "erf": FLOAT_H, "tanh": FLOAT_H, "sigmoid": FLOAT_H, "sin": FLOAT_H,
    "cos": FLOAT_H, "tan": FLOAT_H, "atan": FLOAT_H, "reciprocal": FLOAT_H, "abs": FLOAT_INT_H, "neg": FLOAT_INT_H,
    "sign": FLOAT_INT_H, "floor": FLOAT_H, "ceil": FLOAT_H, "trunc": FLOAT_H, "round": FLOAT_H,
    "square": FLOAT_INT_H, "maximum": FLOAT_INT_BOOL_H, "minimum": FLOAT_INT_BOOL_H, "pow": FLOAT_H,
    "fmod": FLOAT_INT_H, "remainder": FLOAT_INT_H, "atan2": FLOAT_H, "where": FLOAT_INT_BOOL_H,
    "clamp": FLOAT_INT_H, "clamp_min": FLOAT_INT_H, "clamp_max": FLOAT_INT_H, "masked_fill": FLOAT_INT_BOOL_H,
    "lerp": FLOAT_H, "addcmul": FLOAT_H, "eq": FLOAT_INT_BOOL_H, "ne": FLOAT_INT_BOOL_H, "lt": FLOAT_INT_H,
    "le": FLOAT_INT_H, "gt": FLOAT_INT_H, "ge": FLOAT_INT_H, "logical_not": FLOAT_INT_BOOL_H,
    "bitwise_not": ("int64", "bool"),
    "logical_and": FLOAT_INT_BOOL_H, "isnan": FLOAT_H,
    "nn.functional.relu": FLOAT_INT_H, "nn.functional.gelu": FLOAT_H, "nn.functional.silu": FLOAT_H,
    "nn.functional.hardtanh": FLOAT_H, "nn.functional.leaky_relu": FLOAT_H, "nn.functional.elu": FLOAT_H,
    "nn.functional.softplus": FLOAT_H, "nn.functional.hardswish": FLOAT_H, "nn.functional.mish": FLOAT_H,
    # casts and copies (op_db's "to" only casts to float64: test_casts.py covers every pair of dtypes)
    "to": FLOAT_INT_BOOL_H, "clone": FLOAT_INT_BOOL_H, "contiguous": FLOAT_INT_BOOL_H,
    # reductions and scans
    "sum": FLOAT_INT_H, "mean": FLOAT_H, "amax": FLOAT_INT_H, "amin": FLOAT_INT_H, "prod": FLOAT_H, "var": FLOAT_H,
    "var.unbiased": FLOAT_H, "std": FLOAT_H, "std.unbiased": FLOAT_H, "argmax": FLOAT_INT_H, "argmin": FLOAT_INT_H,
    "any": FLOAT_INT_BOOL_H, "all": FLOAT_INT_BOOL_H, "cumsum": FLOAT_INT_H, "logsumexp": FLOAT_H,
    "softmax": FLOAT_H, "log_softmax": FLOAT_H, "softmax.with_dtype": ("float32",),
    "nn.functional.layer_norm": FLOAT_H, "nn.functional.rms_norm": FLOAT_H, "nn.functional.group_norm": FLOAT_H,
    "nn.functional.batch_norm": FLOAT_H, "linalg.vector_norm": FLOAT_H, "nn.functional.normalize": FLOAT_H,
    # indexing, joining, padding, masks
    "nn.functional.embedding": FLOAT_H, "index_select": FLOAT_INT_H, "gather": FLOAT_INT_H,
    "cat": FLOAT_INT_BOOL_H, "stack": FLOAT_INT_BOOL_H, "split": FLOAT_INT, "split.list_args": FLOAT_INT,
    "split_with_sizes": FLOAT_INT, "chunk": FLOAT_INT, "unbind": FLOAT_INT, "nn.functional.pad.constant": FLOAT_INT_H,
    "tril": FLOAT_INT_BOOL_H, "triu": FLOAT_INT_BOOL_H, "slice_scatter": FLOAT_INT_H, "select_scatter": FLOAT_INT_H,
    "repeat": FLOAT_INT_BOOL, "flip": FLOAT_INT,
    # views
    "transpose": FLOAT_INT_BOOL, "t": FLOAT_INT, "permute": FLOAT_INT_BOOL, "movedim": FLOAT_INT,
    "reshape": FLOAT_INT_BOOL, "view": FLOAT_INT_BOOL, "expand": FLOAT_INT_BOOL, "squeeze": FLOAT_INT_BOOL,
    "squeeze.multiple": FLOAT_INT, "unsqueeze": FLOAT_INT_BOOL, "flatten": FLOAT_INT_BOOL, "narrow": FLOAT_INT,
    # matrix products and attention (16-bit floats: float32 GEMMs on widened operands, rounded once)
    "matmul": FLOAT_H, "mm": FLOAT_H, "bmm": FLOAT_H, "baddbmm": FLOAT_H, "addmm": FLOAT_H,
    "addmm.decomposed": FLOAT_H, "mv": FLOAT_H, "dot": FLOAT_H, "outer": FLOAT_H, "nn.functional.linear": FLOAT_H,
    "nn.functional.scaled_dot_product_attention": FLOAT_H,
    # convolution and pooling
    "nn.functional.conv1d": FLOAT_H, "nn.functional.conv2d": FLOAT_H, "nn.functional.max_pool2d": FLOAT_H,
    "nn.functional.avg_pool2d": FLOAT_H, "nn.functional.adaptive_avg_pool2d": FLOAT_H,
}

# op_db's sample generators are long for some ops (max_pool2d has 1440); we test this many per (op, dtype),
# spread evenly over the usable ones; the 16-bit floats run the float32 code between their loads and stores
# (whose conversions test_runtime_math.py checks for every bit pattern), so fewer of their samples are run
SAMPLES_PER_OP = 5
SAMPLES_PER_DTYPE = {"float16": 3, "bfloat16": 3}
