"""The ops the lowering claims, as data: OpInfo names (``name`` or ``name.variant``) from torch's op_db, and the
dtypes each is tested in. Every claimed op is exported through the whole pipeline by test_opinfo.py; known gaps
are listed in expected_failures.py, never dropped from here.
"""

FLOAT = ("float32", "float64")
FLOAT_INT = FLOAT + ("int64",)
FLOAT_INT_BOOL = FLOAT_INT + ("bool",)

# op name -> dtypes its samples are generated in (op_db's own dtype support is intersected with this)
CLAIMED: dict[str, tuple] = {
    # elementwise
    "add": FLOAT_INT, "sub": FLOAT_INT, "mul": FLOAT_INT_BOOL, "div.no_rounding_mode": FLOAT,
    "div.trunc_rounding": FLOAT_INT, "div.floor_rounding": FLOAT_INT, "true_divide": FLOAT,
    "exp": FLOAT, "exp2": FLOAT, "expm1": FLOAT, "log": FLOAT, "log1p": FLOAT, "log2": FLOAT, "sqrt": FLOAT,
    "rsqrt": FLOAT, "erf": FLOAT, "tanh": FLOAT, "sigmoid": FLOAT, "sin": FLOAT, "cos": FLOAT, "tan": FLOAT,
    "atan": FLOAT, "reciprocal": FLOAT, "abs": FLOAT_INT, "neg": FLOAT_INT, "sign": FLOAT_INT, "floor": FLOAT,
    "ceil": FLOAT, "trunc": FLOAT, "round": FLOAT, "square": FLOAT_INT,
    "maximum": FLOAT_INT_BOOL, "minimum": FLOAT_INT_BOOL, "pow": FLOAT, "fmod": FLOAT_INT,
    "remainder": FLOAT_INT, "atan2": FLOAT, "where": FLOAT_INT_BOOL, "clamp": FLOAT_INT, "clamp_min": FLOAT_INT,
    "clamp_max": FLOAT_INT, "masked_fill": FLOAT_INT_BOOL, "lerp": FLOAT, "addcmul": FLOAT,
    "eq": FLOAT_INT_BOOL, "ne": FLOAT_INT_BOOL, "lt": FLOAT_INT, "le": FLOAT_INT, "gt": FLOAT_INT,
    "ge": FLOAT_INT, "logical_not": FLOAT_INT_BOOL, "logical_and": FLOAT_INT_BOOL, "isnan": FLOAT,
    "nn.functional.relu": FLOAT_INT, "nn.functional.gelu": FLOAT, "nn.functional.silu": FLOAT,
    "nn.functional.hardtanh": FLOAT, "nn.functional.leaky_relu": FLOAT, "nn.functional.elu": FLOAT,
    "nn.functional.softplus": FLOAT, "nn.functional.hardswish": FLOAT, "nn.functional.mish": FLOAT,
    # casts and copies
    "to": FLOAT_INT_BOOL, "clone": FLOAT_INT_BOOL, "contiguous": FLOAT_INT_BOOL,
    # reductions and scans
    "sum": FLOAT_INT, "mean": FLOAT, "amax": FLOAT_INT, "amin": FLOAT_INT, "prod": FLOAT, "var": FLOAT,
    "var.unbiased": FLOAT, "std": FLOAT, "std.unbiased": FLOAT, "argmax": FLOAT_INT, "argmin": FLOAT_INT,
    "any": FLOAT_INT_BOOL, "all": FLOAT_INT_BOOL, "cumsum": FLOAT_INT, "logsumexp": FLOAT,
    "softmax": FLOAT, "log_softmax": FLOAT, "softmax.with_dtype": ("float32",),
    "nn.functional.layer_norm": FLOAT, "nn.functional.rms_norm": FLOAT, "nn.functional.group_norm": FLOAT,
    "nn.functional.batch_norm": FLOAT, "linalg.vector_norm": FLOAT, "nn.functional.normalize": FLOAT,
    # indexing, joining, padding, masks
    "nn.functional.embedding": FLOAT, "index_select": FLOAT_INT, "gather": FLOAT_INT, "cat": FLOAT_INT_BOOL,
    "stack": FLOAT_INT_BOOL, "split": FLOAT_INT, "split.list_args": FLOAT_INT, "split_with_sizes": FLOAT_INT,
    "chunk": FLOAT_INT, "unbind": FLOAT_INT, "nn.functional.pad.constant": FLOAT_INT, "tril": FLOAT_INT_BOOL,
    "triu": FLOAT_INT_BOOL, "slice_scatter": FLOAT_INT, "select_scatter": FLOAT_INT, "repeat": FLOAT_INT_BOOL,
    "flip": FLOAT_INT,
    # views
    "transpose": FLOAT_INT_BOOL, "t": FLOAT_INT, "permute": FLOAT_INT_BOOL, "movedim": FLOAT_INT,
    "reshape": FLOAT_INT_BOOL, "view": FLOAT_INT_BOOL, "expand": FLOAT_INT_BOOL, "squeeze": FLOAT_INT_BOOL,
    "squeeze.multiple": FLOAT_INT, "unsqueeze": FLOAT_INT_BOOL, "flatten": FLOAT_INT_BOOL, "narrow": FLOAT_INT,
    # matrix products and attention
    "matmul": FLOAT, "mm": FLOAT, "bmm": FLOAT, "baddbmm": FLOAT, "addmm": FLOAT, "addmm.decomposed": FLOAT,
    "mv": FLOAT, "dot": FLOAT, "outer": FLOAT, "nn.functional.linear": FLOAT,
    "nn.functional.scaled_dot_product_attention": FLOAT,
    # convolution and pooling
    "nn.functional.conv1d": FLOAT, "nn.functional.conv2d": FLOAT, "nn.functional.max_pool2d": FLOAT,
    "nn.functional.avg_pool2d": FLOAT, "nn.functional.adaptive_avg_pool2d": FLOAT,
}

# op_db's sample generators are long for some ops (max_pool2d has 1440); we test this many per (op, dtype),
# spread evenly over the usable ones
SAMPLES_PER_OP = 5
