"""A "cpu" platform for verl 0.9.x, registered and selected before any verl module asks for one.

What stands between verl and a CPU, and how this module gets past each (verl's extension points, no edits):
  - no GPUs for the resource pool: the launcher declares logical ones (ray_init.num_gpus=1) and this platform's
    Ray resource is "GPU";
  - NCCL and torch.cuda calls: the platform's backend is gloo and its device module answers with CPU no-ops;
  - verl builds the backend string "cpu:gloo,cpu:gloo", which torch rejects: init_process_group gets plain "gloo";
  - the FSDP engine is registered for cuda/npu only: VERL_ENGINE_DEVICE=cuda picks it;
  - FSDP2's reference model pins memory, which needs an accelerator: pin_memory is a no-op without one.
"""
import contextlib
import os

import torch
import torch.distributed as dist
from verl.plugin.platform import PlatformBase, PlatformRegistry, set_platform
from verl.plugin.platform import platform_manager


class CPUDeviceModule:
    """What verl calls on get_torch_device() (torch.cuda on a GPU), answered for a CPU."""

    def __getattr__(self, name):  # synchronize, Stream, current_stream, device_count, ...: torch.cpu's
        return getattr(torch.cpu, name)

    def is_available(self):
        return True

    def current_device(self):
        return "cpu"

    def set_device(self, *_, **__):
        pass

    empty_cache = ipc_collect = synchronize = reset_peak_memory_stats = set_per_process_memory_fraction = set_device

    def memory_allocated(self, *_):
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    def mem_get_info(self, *_):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    def get_rng_state(self, *_):
        return torch.get_rng_state()

    def set_rng_state(self, state, *_):
        torch.set_rng_state(state)

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def get_device_name(self, *_):
        return "cpu"


@PlatformRegistry.register(platform="cpu")
class CPUPlatform(PlatformBase):
    device_name = vendor_name = "cpu"
    device_module = CPUDeviceModule()

    def is_available(self):
        return True

    def is_platform_available(self, use_smi_check=False):
        return True

    def current_device(self):
        return "cpu"  # verl writes .to(get_device_id())

    def device_count(self):
        return 1

    def set_device(self, *_, **__):
        pass

    synchronize = set_allocator_settings = set_device

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def empty_cache(self):
        pass

    profiler_start = profiler_stop = empty_cache

    def get_device_capability(self, device_index=0):
        return None, None

    def communication_backend_name(self):
        return "gloo"

    def visible_devices_envvar(self):
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg):
        yield

    def ray_resource_name(self):
        return "GPU"  # the logical GPUs of ray_init.num_gpus

    def ray_resource_options(self, num_gpus):
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self):
        return []

    def is_ipc_supported(self):
        return False

    def cudart(self):
        return None


if platform_manager._current_platform is None or platform_manager._current_platform.device_name != "cpu":
    set_platform(CPUPlatform())
os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")  # EngineRegistry: verl's FSDP engine is registered for cuda/npu

_init_process_group = dist.init_process_group


def init_process_group(*args, backend=None, **kwargs):
    """verl asks for f"cpu:gloo,{device}:{backend}" = "cpu:gloo,cpu:gloo" here; torch wants plain "gloo"."""
    if isinstance(backend, str) and backend.replace(" ", "") == "cpu:gloo,cpu:gloo":
        backend = "gloo"
    return _init_process_group(*args, backend=backend, **kwargs)


_pin_memory = torch.Tensor.pin_memory


def pin_memory(self, *args, **kwargs):
    """Pinned memory needs an accelerator; without one a tensor stays as it is."""
    return self if not torch.cuda.is_available() else _pin_memory(self, *args, **kwargs)


if not getattr(dist.init_process_group, "_cpu_platform", False):
    init_process_group._cpu_platform = True
    dist.init_process_group = init_process_group
    torch.Tensor.pin_memory = pin_memory
