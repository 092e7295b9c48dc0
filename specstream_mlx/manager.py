"""One resident base model, many adapters: each request decodes with the adapter it names.

Adapters are read and checked against the base once, kept in memory (least recently used ones
dropped beyond `max_resident`, re-read on their next use), and made active per request:
shared-mode LoRA is fused into the weights, computed from the untouched base when the adapter
is first made active (streams.lora.fuse_lora; unfused on a quantized base) and kept with the
resident adapter, so that a swap back puts those weights in place instead of computing them
again (keep_fused=False: computed afresh at every swap, less memory). The request gets a
session: a LoadedModel of its own that carries the adapter's streams and name and shares the
model, the tokenizer and the caches of compiled passes and chosen trees with the base, whose
own `streams` and `adapter` stay None. One lock serialises requests on the model, so threads
(a server's requests) can share a manager safely: a request holds the model for the whole of its
generation, and a session is valid only inside its `use` block (the weights are the next
adapter's after).

    manager = AdapterManager(ss.load())          # the shipped adapters registered by name
    with manager.use("sql") as session:
        ss.generate(session, prompt, decoder="ss")
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from .errors import SpecstreamError
from .models.loader import LoadedModel
from .streams.adapter_io import Adapter, attach, origin, read_adapter, shipped_adapters
from .streams.lora import Fused


@dataclass
class SwapTimes:
    """Seconds spent putting adapters on the model: reads from disk and swaps of resident ones."""

    loads: list[float]
    swaps: list[float]


class AdapterManager:
    def __init__(
        self,
        loaded: LoadedModel,
        adapters: dict[str, str] | None = None,
        max_resident: int = 8,
        keep_fused: bool = True,
    ):
        """`adapters`: name -> folder or shipped name, checked now (default: the shipped
        adapters made for `loaded`'s base: the default model's four, Qwen's chat).
        `keep_fused`: keep each resident adapter's fused weights for its next swap (fast swaps;
        memory: the weights of every layer its LoRA touches, see `resident`)."""
        if max_resident < 1:
            raise SpecstreamError(f"max_resident must be >= 1, got {max_resident}")
        self.loaded = loaded
        self.max_resident = max_resident
        self.keep_fused = keep_fused
        self.times = SwapTimes([], [])
        self._sources: dict[str, str] = {}
        self._resident: OrderedDict[str, Adapter] = OrderedDict()
        self._fused: dict[str, Fused] = {}  # resident adapters' fused weights (keep_fused)
        self._active: str | None = None
        self._lock = threading.RLock()
        # The model as loaded: no adapter on it (whatever `loaded` carried is registered).
        if loaded.adapter is not None:
            self.register(loaded.adapter, loaded.adapter)
        attach(None, loaded)
        loaded.streams, loaded.adapter = None, None
        self._session = session_of(loaded, None)
        if adapters is None:
            adapters = {n: n for n in shipped_adapters(loaded)}
        for name, source in adapters.items():
            self.register(name, source)

    def register(self, name: str, source: str | None = None, preload: bool = True) -> None:
        """Make adapter `source` (a folder or shipped name; default: `name`) usable as `name`.
        It is read and checked against the base now (a misfit raises SpecstreamError), or with
        preload=False only when first used."""
        if not name or not name.strip():
            raise SpecstreamError("an adapter needs a name")
        with self._lock:
            adapter = read_adapter(source or name, self.loaded) if preload else None
            if name in self._sources:  # replaced: the old one leaves memory and the model
                self._resident.pop(name, None)
                self._fused.pop(name, None)
                if self._active == name:
                    self.activate(None)
            self._sources[name] = source or name
            if adapter is not None:
                self._keep(name, adapter)

    def names(self) -> list[str]:
        """Registered adapter names, in registration order."""
        return list(self._sources)

    def source(self, name: str) -> str:
        """Where adapter `name` comes from: "shipped" (inside the package) or its folder."""
        return origin(self._sources[name], self.loaded)

    def changes_model(self, name: str) -> bool:
        """Whether adapter `name` puts LoRA layers on the model (shared mode, or a LoRA
        folder): its plain decoding is then the adapter's model, not the base."""
        with self._lock:
            adapter = self._resident.get(name)
            if adapter is None:
                adapter = read_adapter(self._sources[name], self.loaded)
                self._keep(name, adapter)
            return bool(adapter.lora)

    def resident(self) -> dict[str, int]:
        """Adapters in memory now, least recently used first: name -> bytes (their tensors and
        the fused weights kept for their swaps)."""
        with self._lock:
            return {
                name: a.nbytes + (self._fused[name].nbytes if name in self._fused else 0)
                for name, a in self._resident.items()
            }

    @contextmanager
    def use(self, name: str | None) -> Iterator[LoadedModel]:
        """Hold the model with adapter `name` active (None: the base alone) until the block
        ends, as a session to decode with; other threads wait their turn."""
        if name is not None and name not in self._sources:
            known = ", ".join(self._sources) or "none"
            raise SpecstreamError(f"unknown adapter {name!r}; registered: {known}")
        with self._lock:
            self.activate(name)
            yield self._session

    def activate(self, name: str | None) -> None:
        """Put adapter `name` on the model (None: take any off). Callers outside `use` must
        hold no expectations once another thread runs: `use` is the safe form."""
        with self._lock:
            if name == self._active:
                return
            start = time.perf_counter()
            adapter = None
            if name is not None:
                adapter = self._resident.get(name)
                if adapter is None:
                    adapter = read_adapter(self._sources[name], self.loaded)
                    self._keep(name, adapter)
                    spent = self.times.loads
                else:
                    self._resident.move_to_end(name)
                    spent = self.times.swaps
            fused = attach(adapter, self.loaded, self._fused.get(name))
            if self.keep_fused and fused is not None:
                self._fused[name] = fused
            self._session = session_of(self.loaded, adapter)
            if adapter is not None:
                spent.append(time.perf_counter() - start)
            self._active = name

    def _keep(self, name: str, adapter: Adapter) -> None:
        self._resident[name] = adapter
        self._resident.move_to_end(name)
        # Least recently used first; the adapter on the model and the one just read stay.
        spare = [n for n in self._resident if n not in (self._active, name)]
        for evicted in spare[: max(len(self._resident) - self.max_resident, 0)]:
            del self._resident[evicted]
            self._fused.pop(evicted, None)


def session_of(loaded: LoadedModel, adapter: Adapter | None) -> LoadedModel:
    """`loaded` with `adapter` active, as a LoadedModel of its own: the same model (its LoRA
    already attached), tokenizer and caches (shared objects), its own streams and adapter name."""
    if adapter is None:
        return replace(loaded, streams=None, adapter=None)
    return replace(loaded, streams=adapter.streams, adapter=adapter.source)
