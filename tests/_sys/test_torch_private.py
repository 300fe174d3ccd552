"""The private torch APIs imgpipe wraps still exist and still do what the wrapper relies on, and no other module names one.

A torch upgrade that renames or drops one fails here, by name, instead of leaving workers behind.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from torch.utils.data import DataLoader

from imgpipe._sys.torch_private import (
    PRIVATE_NAMES,
    free_dead_shared_storages,
    maybe_mark_dynamic,
    shutdown_persistent_workers,
    storage_use_count,
    torchvision_has_image_ops,
)

PACKAGE = Path(__file__).resolve().parents[2] / "imgpipe"
WRAPPERS = PACKAGE / "_sys" / "torch_private.py"
TORCH_ROOTS = ("torch", "torchvision")
INTERNAL = {"shared_cache"}  # private although its name has no leading underscore


def test_dataloader_keeps_its_persistent_iterator_and_it_can_shut_its_workers_down() -> None:
    loader = DataLoader(list(range(4)), batch_size=2, num_workers=1, persistent_workers=True)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    assert hasattr(loader, "_iterator"), "torch.utils.data.DataLoader no longer has _iterator"
    iterator = loader._iterator
    assert iterator is not None, "DataLoader._iterator no longer holds the persistent iterator"
    assert callable(getattr(iterator, "_shutdown_workers", None)), "the DataLoader iterator lost _shutdown_workers"
    assert getattr(iterator, "_index_queues", None) and getattr(iterator, "_worker_result_queue", None)
    workers = list(iterator._workers)
    assert workers and all(w.is_alive() for w in workers)
    shutdown_persistent_workers(loader)
    assert loader._iterator is None and not any(w.is_alive() for w in workers)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]  # a later epoch starts new workers
    shutdown_persistent_workers(loader)
    shutdown_persistent_workers(loader)  # nothing running: a no-op
    assert torch.utils.data.get_worker_info() is None


def test_storage_use_count_sees_every_tensor_view_and_array_on_a_storage() -> None:
    base = torch.zeros(4, 3).share_memory_()
    unused = storage_use_count(base)
    view = base[1:3]
    row = view[0]
    del view
    assert storage_use_count(base) == unused + 1  # the view of a view holds it
    array = row.numpy()
    del row
    assert storage_use_count(base) == unused + 1  # so does a numpy array on it
    del array
    assert storage_use_count(base) == unused
    copy = base.clone()
    assert storage_use_count(base) == unused and storage_use_count(copy) == unused  # a copy holds its own


def test_the_shared_storage_cache_drops_a_storage_once_it_is_gone() -> None:
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing import reductions

    assert hasattr(reductions, "shared_cache"), "torch.multiprocessing.reductions lost shared_cache"
    shared = torch.zeros(3).share_memory_()
    free_dead_shared_storages()  # what earlier tests left
    before = len(reductions.shared_cache)
    ForkingPickler.dumps(shared)  # sending it to another process caches its storage
    assert len(reductions.shared_cache) == before + 1
    free_dead_shared_storages()
    assert len(reductions.shared_cache) == before + 1  # still alive: kept
    del shared
    free_dead_shared_storages()
    assert len(reductions.shared_cache) == before


def test_maybe_mark_dynamic_marks_the_dimension_for_torch_compile() -> None:
    images = torch.zeros(2, 3, 8, 8)
    maybe_mark_dynamic(images, 2)
    maybe_mark_dynamic(images, 3)
    assert images._dynamo_weak_dynamic_indices == {2, 3}
    compiled = torch.compile(lambda x: x.mean(dim=(2, 3)), backend="eager")
    assert compiled(images).shape == (2, 3)


def test_torchvision_says_whether_its_image_extension_loaded() -> None:
    import io

    from PIL import Image
    from torchvision.io import decode_jpeg

    photo = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 100, 50)).save(photo, "JPEG")
    assert torchvision_has_image_ops() is True
    assert decode_jpeg(torch.frombuffer(bytearray(photo.getvalue()), dtype=torch.uint8)).shape == (3, 6, 8)


# ----------------------------------------------------------------------------- no private torch name elsewhere


def private(name: str) -> bool:
    return (name.startswith("_") and not name.startswith("__")) or name in INTERNAL


def wrapped_attributes(path: Path = WRAPPERS) -> set[str]:
    """The private attribute names the wrappers reach (``x._iterator``, ``getattr(x, "_thread")``): any of
    them on any object elsewhere is a private torch name used outside the wrappers."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and private(node.attr):
            names.add(node.attr)
        if isinstance(node, ast.Call) and _literal_attribute(node) and private(_literal_attribute(node)):
            names.add(_literal_attribute(node))
    return names


def _literal_attribute(call: ast.Call) -> str | None:
    """The attribute name of ``getattr(obj, "name", ...)``, ``hasattr`` or ``setattr``."""
    if isinstance(call.func, ast.Name) and call.func.id in ("getattr", "hasattr", "setattr") and len(call.args) >= 2:
        name = call.args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            return name.value
    return None


def _torch_module(name: str | None) -> bool:
    return name is not None and name.split(".")[0] in TORCH_ROOTS


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None when it does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def private_torch_names(source: str) -> list[tuple[int, str]]:
    """(line, what) for each private torch or torchvision name ``source`` uses."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node  # type: ignore[attr-defined]
    return sorted(set(_found_in(tree)))


def _found_in(tree: ast.AST) -> Iterator[tuple[int, str]]:
    bound: dict[str, str] = {}  # a name this module binds to a torch object -> its dotted path
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _torch_module(alias.name):
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
                    if any(private(part) for part in alias.name.split(".")):
                        yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and _torch_module(node.module):
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                if any(private(part) for part in [*node.module.split("."), alias.name]):
                    yield node.lineno, f"from {node.module} import {alias.name}"
    watched = wrapped_attributes()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            chain = _chain(node)
            if chain and chain[0] in bound and any(private(part) for part in chain[1:]):
                yield node.lineno, ".".join([bound[chain[0]], *chain[1:]])
            elif private(node.attr) and node.attr in watched and not (chain and chain[0] in ("self", "cls")):
                yield node.lineno, f"{ast.unparse(node)} (private in torch)"
        elif isinstance(node, ast.Call) and (name := _literal_attribute(node)) and private(name):
            chain = _chain(node.args[0])
            if name in watched or (chain and chain[0] in bound):
                yield node.lineno, f"{ast.unparse(node)} (private in torch)"
        elif isinstance(node, ast.ClassDef):
            yield from _private_overrides(node, bound)


def _private_overrides(node: ast.ClassDef, bound: dict[str, str]) -> Iterator[tuple[int, str]]:
    """A private method of a torch base class defined again in a subclass (an override of torch's internals)."""
    for base in node.bases:
        chain = _chain(base)
        if not chain or chain[0] not in bound:
            continue
        cls = _resolve(".".join([bound[chain[0]], *chain[1:]]))
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and private(item.name) and hasattr(cls, item.name):
                yield item.lineno, f"{node.name}.{item.name} overrides {cls.__module__}.{cls.__qualname__}.{item.name}"


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise ImportError(dotted)


def private_names_outside_the_wrappers(package: Path) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "torch_private.py" and path.parent.name == "_sys":
            continue
        for line, what in private_torch_names(path.read_text()):
            found.append(f"{path.relative_to(package.parent)}:{line}: {what}")
    return found


def test_no_module_but_torch_private_names_a_private_torch_api() -> None:
    found = private_names_outside_the_wrappers(PACKAGE)
    assert found == [], "call these through imgpipe/_sys/torch_private.py (and list them there):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ntorch._dynamo.maybe_mark_dynamic(x, 2)",
        "import torch.distributed as dist\ndist.distributed_c10d._get_default_group()",
        "from torch.utils.data import _utils",
        "from torch.utils.data._utils.collate import default_collate",
        "import torch._C",
        "from torch.multiprocessing import reductions\nreductions.shared_cache.clear()",
        "from torch.multiprocessing import reductions\ngetattr(reductions, 'shared_cache', None)",
        "from torchvision.io.image import _has_image_ops",
        "loader._iterator = None",
        "getattr(iterator, '_shutdown_workers')()",
        "from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent\n"
        "class Agent(LocalElasticAgent):\n    def _monitor_workers(self, group):\n        return None",
    ],
)
def test_each_kind_of_private_name_is_found(source: str) -> None:
    assert private_torch_names(source), source


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ntorch.distributed.all_reduce(x)\nx.__class__",
        "import os\nos._exit(0)",
        "self._iterator = None",
        "from torch.distributed.launcher.api import LaunchConfig, elastic_launch",
        "from torch.utils.data import DataLoader\nclass Mine(DataLoader):\n    def _mine(self):\n        return 1",
    ],
)
def test_public_names_and_imgpipes_own_private_names_pass(source: str) -> None:
    assert private_torch_names(source) == [], source


def test_the_wrappers_list_every_private_name_they_reach() -> None:
    listed = {name.rsplit(".", 1)[1] for name in PRIVATE_NAMES}
    reached = wrapped_attributes() | {alias for alias in _imported_private_names(WRAPPERS)}
    assert reached - {"_C", "_dynamo"} <= listed | {"_C", "_dynamo"}, sorted(reached - listed)
    for name in PRIVATE_NAMES:
        owner, attribute = name.rsplit(".", 1)
        found = _resolve(owner)
        assigned = isinstance(found, type) and f"self.{attribute} =" in inspect.getsource(found)  # an instance's attribute
        assert hasattr(found, attribute) or assigned, f"{name} is gone from the installed torch"


def _imported_private_names(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and _torch_module(node.module):
            yield from (alias.name for alias in node.names if private(alias.name))
