"""Run a CUDA package: cubins loaded through the driver, weights uploaded once, kernels launched in planned order.

Inputs are torch CUDA tensors, CuPy arrays, or anything with ``__cuda_array_interface__``; outputs come back as
the same kind (torch and CuPy allocate them through the caller's own library, found in ``sys.modules``, so
their allocators and streams stay in charge; anything else gets a ``DeviceArray``). numpy arrays work too, for a
server whose requests arrive in host memory: they are copied up, and the outputs come back as numpy. Work goes onto the caller's
current stream (torch's or CuPy's), or the ``stream=`` given.

Per input-shape signature the launch sequence is built once as a CUDA graph and replayed, so a call costs a few
driver calls however many kernels the model has. The graph's kernels read the caller's inputs and write the
caller's outputs in place: only the few nodes that touch them are re-pointed, and only when an address changed
since the last replay (a copy out of graph-owned memory would add a full pass over the outputs: 100 MB of logits
for GPT-2 at batch 8). Host inputs, and device inputs that are not 16-byte aligned, are copied into the graph's
own buffer first. ``graphs=False`` launches kernel by kernel instead.
Kernels that index by data (embedding, gather) record an out-of-range index in an error word; the call then
synchronises and raises RuntimeKernelError (``check_indices=False`` skips that check and its synchronisation).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from tcexport.formats import expr as ex
from tcexport.formats.cubin import check_launch
from tcexport.formats.errors import FormatError, RuntimeKernelError, TargetError, TcError, WorkspaceLimitError
from tcexport.formats.manifest import SM_COUNT, KernelBundle, Manifest

from .archive import Archive
from .arrays import contiguous
from .cuda_arrays import DeviceArray, aligned, caller_stream, describe, is_torch, pointer, torch_module
from .guards import GuardPlan
from .launch_params import LaunchBuffers, bind_params, launch_grid
from .native_cuda import CudaError, Device, ParamBlock
from .weights import load_weights

GRAPH_CACHE = 16
SIGNATURES = 256  # input signatures (shapes, dtypes) whose guard results a model remembers
SPLIT_AFTER = 8   # kernels that must come before the first output-writing one for a graph to be cut there (_Graph)


def pick_bundle(manifest: Manifest, arch: int, path) -> KernelBundle:
    have = [k.target for k in manifest.kernels if k.is_cuda]
    for k in manifest.kernels:
        if k.target == f"cuda:sm_{arch}":
            return k
    listed = ", ".join(have) or "none (a CPU-only package)"
    raise TargetError(f"{path}: package has {listed}; this GPU is sm_{arch}. Rebuild with "
                      f"`tcexport MODEL.py --target cuda:sm_{arch}` (several archs: --target cuda:sm_80,sm_{arch}).")


# ---------------------------------------------------------------------------------------------------------
# the model


@dataclass
class CudaKernel:
    name: str
    function: object
    threads: int
    shared: int
    params: tuple
    grid: tuple
    symbol_kind: str  # "i32" or "i64": how its symbol parameters are passed
    dependent: bool = False  # it waits for the previous grid in the kernel: may launch as its dependent (§6a)
    scratch: int = 0  # bytes of global scratch per program (a persistent kernel's TMA descriptors, §6a)


@dataclass
class _Part:
    """A run of a signature's kernels instantiated as one CUDA graph."""

    graph: object
    graph_exec: object
    io: list          # (node, params struct, ParamBlock, [(slot, "input"/"output", index)]) per node touching them
    bound: tuple = () # the (input, output) addresses the io nodes point at now


@dataclass
class _Graph:
    """One shape signature's graph, with its own buffers for staged inputs and the workspace. It is cut in two
    before the first kernel that writes an output, when enough kernels come before it: the first part is launched
    before the outputs are allocated, so their allocation (11 us a call for GPT-2's logits on an H200) runs while
    the GPU works, instead of before it starts."""

    memory: int
    staging: list     # per input: device memory a host or misaligned input is copied into
    parts: list       # one or two _Parts, in launch order
    blocks: list      # ParamBlocks the nodes were built from (kept alive; the io nodes' are rewritten)
    probed: bool = False  # it copies the error word out after its last index-reading launch (build_graph)


class CudaModel:
    def __init__(self, archive: Archive, device: Device, *, graphs: bool = True, check_indices: bool = True,
                 dependent_launch: bool = True, max_workspace_bytes: int | None = None,
                 manifest: Manifest | None = None, shared_weights: "CudaModel | None" = None):
        """``manifest``: a method's view (Manifest.method) to run one method of a package; ``shared_weights``: a
        model of the same package whose device weights this one reads instead of uploading its own (a package's
        methods: one upload); that model owns and frees them."""
        m = archive.manifest if manifest is None else manifest
        self.archive, self.manifest, self.device = archive, m, device
        self.bundle = pick_bundle(m, device.arch, archive.path)
        self.max_workspace_bytes = max_workspace_bytes
        self._pid = os.getpid()  # a CUDA context does not survive fork(): a child must load its own model
        self.graphs = graphs
        self.dependent_launch = dependent_launch
        self.check_indices = check_indices
        self._plan = GuardPlan(m)
        self._modules = []
        self._scratch = (0, 0)  # (pointer, bytes): global scratch for SM_COUNT programs of any kernel (_load_kernels)
        self._graph_cache: OrderedDict = OrderedDict()
        self._kernels = self._load_kernels(m.cuda.launches, m.cubins(self.bundle.isa))
        self._checked = any(p["kind"] == "error" for k in self._kernels for p in k.params)
        if shared_weights is None:
            self._weights_ptr, self._weight_ptrs = self._upload_weights(load_weights(archive, m))
        else:  # not ours to free (_free_memory skips a null pointer)
            self._weights_ptr, self._weight_ptrs = 0, shared_weights._weight_ptrs
        self._error = device.alloc(4)
        self._error_host = device.alloc_host(4)  # the call's check is one queued copy and one wait
        self._error_word = ctypes.c_int32.from_address(self._error_host)
        device.memset32_async(self._error, 0, 1, 0)
        device.synchronize(0)
        # a graph records _probe once its last index-reading kernel is done (_raise_on_bad_index); _done at the
        # end of each call, so that a call on another stream starts after it (staging and workspace are shared)
        self._probe = device.event() if self._checked and check_indices else None
        self._done = device.event()
        self._last_stream = None
        self._workspace = (0, 0)  # (pointer, bytes) for calls without graphs
        self._out_specs = [(s.shape, s.dtype) for s in m.outputs]
        self._input_names = [s.name for s in m.inputs]
        self._single = m.output_structure == "single"
        self._lock = threading.Lock()  # graphs and the workspace are shared: one call at a time per model
        self._signatures: dict = {}  # _guarded
        self._out_shapes: dict = {}  # symbol values -> output shapes (_new_outputs)

    # setup ---------------------------------------------------------------------------------------------

    def _load_kernels(self, launches, cubins) -> list[CudaKernel]:
        """The launches' kernels, each cubin checked against its launch first (formats/cubin.py: arch, parameter
        count and widths, block size), with the global scratch they need reserved."""
        kernels = []
        datas = checked_cubins(self.archive, self.bundle, launches, cubins, self.device.max_shared)
        for launch, cubin, data in zip(launches, cubins, datas):
            module, fn = self.device.load_function(data, cubin.function, cubin.shared)
            self._modules.append(module)
            kernels.append(CudaKernel(launch.name, fn, cubin.num_warps * 32, cubin.shared, launch.params,
                                   launch.grid, "i32" if launch.index_bits == 32 else "i64", cubin.dependent,
                                   cubin.global_scratch))
        self.reserve_scratch(max((k.scratch for k in kernels), default=0))
        return kernels

    def reserve_scratch(self, per_program: int) -> None:
        """Global scratch for SM_COUNT programs of ``per_program`` bytes each: a kernel that needs it is persistent,
        its grid at most SM_COUNT programs (SPEC §6a). Growing it drops the captured graphs, which hold the old
        address (none yet while the model loads its kernels)."""
        need = per_program * self.device.sm_count
        if need > self._scratch[1]:
            for g in self._graph_cache.values():
                self._drop(g)
            self._graph_cache.clear()
            if self._scratch[0]:
                self.device.synchronize_context()  # direct launches may still read the old buffer
                self.device.free(self._scratch[0])
            self._scratch = (self.device.alloc(need), need)

    def _upload_weights(self, arrays: dict) -> tuple[int, list]:
        specs = self.manifest.weights
        offsets, total = [], 0
        for w in specs:
            offsets.append(total)
            total += aligned(arrays[w.name].nbytes)
        base = self.device.alloc(total) if total else 0
        for w, off in zip(specs, offsets):
            a = contiguous(arrays[w.name])
            if a.nbytes:
                self.device.upload(base + off, a.ctypes.data, a.nbytes)
        return base, [base + off for off in offsets]

    # calls ---------------------------------------------------------------------------------------------

    def __call__(self, *args, stream: int | None = None, **kwargs):
        with self._lock:
            return self._call(args, stream, kwargs)

    def close(self) -> None:
        """Give this model's device memory back (weights, workspaces, captured graphs) and unload its kernels,
        after the work already queued finishes: what a server does when it swaps models. Torch tensors from
        ``parameters()`` must not be used afterwards. Calling the model afterwards raises; closing twice is fine."""
        with self._lock:
            if self._modules is None:
                return
            self.device.synchronize_context()
            for g in self._graph_cache.values():
                self._drop(g)
            self._graph_cache.clear()
            self._free_memory()
            for event in (self._probe, self._done):
                if event is not None:
                    self.device.destroy_event(event)
            for module in self._modules:
                self.device.unload(module)
            self._modules = None

    def _require_open(self) -> None:
        if self._modules is None:
            raise TcError(f"model {self.manifest.model!r} on cuda:{self.device.ordinal} was closed (close() gave its "
                          "device memory back); load the package again to use it")

    def _free_memory(self) -> None:
        for ptr in (self._workspace[0], self._weights_ptr, self._error, self._scratch[0]):
            if ptr:
                self.device.free(ptr)
        self.device.free_host(self._error_host)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _bind(self, args, kwargs, stream) -> tuple[list, list, dict, int]:
        """The call's input values, their descriptions, the symbols the guards bound, and the stream."""
        self._require_open()
        if os.getpid() != self._pid:
            raise CudaError(f"model {self.manifest.model!r} was loaded on cuda:{self.device.ordinal} by process "
                            f"{self._pid}; this process ({os.getpid()}) is a fork of it, and a CUDA context does not "
                            f"survive fork(). Load the package in this process (or start workers with 'spawn').")
        names = self._input_names
        values = list(args) + [kwargs.pop(n) for n in names[len(args):] if n in kwargs]
        if kwargs:
            raise TcError(f"unknown input name(s) {sorted(kwargs)}; the inputs are {names}")
        self.device.make_current()
        values = [contiguous(v) if isinstance(v, np.ndarray) else v for v in values]
        metas = [describe(v, n, self.device) for v, n in zip(values, names)]
        return values, metas, self._guarded(metas), caller_stream(values, self.device) if stream is None else \
            int(stream)

    def _guarded(self, metas) -> dict:
        """The guards' symbol values for these inputs. The guards are a function of each input's shape and dtype
        alone, so they run once per signature and its result is remembered; a server's call then skips them.
        The key holds each dtype object's identity (a tagged bfloat16 equals a plain uint16 under ==), and the
        entry keeps those objects alive so that no other dtype can take their id."""
        key = tuple((m.shape, id(m.dtype)) for m in metas)
        hit = self._signatures.get(key)
        if hit is not None:
            return hit[0]
        env = self._plan.check(metas)
        if len(self._signatures) >= SIGNATURES:
            self._signatures.pop(next(iter(self._signatures)))
        self._signatures[key] = (env, [m.dtype for m in metas])
        return env

    def outputs_of(self, values: list, preset: dict, stream: int | None = None) -> list:
        """Every output of one call on ``values`` (every graph input, in manifest order), as a list; ``preset``
        maps output indices to the device arrays written in place of new ones (a state, loader/state.py)."""
        with self._lock:
            return self._outputs(values, stream, {}, preset)

    def _call(self, args, stream, kwargs):
        outs = self._outputs(args, stream, kwargs)
        return outs[0] if self._single else tuple(outs)

    def _outputs(self, args, stream, kwargs, preset: dict | None = None) -> list:
        values, metas, env, stream = self._bind(args, kwargs, stream)
        if self._last_stream is not None and stream != self._last_stream:
            self.device.wait_event(stream, self._done)
        if self.graphs:
            outs, probed = self._run_graph(values, metas, env, stream, preset)
        else:
            outs, probed = self._new_outputs(values, env, preset=preset), False
            self._run_direct(metas, [pointer(o) for o in outs], env, stream)
        self.device.record(self._done, stream)
        self._last_stream = stream
        if self._checked and self.check_indices:
            self._raise_on_bad_index(stream, probed=probed)
        if values and all(m.host for m in metas):
            # the early index check may have returned while the kernels run on; a synchronous download only
            # waits for the legacy stream, not for a non-blocking one passed as stream=
            self.device.synchronize(stream)
            outs = [o.numpy() for o in outs]
        return outs

    def _new_outputs(self, values, env, specs=None, preset: dict | None = None) -> list:
        """Arrays for ``specs`` ((shape, dtype) pairs; default: the model's outputs) of the kind ``values`` are;
        the ``preset`` ones (output index -> array, a state's) as given, never allocated."""
        if specs is None:
            specs, key = self._out_specs, tuple(env.items())
            shapes = self._out_shapes.get(key)
            if shapes is None:
                shapes = [tuple(ex.evaluate(d, env) for d in shape) for shape, _ in specs]
                if len(self._out_shapes) >= SIGNATURES:
                    self._out_shapes.pop(next(iter(self._out_shapes)))
                self._out_shapes[key] = shapes
        else:
            shapes = [tuple(ex.evaluate(d, env) for d in shape) for shape, _ in specs]
        preset = preset or {}
        if any(is_torch(v) for v in values):
            torch = torch_module()
            new = lambda s, dt: torch.empty(s, dtype=getattr(torch, dt), device=self.device.ordinal)
        else:
            cupy = sys.modules.get("cupy")
            if cupy is not None and any(isinstance(v, cupy.ndarray) for v in values) \
                    and not any(dt == "bfloat16" for _, dt in specs):
                new = lambda s, dt: cupy.empty(s, dtype=dt)
            else:
                new = lambda s, dt: DeviceArray(self.device, s, dt)
        return [preset[k] if k in preset else new(s, dt) for k, (s, (_, dt)) in enumerate(zip(shapes, specs))]

    def _blocks(self, inputs: list, outputs: list, workspace: int, env: dict, kernels=None) -> list:
        """One ParamBlock and grid per kernel (default: the inference ones) for these buffer addresses and
        symbol values (bound by launch_params, as the exporter's interpreter check binds them)."""
        out = []
        buffers = LaunchBuffers(inputs, self._weight_ptrs, outputs, self._error, lambda offset, _: workspace + offset)
        for k in self._kernels if kernels is None else kernels:
            bound = bind_params(k.params, env, buffers)
            values = [v for _, v in bound]
            kinds = [k.symbol_kind if kind == "symbol" else "ptr" for kind, _ in bound]
            grid = launch_grid(k.name, k.grid, env, self.device.sm_count)
            if k.scratch and k.scratch * grid[0] * grid[1] * grid[2] > self._scratch[1]:
                raise FormatError(
                    f"kernel {k.name}: its grid {grid} needs {k.scratch} bytes of global scratch a program, more "
                    f"than the {self._scratch[1]} reserved for {self.device.sm_count} programs; a kernel with "
                    f"scratch must be persistent (grid min({SM_COUNT}, ...), SPEC §6a). The package is damaged: "
                    "rebuild it")
            out.append((k, ParamBlock(values, kinds, self._scratch[0] if k.scratch else 0), grid))
        return out

    def _launch_all(self, blocks: list, stream: int) -> None:
        for k, block, grid in blocks:
            if min(grid) > 0:
                self.device.launch(k.function, grid, k.threads, k.shared, stream, block.address)

    def _run_direct(self, metas, out_ptrs, env, stream) -> None:
        need = self._arena(self.manifest.cuda.workspace_bytes, env)
        inputs = []
        in_bytes = sum(aligned(m.nbytes) for m in metas if m.ptr % 16 or m.host)
        ptr, size = self._workspace
        if size < need + in_bytes:
            if ptr:
                self.device.synchronize(0)
                self.device.free(ptr)
            size = aligned(need + in_bytes) * 2
            ptr = self.device.alloc(size)
            self._workspace = (ptr, size)
        spare = ptr + aligned(need)
        for m in metas:  # kernels assume 16-byte aligned pointers; a misaligned view is copied
            if m.host:
                self.device.upload_async(spare, m.ptr, m.nbytes, stream)
                inputs.append(spare)
                spare += aligned(m.nbytes)
            elif m.ptr % 16:
                self.device.copy_async(spare, m.ptr, m.nbytes, stream)
                inputs.append(spare)
                spare += aligned(m.nbytes)
            else:
                inputs.append(m.ptr)
        self._launch_all(self._blocks(inputs, out_ptrs, ptr, env), stream)

    def _run_graph(self, values, metas, env, stream, preset: dict | None = None) -> tuple[list, bool]:
        """Replay this shape's graph (built on first use) into new outputs; and whether it copies the error word
        out early."""
        key = tuple(m.shape for m in metas)
        g = self._graph_cache.get(key)
        if g is None:
            g = self._build_graph(metas, env)
            self._graph_cache[key] = g
            if len(self._graph_cache) > GRAPH_CACHE:
                self._drop(self._graph_cache.popitem(last=False)[1])
        else:
            self._graph_cache.move_to_end(key)
        in_ptrs = []
        for staged, m in zip(g.staging, metas):
            if m.host or m.ptr % 16:  # kernels assume 16-byte aligned pointers
                if m.nbytes:
                    (self.device.upload_async if m.host else self.device.copy_async)(staged, m.ptr, m.nbytes, stream)
                in_ptrs.append(staged)
            else:
                in_ptrs.append(m.ptr)
        in_ptrs = tuple(in_ptrs)
        *head, tail = g.parts
        for part in head:  # reads inputs, writes no output
            self._point(part, (in_ptrs, ()))
            self.device.graph_launch(part.graph_exec, stream)
        outs = self._new_outputs(values, env, preset=preset)
        self._point(tail, (in_ptrs, tuple(pointer(o) for o in outs)))
        self.device.graph_launch(tail.graph_exec, stream)
        return outs, g.probed

    def _point(self, part: _Part, bound: tuple) -> None:
        """Point the part's nodes that read inputs or write outputs at ``bound`` = (input, output) addresses."""
        if bound == part.bound:
            return
        for node, params, block, slots in part.io:
            for slot, kind, index in slots:
                block.values[slot].value = bound[0 if kind == "input" else 1][index]
            self.device.set_kernel_node(part.graph_exec, node, params)
        part.bound = bound

    def _arena(self, expr, env) -> int:
        """The workspace a call needs, refused (before anything is allocated) past ``max_workspace_bytes``."""
        need = ex.evaluate(expr, env)
        if need < 0:
            raise FormatError(f"manifest workspace_bytes evaluated to {need} for {env}; rebuild the package")
        if self.max_workspace_bytes is not None and need > self.max_workspace_bytes:
            raise WorkspaceLimitError(
                f"model {self.manifest.model!r}: a call with {env} needs {need} bytes of workspace; this model was "
                f"loaded with max_workspace_bytes={self.max_workspace_bytes}. Pass smaller inputs, or load it with "
                f"a larger limit.", expected=self.max_workspace_bytes, got=need, rule="max_workspace_bytes")
        return need

    def _build_graph(self, metas, env) -> _Graph:
        work = self._arena(self.manifest.cuda.workspace_bytes, env)
        sizes = [aligned(m.nbytes) for m in metas] + [aligned(work)]
        memory = self.device.alloc(sum(sizes))
        ptrs, at = [], memory
        for s in sizes:
            ptrs.append(at)
            at += s
        blocks = [b for b in self._blocks(ptrs[:-1], [0] * len(self._out_specs), ptrs[-1], env) if min(b[2]) > 0]
        last = max((i for i, (k, _, _) in enumerate(blocks) if any(p["kind"] == "error" for p in k.params)),
                   default=None)
        first_out = next((i for i, (k, _, _) in enumerate(blocks) if any(p["kind"] == "output" for p in k.params)),
                         len(blocks))
        cuts = [0, first_out, len(blocks)] if SPLIT_AFTER <= first_out < len(blocks) else [0, len(blocks)]
        parts = []
        for lo, hi in zip(cuts, cuts[1:]):
            probe = None if self._probe is None or last is None or not lo <= last < hi else \
                (last - lo, self._error, self._error_host, 4, self._probe)
            graph, graph_exec, nodes = self.device.build_graph(
                ((k.function, grid, k.threads, k.shared, block.address, self.dependent_launch and k.dependent)
                 for k, block, grid in blocks[lo:hi]), probe)
            io = []
            for (k, block, _), (node, params) in zip(blocks[lo:hi], nodes):
                slots = [(i, p["kind"], p["value"]) for i, p in enumerate(k.params)
                         if p["kind"] in ("input", "output")]
                if slots:
                    io.append((node, params, block, slots))
            parts.append(_Part(graph, graph_exec, io))
        return _Graph(memory, ptrs[:-1], parts, blocks, probed=self._probe is not None and last is not None)

    def _drop(self, g: _Graph) -> None:
        self.device.synchronize(0)
        for part in g.parts:
            self.device.destroy_graph(part.graph, part.graph_exec)
        self.device.free(g.memory)

    def _raise_on_bad_index(self, stream: int, kernels=None, probed: bool = False) -> None:
        """Raise if a kernel found an index out of range. A ``probed`` graph copied the error word out after its
        last kernel that reads indices: the wait ends there and the rest of the call runs on after this returns
        (GPT-2's token ids are read in its first layer; waiting for the whole graph cost 17-55 us a call on an
        H200). Otherwise: one queued copy and a wait for the stream."""
        if probed:
            self.device.event_synchronize(self._probe)
        else:
            self.device.download_async(self._error_host, self._error, 4, stream)
            self.device.synchronize(stream)
        code = self._error_word.value
        if code:
            self.device.memset32_async(self._error, 0, 1, stream)
            self.device.synchronize(stream)
            kernels = self._kernels if kernels is None else kernels
            raise RuntimeKernelError(f"kernel {kernels[code - 1].name}: an index read from a tensor is out of "
                                     "range (negative, or not below the size of the dim it indexes). Check the "
                                     "index inputs, e.g. token ids against the vocabulary size.")

    # introspection ---------------------------------------------------------------------------------------

    @property
    def methods(self):
        """``forward`` alone, this model: a package without methods (SPEC §2c), so that code calling
        ``m.methods[name]`` runs any package."""
        from .method_table import Methods

        return Methods({"forward": self}, self.manifest.model)

    @property
    def inputs(self):
        return list(self.manifest.inputs)

    @property
    def outputs(self):
        return list(self.manifest.outputs)

    def __repr__(self) -> str:
        return (f"CudaModel({self.manifest.model!r}, {self.bundle.target}, device cuda:{self.device.ordinal} "
                f"({self.device.name}), graphs={self.graphs})")


def checked_cubins(archive: Archive, bundle: KernelBundle, launches, cubins, max_shared: int) -> list[bytes]:
    """Each launch's cubin bytes, checked against the launch before any reaches the driver (formats/cubin.py: the
    arch, the function, its parameters' count and widths, its block size) and its shared memory against the GPU's
    limit; runs without a GPU given ``max_shared``."""
    arch = int(bundle.isa[3:]) if bundle.isa[3:].isdigit() else -1
    out = []
    for launch, cubin in zip(launches, cubins):
        data = archive.read(cubin.file)
        check_launch(data, launch, cubin, arch, str(archive.path))
        if cubin.shared > max_shared:
            raise FormatError(f"{archive.path}: launch {launch.name!r} asks for {cubin.shared} bytes of shared "
                              f"memory; this GPU allows {max_shared} a block. The manifest was edited, or the "
                              f"package is for another GPU; rebuild it.")
        out.append(data)
    return out
