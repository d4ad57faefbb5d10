"""The models a server serves, by name and version, and how new versions come in while it runs.

Sources are package files (served under the file stem, ``m.tcpkg`` → ``m``, version "1"; a changed file becomes
the next version) and repositories in Triton's layout, ``REPO/<model>/<version>/model.tcpkg`` with integer
versions. A poller looks at the sources every ``poll_seconds``: a new version is loaded beside the ones serving
(its own Batcher, its own runner thread), and only once it loaded is it published, by replacing the name's
version table in one assignment, so a request sees the old table or the new one, never half of either. Requests
already handed to an old version finish there: versions that stay on disk stay loaded (and reachable at
``/versions/{v}``); one removed from disk is unpublished first and closed after (its queue drained). A new version
that fails to load is refused with a log line and remembered by its file's size and time, so it is not retried
every poll; the old one keeps serving.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from tcexport.formats.errors import TcError
from tcexport.loader import Batcher, load

log = logging.getLogger("tcexport.serving")


class UnknownModelError(TcError):
    """A request names a model (or a version of it) this server does not serve."""

    exit_code = 4


@dataclass(frozen=True)
class LoadOptions:
    """How every package is loaded and batched (passed as a value from the command line)."""

    device: str = "cpu"
    num_threads: int | None = None
    max_batch: int | None = None
    max_delay_ms: float = 0.0
    trusted_keys: tuple = ()


@dataclass
class Version:
    name: str
    version: str
    path: Path
    stamp: tuple  # (size, mtime_ns) of the file it was loaded from
    model: object
    batcher: Batcher

    def close(self) -> None:
        self.batcher.close()


class Repository:
    def __init__(self, sources: list[str | Path], options: LoadOptions, on_batch=None, on_versions=None,
                 load_model=None):
        self.sources = [Path(s) for s in sources]
        self.options = options
        self.on_batch = on_batch          # model name -> Batcher.on_batch callback (metrics)
        self.on_versions = on_versions    # (name, count) after a change (metrics)
        self.load_model = load_model      # (path, LoadOptions) -> a model; default: the loader's load()
        self._models: dict[str, dict[str, Version]] = {}
        self._refused: dict[Path, tuple] = {}
        self._file_versions: dict[Path, tuple] = {}  # package file -> (its version number, the stamp it had)
        self._lock = threading.Lock()     # one scan at a time; readers never take it
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        for s in self.sources:
            if not s.exists():
                raise TcError(f"{s}: no such package file or model repository; pass a .tcpkg file or a folder "
                              "laid out as REPO/<model>/<version>/model.tcpkg")

    # -- reading (request handlers) --------------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(self._models)

    def versions(self, name: str) -> dict[str, Version]:
        table = self._models.get(name)
        if not table:
            raise UnknownModelError(f"model {name!r} is not served here; served: {', '.join(self.names()) or 'none'}")
        return table

    def get(self, name: str, version: str | None = None) -> Version:
        table = self.versions(name)
        if version is None:
            return table[max(table, key=int)]
        if version not in table:
            raise UnknownModelError(f"model {name!r} has no version {version!r}; served versions: "
                                    f"{', '.join(sorted(table, key=int))}")
        return table[version]

    # -- loading ---------------------------------------------------------------------------------------------
    def scan(self) -> None:
        """Load what is new on disk, publish it, and retire what is gone; never raises for one bad package."""
        with self._lock:
            found: dict[str, dict[str, Path]] = {}
            owner: dict[str, Path] = {}
            for source in self.sources:
                for name, version, path in self._packages(source):
                    if owner.setdefault(name, source) != source:
                        log.error("model %s is in both %s and %s; serving the first (rename one)", name,
                                  owner[name], source)
                        continue
                    found.setdefault(name, {})[version] = path
            for name, paths in found.items():
                self._update(name, paths)
            for name in [n for n in self._models if n not in found]:
                self._publish(name, {})

    def _packages(self, source: Path):
        if source.is_file():
            stamp = _stamp(source)
            version, seen = self._file_versions.get(source, (1, stamp))
            if seen != stamp:  # the file changed since it was last looked at: its next version
                version += 1
            self._file_versions[source] = (version, stamp)
            yield source.stem, str(version), source
            return
        if not source.is_dir():
            return
        for model_dir in sorted(p for p in source.iterdir() if p.is_dir()):
            for version_dir in sorted(p for p in model_dir.iterdir() if p.is_dir() and re.fullmatch(r"\d+", p.name)):
                pkg = version_dir / "model.tcpkg"
                if pkg.is_file():
                    yield model_dir.name, str(int(version_dir.name)), pkg

    def _update(self, name: str, paths: dict[str, Path]) -> None:
        current = self._models.get(name, {})
        table = {v: e for v, e in current.items() if v in paths and e.path == paths[v] and e.stamp == _stamp(e.path)}
        for version, path in sorted(paths.items(), key=lambda kv: int(kv[0])):
            if version in table:
                continue
            loaded = self._load(name, version, path)
            if loaded is not None:
                table[version] = loaded
            elif version in current and current[version].path == path:
                table[version] = current[version]  # a bad replacement: the old bytes keep serving
        if not table and current:
            return  # nothing new could be loaded and the old files changed: what is loaded keeps serving
        if table != current:
            self._publish(name, table)

    def _load(self, name: str, version: str, path: Path) -> Version | None:
        stamp = _stamp(path)
        if self._refused.get(path) == stamp:
            return None
        o = self.options
        try:
            if self.load_model is not None:  # another runtime behind the same server (the load test's ORT)
                model = self.load_model(path, o)
            else:
                model = load(path, device=o.device, num_threads=o.num_threads,
                             trusted_keys=list(o.trusted_keys) or None)
            batcher = Batcher(model, max_batch=o.max_batch, max_delay_ms=o.max_delay_ms,
                              on_batch=self.on_batch(name) if self.on_batch else None)
        except Exception as e:  # noqa: BLE001 - a bad package is refused; the server and the old version stay
            self._refused[path] = stamp
            log.error("refused %s version %s (%s): %s: %s", name, version, path, type(e).__name__, e)
            return None
        self._refused.pop(path, None)
        log.info("loaded %s version %s from %s", name, version, path)
        return Version(name, version, path, stamp, model, batcher)

    def _publish(self, name: str, table: dict[str, Version]) -> None:
        old = self._models.get(name, {})
        if table:
            self._models[name] = table
        else:
            self._models.pop(name, None)
        if self.on_versions is not None:
            self.on_versions(name, len(table))
        for version, entry in old.items():
            if table.get(version) is not entry:
                log.info("retired %s version %s", name, version)
                entry.close()  # unpublished above: only requests already queued remain, and they finish

    # -- polling ---------------------------------------------------------------------------------------------
    def start(self, poll_seconds: float) -> None:
        self.scan()
        if poll_seconds > 0:
            self._poller = threading.Thread(target=self._poll, args=(poll_seconds,), name="tcexport-repository",
                                            daemon=True)
            self._poller.start()

    def _poll(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            try:
                self.scan()
            except Exception as e:  # noqa: BLE001 - a scan failure (a folder vanished mid-walk) waits for the next
                log.error("model repository scan failed: %s: %s", type(e).__name__, e)

    def close(self) -> None:
        """Stop polling and drain every version's queue."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join()
        with self._lock:
            for name in list(self._models):
                for entry in self._models.pop(name).values():
                    entry.close()


def _stamp(path: Path) -> tuple:
    try:
        st = path.stat()
    except OSError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)
