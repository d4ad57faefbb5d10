"""The CUDA driver, through NVIDIA's ``cuda-bindings`` (imported only when a GPU package is loaded).

Every call is checked: a failing driver call raises CudaError naming the call and the driver's own error name.
Nothing here knows about packages; cuda_model.py does.
"""

from __future__ import annotations

import ctypes

from tcexport.formats.errors import TcError


class CudaError(TcError):
    """A CUDA driver call failed, or the CUDA driver / cuda-bindings is missing."""

    exit_code = 7


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python before 12.6 spelled it this way
        except ImportError:
            raise CudaError("loading a CUDA package needs NVIDIA's cuda-bindings: pip install cuda-bindings "
                            "(or cuda-python); it also needs the NVIDIA driver (libcuda.so.1)") from None
    return driver


def check(result, call: str):
    """Unpack a cuda-bindings result tuple, raising CudaError when its status is not CUDA_SUCCESS."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        drv = _driver()
        name = drv.cuGetErrorName(err)[1]
        text = drv.cuGetErrorString(err)[1]
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
        raise CudaError(f"CUDA driver call {call} failed: {name} ({text})")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


class Device:
    """One GPU's primary context (the one PyTorch and CuPy use too, so pointers are interchangeable)."""

    def __init__(self, ordinal: int):
        self.cu = cu = _driver()
        try:
            status = cu.cuInit(0)
        except Exception as e:  # noqa: BLE001 - cuda-bindings raises its loader's own types when libcuda is missing
            raise CudaError(f"cuda-bindings could not load the NVIDIA driver (libcuda.so.1): {e}. A CUDA package "
                            "needs an NVIDIA GPU and its driver on this machine; on a machine without one, "
                            "`tcexport verify` runs the package's kernels in Triton's interpreter") from None
        check(status, "cuInit")
        count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        if not 0 <= ordinal < count:
            raise CudaError(f"device cuda:{ordinal} does not exist; this machine has {count} CUDA device(s)")
        self.ordinal = ordinal
        self.device = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = check(cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.make_current()
        attr = cu.CUdevice_attribute
        major = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device), "cc")
        minor = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device), "cc")
        self.arch = major * 10 + minor
        self.sm_count = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.device),
                              "multiprocessor count")
        self.max_shared = check(cu.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self.device), "max shared memory per block")
        self.programmatic_edges = self.arch >= 90  # build_graph: until the driver turns one down
        name = check(cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = name.split(b"\0")[0].decode() if isinstance(name, bytes) else str(name)

    def make_current(self) -> None:
        check(self.cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    # memory ----------------------------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> int:
        return int(check(self.cu.cuMemAlloc(max(int(nbytes), 1)), f"cuMemAlloc({nbytes})"))

    def free(self, ptr: int) -> None:
        check(self.cu.cuMemFree(ptr), "cuMemFree")

    def alloc_host(self, nbytes: int) -> int:
        """Page-locked host memory: a copy into it is truly asynchronous, so it can be queued behind the kernels."""
        return int(check(self.cu.cuMemAllocHost(max(int(nbytes), 1)), f"cuMemAllocHost({nbytes})"))

    def free_host(self, ptr: int) -> None:
        check(self.cu.cuMemFreeHost(ptr), "cuMemFreeHost")

    def upload(self, dst: int, host, nbytes: int) -> None:
        check(self.cu.cuMemcpyHtoD(dst, host, nbytes), "cuMemcpyHtoD")

    def upload_async(self, dst: int, host: int, nbytes: int, stream: int) -> None:
        """From pageable host memory: the driver stages it, so the host buffer is free to reuse on return."""
        check(self.cu.cuMemcpyHtoDAsync(dst, host, nbytes, stream), "cuMemcpyHtoDAsync")

    def download(self, host, src: int, nbytes: int) -> None:
        check(self.cu.cuMemcpyDtoH(host, src, nbytes), "cuMemcpyDtoH")

    def download_async(self, host: int, src: int, nbytes: int, stream: int) -> None:
        check(self.cu.cuMemcpyDtoHAsync(host, src, nbytes, stream), "cuMemcpyDtoHAsync")

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        check(self.cu.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")

    def memset32_async(self, dst: int, value: int, count: int, stream: int) -> None:
        check(self.cu.cuMemsetD32Async(dst, value, count, stream), "cuMemsetD32Async")

    # kernels ---------------------------------------------------------------------------------------------

    def load_function(self, cubin: bytes, name: str, shared: int):
        module = check(self.cu.cuModuleLoadData(cubin), f"cuModuleLoadData({name})")
        fn = check(self.cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
        if shared > 48 * 1024:
            attr = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(self.cu.cuFuncSetAttribute(fn, attr, shared), f"cuFuncSetAttribute({name})")
        return module, fn

    def unload(self, module) -> None:
        check(self.cu.cuModuleUnload(module), "cuModuleUnload")

    def launch(self, fn, grid: tuple, threads: int, shared: int, stream: int, params_address: int) -> None:
        check(self.cu.cuLaunchKernel(fn, grid[0], grid[1], grid[2], threads, 1, 1, shared, stream,
                                     params_address, 0), "cuLaunchKernel")

    # streams and graphs ----------------------------------------------------------------------------------

    def synchronize(self, stream: int) -> None:
        check(self.cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def synchronize_context(self) -> None:
        """Wait for all work of this context on every stream (before weights are read or written)."""
        self.make_current()
        check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def event(self):
        """An event without timing data (the cheaper kind to record and wait on)."""
        flags = self.cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        return check(self.cu.cuEventCreate(flags), "cuEventCreate")

    def record(self, event, stream: int) -> None:
        check(self.cu.cuEventRecord(event, stream), "cuEventRecord")

    def wait_event(self, stream: int, event) -> None:
        """Make ``stream``'s later work wait for ``event`` (on the GPU; the host does not block)."""
        check(self.cu.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")

    def event_synchronize(self, event) -> None:
        check(self.cu.cuEventSynchronize(event), "cuEventSynchronize")

    def destroy_event(self, event) -> None:
        check(self.cu.cuEventDestroy(event), "cuEventDestroy")

    def build_graph(self, launches, probe=None) -> tuple:
        """A graph of kernel nodes that run one after another (what capturing ``launches``, tuples of (function,
        grid, threads, shared, params address, dependent), on one stream would give), instantiated; with each
        node and its parameter struct, so that a replay can point a node at other buffers (``set_kernel_node``).
        A ``dependent`` kernel hangs off the one before it by a programmatic edge: it starts while that one
        finishes, and waits for it inside (its cubin's ``dependent`` flag says it does); a driver without such
        edges (before CUDA 12.3) gets an ordinary one.

        ``probe`` = (index, device src, pinned host dst, bytes, event): a branch off launch ``index`` that copies
        src to dst and then records the event, while the launches after it go on; waiting for the event then
        waits for that launch only, not for the whole graph."""
        cu = self.cu
        graph = check(cu.cuGraphCreate(0), "cuGraphCreate")
        nodes, after = [], []
        for fn, grid, threads, shared, params_address, dependent in launches:
            p = cu.CUDA_KERNEL_NODE_PARAMS()
            p.func = fn
            p.gridDimX, p.gridDimY, p.gridDimZ = grid
            p.blockDimX, p.blockDimY, p.blockDimZ = threads, 1, 1
            p.sharedMemBytes = shared
            p.kernelParams = params_address
            programmatic = dependent and bool(after) and self.programmatic_edges
            deps = [] if programmatic else after
            node = check(cu.cuGraphAddKernelNode(graph, deps, len(deps), p), "cuGraphAddKernelNode")
            if programmatic and not self._programmatic_edge(graph, after[0], node):
                self._edge(graph, after[0], node)
            nodes.append((node, p))
            after = [node]
        if probe is not None:
            index, src, dst, nbytes, event = probe
            c = cu.CUDA_MEMCPY3D()
            c.srcMemoryType, c.srcDevice = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE, src
            c.dstMemoryType, c.dstHost = cu.CUmemorytype.CU_MEMORYTYPE_HOST, dst
            c.WidthInBytes, c.Height, c.Depth = nbytes, 1, 1
            c.srcPitch = c.dstPitch = nbytes
            c.srcHeight = c.dstHeight = 1
            copy = check(cu.cuGraphAddMemcpyNode(graph, [nodes[index][0]], 1, c, self.context), "cuGraphAddMemcpyNode")
            check(cu.cuGraphAddEventRecordNode(graph, [copy], 1, event), "cuGraphAddEventRecordNode")
        return graph, check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate"), nodes

    def _add_dependencies(self, graph, src, dst, data):
        """cuGraphAddDependencies with edge data, as cuda-bindings 12.3+ (``_v2``) and 13 spell it."""
        cu = self.cu
        add = getattr(cu, "cuGraphAddDependencies_v2", None) or cu.cuGraphAddDependencies
        return add(graph, [src], [dst], data, 1)

    def _programmatic_edge(self, graph, src, dst) -> bool:
        """Add src -> dst as a programmatic edge; False (and no more tries) where the driver or bindings lack it."""
        cu = self.cu
        try:
            e = cu.CUgraphEdgeData()
            e.type = cu.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
            e.from_port = cu.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
            status = self._add_dependencies(graph, src, dst, [e])
        except (AttributeError, TypeError):  # bindings before 12.3: no edge data
            status = None
        if status is not None and int(status[0] if isinstance(status, tuple) else status) == 0:
            return True
        self.programmatic_edges = False
        return False

    def _edge(self, graph, src, dst) -> None:
        try:
            status = self._add_dependencies(graph, src, dst, None)
        except TypeError:  # bindings before 12.3: (graph, from, to, count)
            status = self.cu.cuGraphAddDependencies(graph, [src], [dst], 1)
        check(status, "cuGraphAddDependencies")

    def set_kernel_node(self, graph_exec, node, params) -> None:
        """Re-read a node's parameter values (from the address in ``params``) for the graph's later launches."""
        check(self.cu.cuGraphExecKernelNodeSetParams(graph_exec, node, params), "cuGraphExecKernelNodeSetParams")

    def graph_launch(self, graph_exec, stream: int) -> None:
        check(self.cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch")

    def destroy_graph(self, graph, graph_exec) -> None:
        check(self.cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
        check(self.cu.cuGraphDestroy(graph), "cuGraphDestroy")


class ParamBlock:
    """The ``void**`` array cuLaunchKernel takes, built once per launch and shape: one ctypes value per
    parameter (64-bit pointers, 32- or 64-bit symbols) plus the two scratch pointers Triton kernels end with:
    ``scratch`` (global scratch, for a kernel that needs it) and a null profile scratch."""

    def __init__(self, values: list, kinds: list, scratch: int = 0):
        self.values = [ctypes.c_uint64(v) if k == "ptr" else (ctypes.c_int32(v) if k == "i32" else ctypes.c_int64(v))
                       for v, k in zip(values, kinds)]
        self.values += [ctypes.c_uint64(scratch), ctypes.c_uint64(0)]
        self.array = (ctypes.c_void_p * len(self.values))(*[ctypes.addressof(v) for v in self.values])

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)
