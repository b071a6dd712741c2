"""The devices llama.cpp's build can compute on, from ggml's backend registry (through ctypes on the
library llama_cpp loaded: the bindings do not wrap it), and the backend a session's numbers come
from. A GPU backend computes other bits than the CPU's, and another device other bits again, so the
backend is a gate of every stored state (`Engine.backend`)."""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from typing import Any

import llama_cpp as llama

KINDS = ("cpu", "gpu", "igpu", "accel", "meta")  # ggml_backend_dev_type, in its order
CPU_BACKEND = "cpu"


@dataclass(frozen=True)
class Device:
    name: str  # ggml's: "CPU", "Vulkan0", "CUDA0", "Metal"
    description: str  # the driver's: "llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA H100 80GB HBM3"
    kind: str  # one of KINDS

    @property
    def offloads(self) -> bool:
        """Layers can be offloaded to it (llama.cpp places them on GPU and iGPU devices)."""
        return self.kind in ("gpu", "igpu")

    def __str__(self) -> str:
        return f"{self.name} ({self.description})"


def _function(name: str, restype: object, *argtypes: object) -> Any:
    f = getattr(llama.llama_cpp._lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


def devices() -> list[Device]:
    """Every device ggml registered (after `llama_backend_init`)."""
    count = _function("ggml_backend_dev_count", ctypes.c_size_t)
    get = _function("ggml_backend_dev_get", ctypes.c_void_p, ctypes.c_size_t)
    name = _function("ggml_backend_dev_name", ctypes.c_char_p, ctypes.c_void_p)
    describe = _function("ggml_backend_dev_description", ctypes.c_char_p, ctypes.c_void_p)
    kind = _function("ggml_backend_dev_type", ctypes.c_int, ctypes.c_void_p)
    found = []
    for i in range(int(count())):
        d = get(i)
        k = int(kind(d))
        found.append(
            Device(
                (name(d) or b"").decode(errors="replace"),
                (describe(d) or b"").decode(errors="replace").strip(),
                KINDS[k] if 0 <= k < len(KINDS) else f"type {k}",
            )
        )
    return found


def backends() -> list[str]:
    """The backends the build registered ("CPU", "Vulkan", "CUDA", "Metal"), devices or not."""
    count = _function("ggml_backend_reg_count", ctypes.c_size_t)
    get = _function("ggml_backend_reg_get", ctypes.c_void_p, ctypes.c_size_t)
    name = _function("ggml_backend_reg_name", ctypes.c_char_p, ctypes.c_void_p)
    return [(name(get(i)) or b"").decode(errors="replace") for i in range(int(count()))]


def offload_devices() -> list[Device]:
    return [d for d in devices() if d.offloads]


def gpu_backend() -> str | None:
    """The GPU backend the build offloads to, by ggml's device names ("vulkan", "cuda", "metal"),
    or None where it has no GPU device: what models.lock's `backends_checked` names."""
    found = offload_devices()
    return re.sub(r"\d+$", "", found[0].name).lower() if found else None


OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


def backend_name(offloaded: tuple[int, int], used: list[Device]) -> str:
    """What a session's numbers are computed on: "cpu", or the devices and the share of layers,
    e.g. "Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits)): 31/31 layers". A partial offload computes
    other bits than a whole one, so the share is part of it."""
    n, of = offloaded
    if n == 0 or not used:
        return CPU_BACKEND
    return f"{', '.join(map(str, used))}: {n}/{of} layers"
